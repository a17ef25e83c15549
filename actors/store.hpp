#pragma once

#include <caf/actor_clock.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "actors/offload.hpp"
#include "actors/store_actor.hpp"
#include "actors/workers.hpp"
#include "runtime/core/store_port.hpp"
#include "runtime/pipeline/materialize.hpp"

namespace stitch {

/// Where the store actor runs backend calls. The fast lane takes pointer,
/// manifest and listing calls; the bulk lane shard bytes and retention, so a
/// large publish or read never delays a pointer read.
struct store_lanes {
  /// Pointer, claim, compare-and-swap, manifest, listing, subscriptions.
  std::shared_ptr<executor> fast;
  /// Shard writes of uploads, exports, retention (background priority).
  std::shared_ptr<executor> bulk;
  /// Tensor range reads (replicas staging): never behind an upload's writes.
  std::shared_ptr<executor> reads;

  /// Two threads each: fast with room for 4096 waiting calls, bulk for 256,
  /// reads for 1024.
  static store_lanes make();
};

struct store_options {
  /// When set, `export_to` must carry it (it writes files on this machine).
  std::string admin_token;
  /// Bytes buffered by an export (`io.buffer_bytes`).
  uint64_t io_buffer_bytes = uint64_t{64} << 20;
  /// An upload silent this long is dropped with what it wrote (its client
  /// went away mid-publish).
  std::chrono::seconds upload_idle_timeout{600};
};

struct store_state {
  static inline const char* name = "store";

  /// A version being uploaded from another node.
  struct upload {
    std::shared_ptr<version_writer> writer;
    /// The upload's calls run in order on the bulk lane.
    std::shared_ptr<strand> queue;
    std::shared_ptr<uint64_t> bytes = std::make_shared<uint64_t>(0);
    caf::actor_clock::time_point last_seen;
  };

  std::shared_ptr<store_backend> backend;
  store_lanes lanes;
  store_options opts;
  job_table jobs;
  std::map<std::string, std::vector<pointer_listener_actor>> listeners;
  std::map<uint64_t, upload> uploads;
  /// Upload ids: unguessable, so that a client cannot write into another's.
  std::mt19937_64 upload_ids{std::random_device{}()};
  /// This actor's observer of the backend's pointer moves.
  uint64_t observer = 0;

  store_state() = default;
  store_state(const store_state&) = delete;
  store_state& operator=(const store_state&) = delete;
  ~store_state() {
    if (backend && observer)
      backend->unobserve_pointers(observer);
  }
};

/// Hosts `backend` on `lanes`; spawn it on the cooperative scheduler.
store_actor::behavior_type store_service(store_actor::stateful_pointer<store_state> self,
                                         std::shared_ptr<store_backend> backend, store_lanes lanes,
                                         store_options opts = {});

} // namespace stitch
