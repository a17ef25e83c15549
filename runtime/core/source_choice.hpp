#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace stitch {

/// A replica that holds a version's full weights and can serve them to peers.
struct source_candidate {
  std::string replica_id;
  std::string node;
  /// Receivers it was handed to since it began holding this version.
  uint64_t handed_out = 0;
};

/// The holders a receiver should fetch from, best first, at most `k`
/// (DESIGN §6: fan-out must not cost N x S/B at one holder): the least
/// handed-out first, so that concurrent receivers spread over every holder
/// there is; among equals one on the receiver's own node first (shared
/// memory), then by name for a stable order. The receiver itself is never
/// chosen. Answers indices into `candidates`.
std::vector<size_t> choose_sources(std::span<const source_candidate> candidates,
                                   const std::string& receiver_id, const std::string& receiver_node,
                                   size_t k);

} // namespace stitch
