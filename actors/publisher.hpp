#pragma once

#include <caf/actor_addr.hpp>
#include <caf/actor_clock.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "actors/offload.hpp"
#include "actors/publisher_actor.hpp"
#include "actors/store_actor.hpp"
#include "actors/workers.hpp"
#include "runtime/pipeline/publisher.hpp"
#include "runtime/pipeline/tensor_stream.hpp"
#include "transport/ucx_peer.hpp"

namespace stitch {

struct publisher_limits {
  /// Streamed publishes open at once.
  size_t max_sessions = 4;
  /// A session silent this long is dropped (its client went away without
  /// its node or connection going down, which abort it at once).
  std::chrono::seconds session_idle_timeout{600};
  /// Most bytes one streamed publish may declare.
  uint64_t max_session_bytes = uint64_t{4} << 40;
};

/// Retention after publishes (DESIGN §4): `store.retain_versions`.
struct publisher_retention {
  /// Newest versions kept per run after every publish; 0 = only `stitch gc`.
  size_t keep_last = 0;
  /// Asked which versions replicas serve or are moving to before anything
  /// is deleted (the coordinator). Without one nothing is pinned beyond the
  /// pointer, the boots, the newest and their chains.
  version_directory_actor directory;
  std::chrono::milliseconds directory_timeout{10'000};
};

/// The publisher as a holder (DESIGN §2, peer transfer): it lends each
/// run's remembered version (when it is kept in memory) and its last stored
/// delta's frames, and tells the coordinator's directory; a publish that
/// rewrites the remembered version withdraws it first.
struct publisher_lending {
  /// Null: the publisher lends nothing (no UCX, `transfer.peers = off`).
  std::shared_ptr<transport::ucx::holder_set> holders;
  /// Lends each run's last stored delta frames (deltas over peers); null:
  /// none.
  std::shared_ptr<transport::ucx::holder_set> frame_holders;
  holder_registry_actor registry;
  std::string node;
  /// The member capability its offers and releases carry.
  std::string member_token;
};

struct publisher_state {
  static inline const char* name = "publisher";

  /// A streamed publish: its bytes go to the publish running on a worker.
  struct session {
    publish_args args;
    std::shared_ptr<pipeline::fed_stream> stream;
    std::optional<result<pipeline::publish_report>> outcome;
    std::optional<caf::typed_response_promise<pipeline::publish_report>> waiting;
    caf::actor_clock::time_point last_seen;
    bool aborted = false;
    /// The actors on other nodes that opened or fed it (a `stitch publish
    /// --stream`), watched: one that goes down before `finish` (its process
    /// or its connection died) aborts the session at once, which frees its
    /// slot and its pool's queue instead of holding both for
    /// `session_idle_timeout`. The HTTP surface aborts its own on disconnect.
    std::vector<caf::actor_addr> feeders;
  };

  std::shared_ptr<store_backend> backend;
  std::shared_ptr<pipeline::publisher> impl;
  store_actor store;
  /// The threads publishes run on (a streamed one holds a thread while it
  /// waits for bytes).
  std::shared_ptr<executor> workers;
  /// One queue per pool: publishes to a pool run one at a time.
  std::map<std::string, std::shared_ptr<strand>> pools;
  job_table jobs;
  std::map<uint64_t, session> sessions;
  /// Session ids: unguessable, so that a client cannot feed another's.
  std::mt19937_64 session_ids{std::random_device{}()};
  publisher_limits limits;
  /// When set, every publish must carry it.
  std::string admin_token;
  publisher_retention retention;
  publisher_lending lending;
  /// Its HTTP surface's URL, "" when none.
  std::string http_url;
  /// Pools with a collection running, and those that want another after it
  /// (publishes faster than collections coalesce into one more).
  std::set<std::string> collecting;
  std::set<std::string> collect_again;

  publisher_state() = default;
  publisher_state(const publisher_state&) = delete;
  publisher_state& operator=(const publisher_state&) = delete;
  /// Runs as the actor ends: publishes waiting for bytes stop. (CAF destroys
  /// a stateful actor's state before its attached functors run, so those
  /// must never touch the state.)
  ~publisher_state();
};

/// Publishes through `backend` (the store's own, or a `remote_store`) on
/// `workers`, then tells `store` the pointer moved.
publisher_actor::behavior_type
publisher_service(publisher_actor::stateful_pointer<publisher_state> self,
                  std::shared_ptr<store_backend> backend, store_actor store,
                  pipeline::publisher_options options, std::shared_ptr<executor> workers,
                  std::string admin_token = {}, publisher_limits limits = {},
                  publisher_retention retention = {}, publisher_lending lending = {});

} // namespace stitch
