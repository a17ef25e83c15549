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
  /// For a partial offer: which 8-byte word of the progress region says how
  /// many of its bytes (from the start) the holder has verified so far.
  uint32_t progress_slot = 0;
};

/// A progress word's value for a tensor the holder will not get from its
/// peers after all (the store builds it): read it elsewhere.
inline constexpr uint64_t abandoned_progress = ~uint64_t{0};

/// What a holder answers a reader: its worker, the version's tensors, and
/// the lease that keeps them registered until released or expired.
struct offer {
  /// Who serves (a replica's id), for reports and `/status`.
  std::string source;
  version_ref version;
  std::vector<std::byte> worker_address;
  uint64_t lease = 0;
  std::vector<offered_tensor> tensors;
  /// The holder is still fetching this version (a relay): a tensor's bytes
  /// are readable up to what its progress word says, a little-endian
  /// uint64 in the progress region (`abandoned_progress`: never).
  bool partial = false;
  uint64_t progress_address = 0;
  std::vector<std::byte> progress_rkey;
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

  /// A version this holder is fetching, offered to peers as it arrives.
  class relay {
  public:
    virtual ~relay() = default;
    /// The first `bytes` of fetch target `t` are verified.
    virtual void verified(size_t t, uint64_t bytes) = 0;
    /// Target `t` will not come from peers: its readers go elsewhere.
    virtual void abandon(size_t t) = 0;
  };
  /// Offers the fetch `targets` of `ref` (their destinations, kept alive by
  /// each target's `keep`) while they arrive: `leaves[t]` are target t's
  /// chunk digests as its sources offered them (checked against the
  /// manifest), empty for a target not fetched from peers, which is not
  /// offered. Replaces what this holder was fetching before; the version it
  /// serves stays offered too.
  result<std::shared_ptr<relay>> stage(const version_ref& ref,
                                       std::span<const fetch_target> targets,
                                       std::span<const std::vector<uint64_t>> leaves);

  /// A lease on `version` when this holder serves it or is fetching it;
  /// `not_found` otherwise.
  result<offer> lease(const version_ref& version);
  void release(uint64_t lease);

  std::optional<version_ref> exposed() const;
  size_t leases() const;
  /// Leases taken after `since` (older ones are likely of readers that
  /// died without releasing).
  size_t leases_taken_after(std::chrono::steady_clock::time_point since) const;
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
  /// The version being fetched, offered as it arrives (`stage`).
  std::shared_ptr<exposure> staging_;
  struct taken {
    std::shared_ptr<exposure> what;
    std::chrono::steady_clock::time_point until;
  };
  std::map<uint64_t, taken> leases_;
  size_t registered_ = 0;
};

/// Holders of several versions at once, one per key: a publisher lends the
/// remembered version of each of its runs. Lease ids are unique across the
/// process, so `release` needs no key. Thread-safe.
class holder_set {
public:
  /// `drain`: how long `withdraw` waits for readers to release their leases.
  holder_set(std::shared_ptr<worker> w, std::chrono::milliseconds lease_ttl,
             std::chrono::milliseconds drain);

  /// Offers `weights` under `key`, as `source` (reports name it).
  status expose(const std::string& key, const std::string& source, host_weights weights);
  /// Stops offering `key`'s version, then waits (up to `drain`) until no
  /// reader holds a lease on it taken within the last `drain` (an older one
  /// is of a reader that died, or will fail its digests and read elsewhere);
  /// answers false when some still did.
  bool withdraw(const std::string& key);
  result<offer> lease(const version_ref& version);
  void release(uint64_t lease);

private:
  std::shared_ptr<worker> worker_;
  std::chrono::milliseconds ttl_;
  std::chrono::milliseconds drain_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<holder>> holders_;
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
  /// A partial source (one still fetching) whose progress on the tensor a
  /// reader waits for does not move for this long is given up.
  std::chrono::milliseconds stall{10'000};
  /// How often a reader waiting on a partial source reads its progress.
  std::chrono::microseconds poll{200};
};

/// The options a delta's frames are fetched with: they are a few percent of
/// the model, so a relay chain's time is its hops, not its bytes, and small
/// stripes with a quick poll keep each hop short (`fanout_bench` models it).
inline fetch_options frames_fetch_options() {
  fetch_options o;
  o.stripe = size_t{1} << 20;
  o.poll = std::chrono::microseconds{50};
  return o;
}

/// Fetches `targets` of version `ref` from `sources` (all offering exactly
/// `ref`), in the order of `stripe_schedule`: each source gets threads that
/// take the next stripe it can serve, so faster holders serve more, and a
/// backup source (`backup[s]`) serves only what no live primary can. A
/// partial source is read only as far as its progress word says. A source
/// whose tensor's digests do not combine to the manifest's checksum is not
/// asked for it; a chunk that fails its digest is fetched again from
/// another source; a source whose read fails or stalls is dropped and its
/// stripes go to the others. With `relay`, the receiver offers what it has
/// verified to peers while it fetches (`holder::stage`).
fetch_report fetch(worker& w, const version_ref& ref, std::span<const offer> sources,
                   std::span<const fetch_target> targets, const fetch_options& opts = {},
                   const std::function<void(const transfer_progress&)>& progress = {},
                   std::span<const bool> backup = {}, holder* relay = nullptr);

} // namespace stitch::transport::ucx
