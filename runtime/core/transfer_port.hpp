#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/version_ref.hpp"

namespace stitch {

/// A tensor's bytes a holder offers to peers.
struct exposed_tensor {
  std::string name;
  std::span<const std::byte> bytes;
  uint64_t checksum;
};

/// Where a fetched tensor goes.
struct fetch_target {
  std::string name;
  std::span<std::byte> destination;
  uint64_t expected_checksum;
};

struct transfer_progress {
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};

/// The transfer port (DESIGN §4): weight bytes move host to host, peer to
/// peer, not through shared storage. Implemented over UCX in `transport/`.
class transfer {
public:
  virtual ~transfer() = default;
  /// Offers a version's bytes to peers until `withdraw`.
  virtual status expose(const version_ref& ref, std::vector<exposed_tensor> tensors) = 0;
  virtual void withdraw(const version_ref& ref) = 0;
  /// Fetches tensors of `ref` into the targets, verifying each checksum.
  virtual status fetch(const version_ref& ref, std::span<const fetch_target> targets,
                       const std::function<void(const transfer_progress&)>& progress) = 0;
};

} // namespace stitch
