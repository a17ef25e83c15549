#pragma once

#include <caf/actor_system_config.hpp>

#include <cstddef>
#include <string>

namespace stitch {

/// Registers Stitch's message types and the renderer of its error category.
void register_stitch_types(caf::actor_system_config& cfg);

/// How many threads deserialize messages from other nodes (CAF's
/// `middleman.workers`) on a machine of `cores` CPUs. Below four cores CAF
/// would start one such worker, which parallelizes nothing there and adds a
/// thread hop to every remote message; with none, the network thread
/// deserializes each message as it reads it. Measured on two cores
/// (`bench/store_bench --pointer-only`, six alternating runs each): pointer
/// reads under a streamed publish p99 1.65-2.83 ms (median 2.15) against
/// 2.19-3.18 ms (median 2.76), the streamed publish no slower.
size_t middleman_workers(unsigned cores);

/// CAF's scheduler as Stitch uses it: an idle worker spins briefly, then
/// waits on its condition variable (woken by the next message) instead of
/// polling with 50 us sleeps for the next 25 ms (CAF's "moderate" phase).
/// Requests arrive every fraction of a millisecond and each crosses a few
/// actors: the polling cost a sleep's latency per hop and CPU for nothing
/// (`bench/proxy_bench`: a replica's added p50 0.45 -> 0.28 ms).
void tune_scheduler(caf::actor_system_config& cfg);

/// Weight bytes pass through buffers of a few MiB (request bodies, publish
/// chunks, store reads): glibc would map each afresh and the kernel zero its
/// pages on first touch. Keeps freed ones in the heap for the next instead.
/// Call first thing in `main`.
void keep_freed_buffers_in_heap();

/// The actor system config every Stitch process uses: our types, and the
/// middleman for remote actors.
/// Checks that the TLS files exist and hold PEM text, naming the first that
/// does not (CAF's OpenSSL module would abort on them).
std::string check_tls_files(const std::string& cert, const std::string& key, const std::string& ca);

class system_config : public caf::actor_system_config {
public:
  system_config();
  /// Every inter-node connection becomes mutual TLS (CAF's OpenSSL module):
  /// this process presents `cert`/`key` and accepts only peers whose
  /// certificate `ca` signed. Call before the actor system is made.
  void use_tls(const std::string& cert, const std::string& key, const std::string& ca);
};

} // namespace stitch
