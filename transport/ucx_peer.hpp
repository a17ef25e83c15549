#pragma once

// Peer-to-peer weight transfer over UCX (DESIGN §4 "Transfer"): a holder
// registers a version's full tensors and leases them to readers; a receiver
// fetches tensors from several holders at once, striped by chunk, each 1 MiB
// chunk verified as it lands, a failed chunk or holder finished from the
// others. No CAF: offers travel as typed messages in `actors/`.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/transfer_port.hpp"
#include "transport/ucx.hpp"

namespace stitch::transport::ucx {

/// One tensor a holder offers: where its bytes are registered, and the
/// digests of its 1 MiB chunks (`checksum::chunk_digest`), which combine to
/// the tensor's checksum — a receiver checks them against the manifest
/// before it trusts them, then verifies every chunk it reads.
struct offered_tensor {
  std::string name;
  uint64_t address = 0;
  uint64_t size = 0;
  std::vector<std::byte> rkey;
  std::vector<uint64_t> leaves;
};

/// What a holder answers a reader: its worker, the version's tensors, and
/// the lease that keeps them registered until released or expired.
struct offer {
  /// Who serves (a replica's id), for reports and `/status`.
  std::string source;
  version_ref version;
  std::vector<std::byte> worker_address;
  uint64_t lease = 0;
  std::vector<offered_tensor> tensors;
};

/// Offers one version's full weights to peers. Thread-safe. `expose` maps
/// memory (slow with pinning transports): call it off any actor thread.
class holder {
public:
  holder(std::shared_ptr<worker> w, std::string source, std::chrono::milliseconds lease_ttl);
  ~holder();

  /// Registers `weights` as what this holder offers and computes its chunk
  /// digests; a buffer the version before offered too keeps its
  /// registration and digests (host weights never change while exposed).
  /// The version it offered before stays registered for the leases taken
  /// on it.
  status expose(host_weights weights);
  /// Stops offering anything (leases taken stay valid until released).
  void withdraw();
  /// A lease on the exposed version when it is `version`; `not_found`
  /// otherwise.
  result<offer> lease(const version_ref& version);
  void release(uint64_t lease);

  std::optional<version_ref> exposed() const;
  size_t leases() const;
  /// Tensors registered (and digested) so far, reused ones not counted.
  size_t registered_total() const;

private:
  struct exposure;
  void sweep_locked(std::chrono::steady_clock::time_point now);

  std::shared_ptr<worker> worker_;
  std::string source_;
  std::chrono::milliseconds ttl_;
  mutable std::mutex mutex_;
  std::shared_ptr<exposure> current_;
  struct taken {
    std::shared_ptr<exposure> what;
    std::chrono::steady_clock::time_point until;
  };
  std::map<uint64_t, taken> leases_;
  uint64_t next_lease_ = 1;
  size_t registered_ = 0;
};

struct fetch_options {
  /// Bytes one holder is asked for at a time (a multiple of 1 MiB).
  size_t stripe = size_t{16} << 20;
  /// Each stripe's read (chunk, window in flight, its deadline).
  read_options read;
  /// The whole fetch stops taking new stripes past this.
  std::chrono::milliseconds deadline{120'000};
  /// Threads reading from each source (at least one).
  size_t readers_per_source = 2;
};

/// Fetches `targets` of version `ref` from `sources` (all offering exactly
/// `ref`): each source gets a thread that takes the next stripe it can
/// serve, so faster holders serve more. A source whose tensor's digests do
/// not combine to the manifest's checksum is not asked for it; a chunk that
/// fails its digest is fetched again from another source; a source whose
/// read fails is dropped and its stripes go to the others.
fetch_report fetch(worker& w, const version_ref& ref, std::span<const offer> sources,
                   std::span<const fetch_target> targets, const fetch_options& opts = {},
                   const std::function<void(const transfer_progress&)>& progress = {});

} // namespace stitch::transport::ucx
