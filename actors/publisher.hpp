#pragma once

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <optional>

#include "actors/publisher_actor.hpp"
#include "actors/store_actor.hpp"
#include "runtime/store/host_tensors.hpp"
#include "runtime/store/publisher.hpp"

namespace stitch {

struct publisher_state {
  static inline const char* name = "publisher";

  /// A streamed publish: tensors arrive one after the other in chunks.
  struct session {
    publish_args args;
    store::tensor_set weights;
    std::string current;
    uint64_t remaining = 0;
    uint64_t received = 0;
    std::chrono::steady_clock::time_point last_seen;
  };

  std::shared_ptr<store_backend> backend;
  std::unique_ptr<store::publisher> impl;
  store_actor store;
  std::map<uint64_t, session> sessions;
  uint64_t next_session = 1;
  /// Bytes one session may send (bounds the memory a client can pin).
  uint64_t max_session_bytes = uint64_t{64} << 30;
  size_t max_sessions = 4;
  /// A session silent this long is dropped when room is needed (its client
  /// went away mid-publish).
  std::chrono::seconds session_idle_timeout{600};
  /// When set, every publish must carry it.
  std::string admin_token;
};

/// Publishes through `backend` (the store's own, or a `remote_store`), then
/// tells `store` the pointer moved. Publishing blocks: spawn it detached.
publisher_actor::behavior_type
publisher_service(publisher_actor::stateful_pointer<publisher_state> self,
                  std::shared_ptr<store_backend> backend, store_actor store,
                  store::publisher_options options, std::string admin_token = {});

/// The wire form of a publish report.
publish_summary summarize(const store::publish_report& report);

} // namespace stitch
