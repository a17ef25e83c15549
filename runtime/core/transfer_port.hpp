#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/version_ref.hpp"

namespace stitch {

/// A tensor's full bytes a holder offers to peers.
struct exposed_tensor {
  std::string name;
  std::span<const std::byte> bytes;
};

/// The full weights of one version in host memory, as a holder exposes them:
/// `keep` keeps the bytes alive (a holder holds it while any reader has a
/// lease, so weights an engine replaced stay readable until then), and the
/// bytes never change while it does (a buffer two versions share holds the
/// same bytes in both).
struct host_weights {
  version_ref version;
  std::vector<exposed_tensor> tensors;
  std::shared_ptr<const void> keep;
};

/// Where a fetched tensor goes: the full bytes of tensor `name` of the
/// fetched version, verified against `expected_checksum` (the version's
/// manifest, DESIGN §1 `xxh3-64-tree-1MiB`).
struct fetch_target {
  std::string name;
  std::span<std::byte> destination;
  uint64_t expected_checksum = 0;
  /// Keeps `destination` alive: a receiver offers what it has fetched to
  /// other receivers while it fetches (a relay), and they may read it after
  /// the fetch returns.
  std::shared_ptr<const void> keep;
};

struct transfer_progress {
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};

/// What a fetch did. A target not `fetched` holds unspecified bytes: the
/// caller builds it from the store instead.
struct fetch_report {
  std::vector<bool> fetched;
  /// Verified bytes by the holder that served them.
  std::map<std::string, uint64_t> bytes_by_source;
  /// One line per thing that went wrong (a holder that vanished, a chunk
  /// whose digest failed, a deadline), for the log.
  std::vector<std::string> problems;
  /// Of frames (`transfer::fetch_frames`), not whole tensors.
  bool frames = false;

  bool complete() const {
    for (bool f : fetched)
      if (!f)
        return false;
    return true;
  }
};

/// The transfer port (DESIGN §4): weight bytes move host to host, peer to
/// peer, not through shared storage. A holder exposes a version's full
/// weights, or a delta's stored frames (`transport/ucx_peer.hpp`); a receiver fetches the tensors
/// it needs from the holders of exactly that version, each chunk verified, and builds whatever no
/// holder could give from the store. Implemented over UCX.
class transfer {
public:
  virtual ~transfer() = default;
  /// Fetches the full bytes of `targets` of version `ref` from its holders;
  /// never fails as a whole: what could not be fetched is reported.
  virtual fetch_report fetch(const version_ref& ref, std::span<const fetch_target> targets,
                             const std::function<void(const transfer_progress&)>& progress) = 0;
  /// Fetches the stored frames of delta `ref` (`manifest::frames`: a
  /// target's name is the touched tensor's, its destination the frame's
  /// size, its checksum the frame's) from the holders of those frames: the
  /// publisher that stored them, replicas that fetched them. The same
  /// guarantees as `fetch`.
  virtual fetch_report
  fetch_frames(const version_ref& ref, std::span<const fetch_target> targets,
               const std::function<void(const transfer_progress&)>& progress) = 0;
};

} // namespace stitch
