#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/core/admission_gate.hpp"
#include "runtime/core/constraint.hpp"
#include "runtime/core/http_errors.hpp"

namespace stitch {

/// How the host (the gateway actor) names a replica it routes to.
using replica_slot = uint64_t;

/// What routing needs to know of a replica: its pool and what it last
/// reported.
struct replica_view {
  std::string pool;
  /// Reported at least once (a replica that never reported is not routed to).
  bool known = false;
  /// Admitting: caught up, in rotation, not retiring.
  bool ready = false;
  /// The version it serves; nullopt before its first activation.
  std::optional<uint64_t> applied;
};

/// The gateway's answer when no replica can take a request (DESIGN §5), and
/// the lagging replicas to wake so that they catch up now.
struct own_answer {
  http_error answer;
  std::vector<replica_slot> wake;
};

/// Replica choice for the gateway, pure: which ready replica of a pool takes
/// a request (its constraint satisfied, least outstanding, the session's
/// replica first), when an answer is retried on another, and the gateway's
/// own 409/503 when none can take it. The session table is bounded in size
/// (least recently used entries go first) and in age (an entry unused for
/// `session_ttl` is forgotten, as the reference router's 4 h
/// `SESSION_ROUTE_TTL_SECONDS`).
class replica_router {
public:
  struct options {
    /// Replicas tried for one request before its last answer is returned.
    size_t max_attempts = 3;
    size_t max_sessions = 100'000;
    clock_time session_ttl = std::chrono::hours{4};
  };

  replica_router();
  explicit replica_router(options opts);

  /// Adds a replica or updates what it reported.
  void upsert(replica_slot slot, replica_view view);
  /// A replica is gone: forgotten, with every session routed to it.
  void remove(replica_slot slot);
  const replica_view* find(replica_slot slot) const;

  /// The replica for a request of `pool` with `session` (empty = none) under
  /// `c`, skipping `tried`; nullopt when none is eligible. The choice counts
  /// as outstanding until `finished`, and the session now routes there.
  std::optional<replica_slot> choose(const std::string& pool, const std::string& session,
                                     const constraint& c, const std::set<replica_slot>& tried,
                                     clock_time now);
  /// The request routed to `slot` was answered (or given up on).
  void finished(replica_slot slot);

  /// Whether an answer is retried on another replica: a retryable 409 or
  /// 503, nothing streamed to the client yet, the client still there, and
  /// attempts left.
  bool should_retry(uint16_t status, bool retryable, bool streamed, bool cancelled,
                    size_t attempts) const noexcept;

  /// No replica could take the request: 503 when nothing in the pool is
  /// ready or the request has no constraint, else the gateway's own 409
  /// (not retryable when an exact pin the pool has moved past for good).
  own_answer refuse(const std::string& pool, const constraint& c) const;

  uint64_t outstanding(replica_slot slot) const;
  size_t sessions() const noexcept { return sessions_.size(); }

private:
  struct member {
    replica_view view;
    uint64_t outstanding = 0;
  };
  using session_key = std::pair<std::string, std::string>;
  struct session_entry {
    replica_slot slot;
    clock_time last_used;
    std::list<session_key>::iterator lru;
  };

  bool eligible(const member& m, const std::string& pool, const constraint& c) const;
  void expire(clock_time now);
  void remember(const std::string& pool, const std::string& session, replica_slot slot,
                clock_time now);

  options opts_;
  std::map<replica_slot, member> members_;
  std::map<session_key, session_entry> sessions_;
  /// Least recently used first.
  std::list<session_key> lru_;
};

} // namespace stitch
