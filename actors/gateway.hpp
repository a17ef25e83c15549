#pragma once

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "actors/gateway_actor.hpp"
#include "runtime/core/router.hpp"

namespace stitch {

struct gateway_options {
  /// Replicas tried for one request before the last answer is returned.
  size_t max_attempts = 3;
  /// Session routes remembered at most, and for how long after their last
  /// use (the reference router keeps one for 4 h).
  size_t max_sessions = 100'000;
  std::chrono::milliseconds session_ttl = std::chrono::hours{4};
  /// The member capability enrollments and removals must carry (empty:
  /// none).
  std::string member_token;
};

struct gateway_state {
  static inline const char* name = "gateway";

  struct member {
    replica_actor handle;
    /// What it last reported (routing reads the router's copy).
    std::optional<replica_info> info;
  };

  /// One client request, possibly tried on several replicas.
  struct flight {
    uint64_t client_key = 0;
    caf::actor client;
    caf::typed_response_promise<replica_answer> promise;
    std::string pool;
    std::string session;
    replica_call call;
    std::set<replica_slot> tried;
    /// The replica trying it now (0 = none).
    replica_slot current = 0;
    bool streamed = false;
    /// The client went away: no retry.
    bool cancelled = false;
    std::chrono::steady_clock::time_point started;
  };

  gateway_options opts;
  replica_router router{{}};
  std::map<replica_slot, member> replicas;
  std::map<caf::actor_addr, replica_slot> slot_of;
  replica_slot next_slot = 1;
  /// By attempt key.
  std::map<uint64_t, flight> flights;
  /// (client actor, client key) -> attempt key.
  std::map<std::pair<caf::actor_addr, uint64_t>, uint64_t> by_client;
  uint64_t next_key = 1;
  gateway_stats stats;
};

gateway_actor::behavior_type gateway_service(gateway_actor::stateful_pointer<gateway_state> self,
                                             gateway_options opts);

} // namespace stitch
