#pragma once

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <chrono>
#include <map>
#include <set>
#include <string>

#include "actors/gateway_actor.hpp"
#include "runtime/core/constraint.hpp"

namespace stitch {

struct gateway_options {
  /// Replicas tried for one request before the last answer is returned.
  size_t max_attempts = 3;
};

struct gateway_state {
  static inline const char* name = "gateway";

  struct member {
    replica_actor handle;
    std::string pool;
    replica_info info;
    bool known = false;
    uint64_t outstanding = 0;
  };

  /// One client request, possibly tried on several replicas.
  struct flight {
    uint64_t client_key = 0;
    caf::actor client;
    caf::typed_response_promise<replica_answer> promise;
    std::string pool;
    std::string session;
    replica_call call;
    std::set<caf::actor_addr> tried;
    caf::actor_addr current;
    uint64_t attempt_key = 0;
    bool streamed = false;
    /// The client went away: no retry.
    bool cancelled = false;
    std::chrono::steady_clock::time_point started;
  };

  gateway_options opts;
  std::map<caf::actor_addr, member> replicas;
  /// (pool, session) -> replica.
  std::map<std::pair<std::string, std::string>, caf::actor_addr> affinity;
  /// By attempt key.
  std::map<uint64_t, flight> flights;
  /// (client actor, client key) -> attempt key.
  std::map<std::pair<caf::actor_addr, uint64_t>, uint64_t> by_client;
  uint64_t next_key = 1;
  gateway_stats stats;
};

gateway_actor::behavior_type gateway_service(gateway_actor::stateful_pointer<gateway_state> self,
                                             gateway_options opts);

/// The replica a request goes to, or nothing. Pure: eligible replicas are
/// ready, in `pool`, satisfy `c` and were not tried yet; the session's replica
/// wins while eligible, then the least outstanding (ties: lowest address).
const caf::actor_addr* choose_replica(const gateway_state& st, const std::string& pool,
                                      const std::string& session, const constraint& c,
                                      const std::set<caf::actor_addr>& tried);

} // namespace stitch
