#include "runtime/core/router.hpp"

#include <algorithm>

#include "runtime/core/version_ref.hpp"

namespace stitch {

replica_router::replica_router() : replica_router(options{}) {}

replica_router::replica_router(options opts) : opts_(opts) {
  opts_.max_sessions = std::max<size_t>(opts_.max_sessions, 1);
}

void replica_router::upsert(replica_slot slot, replica_view view) {
  members_[slot].view = std::move(view);
}

void replica_router::remove(replica_slot slot) {
  members_.erase(slot);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second.slot == slot) {
      lru_.erase(it->second.lru);
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
}

const replica_view* replica_router::find(replica_slot slot) const {
  auto it = members_.find(slot);
  return it == members_.end() ? nullptr : &it->second.view;
}

bool replica_router::eligible(const member& m, const std::string& pool, const constraint& c) const {
  return m.view.pool == pool && m.view.known && m.view.ready && m.view.applied
         && c.satisfied_by(*m.view.applied);
}

void replica_router::expire(clock_time now) {
  while (!lru_.empty()) {
    auto it = sessions_.find(lru_.front());
    bool too_many = sessions_.size() > opts_.max_sessions;
    if (!too_many && now - it->second.last_used < opts_.session_ttl)
      break;
    sessions_.erase(it);
    lru_.pop_front();
  }
}

void replica_router::remember(const std::string& pool, const std::string& session,
                              replica_slot slot, clock_time now) {
  session_key key{pool, session};
  if (auto it = sessions_.find(key); it != sessions_.end()) {
    it->second.slot = slot;
    it->second.last_used = now;
    lru_.splice(lru_.end(), lru_, it->second.lru);
  } else {
    lru_.push_back(key);
    sessions_.emplace(std::move(key), session_entry{slot, now, std::prev(lru_.end())});
  }
  expire(now);
}

std::optional<replica_slot> replica_router::choose(const std::string& pool,
                                                   const std::string& session, const constraint& c,
                                                   const std::set<replica_slot>& tried,
                                                   clock_time now) {
  expire(now);
  std::optional<replica_slot> chosen;
  if (!session.empty())
    if (auto s = sessions_.find({pool, session}); s != sessions_.end())
      if (auto m = members_.find(s->second.slot);
          m != members_.end() && !tried.contains(m->first) && eligible(m->second, pool, c))
        chosen = m->first;
  if (!chosen) {
    uint64_t least = 0;
    for (const auto& [slot, m] : members_)
      if (!tried.contains(slot) && eligible(m, pool, c) && (!chosen || m.outstanding < least)) {
        chosen = slot;
        least = m.outstanding;
      }
  }
  if (!chosen)
    return std::nullopt;
  ++members_[*chosen].outstanding;
  if (!session.empty())
    remember(pool, session, *chosen, now);
  return chosen;
}

void replica_router::finished(replica_slot slot) {
  if (auto m = members_.find(slot); m != members_.end() && m->second.outstanding > 0)
    --m->second.outstanding;
}

bool replica_router::should_retry(uint16_t status, bool retryable, bool streamed, bool cancelled,
                                  size_t attempts) const noexcept {
  return (status == 409 || status == 503) && retryable && !streamed && !cancelled
         && attempts < opts_.max_attempts;
}

own_answer replica_router::refuse(const std::string& pool, const constraint& c) const {
  std::optional<uint64_t> highest;
  bool held = false;
  size_t ready = 0;
  for (const auto& [slot, m] : members_) {
    if (m.view.pool != pool || !m.view.known)
      continue;
    if (m.view.applied) {
      if (c.exact_version && *m.view.applied == *c.exact_version)
        held = true;
      if (m.view.ready)
        highest = std::max(highest.value_or(0), *m.view.applied);
    }
    if (m.view.ready && m.view.applied)
      ++ready;
  }
  own_answer out;
  if (ready == 0 || !c.any()) {
    out.answer = make_http_error(http_failure::unavailable,
                                 "no replica of pool " + quote_untrusted(pool) + " is ready");
    return out;
  }
  rejection r = reject(c, highest);
  r.message = (c.exact_version ? "exact_version " + std::to_string(*c.exact_version)
                               : "min_version " + std::to_string(*c.min_version))
              + " was requested but the ready replicas of pool " + quote_untrusted(pool)
              + " serve at most version " + std::to_string(highest.value_or(0));
  // An exact pin the pool moved past and no replica holds is never served again.
  r.retryable = !(c.exact_version && highest && *c.exact_version < *highest && !held);
  r.message += r.retryable ? "; retry later" : "; the pool has moved past it for good";
  // Lagging replicas catch up now rather than at their next backstop tick.
  for (const auto& [slot, m] : members_)
    if (m.view.pool == pool && m.view.applied && *m.view.applied < r.target_version)
      out.wake.push_back(slot);
  out.answer = not_ready_error(std::move(r));
  return out;
}

uint64_t replica_router::outstanding(replica_slot slot) const {
  auto it = members_.find(slot);
  return it == members_.end() ? 0 : it->second.outstanding;
}

} // namespace stitch
