#include "actors/gateway.hpp"

#include <caf/all.hpp>

#include <algorithm>

#include "actors/log.hpp"
#include "runtime/core/constraint.hpp"
#include "runtime/core/version_ref.hpp"

namespace stitch {

namespace {

using self_ptr = gateway_actor::stateful_pointer<gateway_state>;

constraint constraint_of(const replica_call& call) {
  constraint c;
  if (call.min_version >= 0)
    c.min_version = static_cast<uint64_t>(call.min_version);
  if (call.exact_version >= 0)
    c.exact_version = static_cast<uint64_t>(call.exact_version);
  return c;
}

replica_answer unavailable(const std::string& message) {
  replica_answer a;
  a.status = 503;
  a.error_type = "EngineUnavailable";
  a.retryable = true;
  a.retry_after = 1;
  a.body = error_json(a.error_type, message, true);
  return a;
}

/// The newest pointer version of `run` the replicas of `pool` reported.
std::optional<uint64_t> pointer_of(const gateway_state& st, const std::string& pool,
                                   const std::string& run) {
  std::optional<uint64_t> best;
  for (const auto& [addr, m] : st.replicas) {
    if (m.pool != pool || m.info.pointer.empty())
      continue;
    auto ref = parse_required_version_ref(m.info.pointer);
    if (ref && ref->run_id == run)
      best = std::max(best.value_or(0), ref->version);
  }
  return best;
}

void record(gateway_state& st, const gateway_state::flight& f, const replica_answer& a) {
  auto& s = st.stats;
  std::chrono::duration<double> took = std::chrono::steady_clock::now() - f.started;
  s.latency_seconds.observe(took.count());
  auto code = std::find(s.codes.begin(), s.codes.end(), a.status);
  if (code == s.codes.end()) {
    s.codes.push_back(a.status);
    s.code_counts.push_back(1);
  } else {
    ++s.code_counts[static_cast<size_t>(code - s.codes.begin())];
  }
  if (a.stamped)
    if (auto latest = pointer_of(st, f.pool, a.run_id);
        latest && *latest >= a.weight_version_start) {
      s.last_staleness = static_cast<double>(*latest - a.weight_version_start);
      s.staleness_versions.observe(s.last_staleness);
    }
}

void finish(self_ptr self, uint64_t key, replica_answer a) {
  auto& st = self->state;
  auto it = st.flights.find(key);
  if (it == st.flights.end())
    return;
  record(st, it->second, a);
  it->second.promise.deliver(std::move(a));
  st.by_client.erase({it->second.client.address(), it->second.client_key});
  st.flights.erase(it);
}

/// No replica can take the request: the gateway's own 409 (DESIGN §5), or
/// 503 when nothing in the pool is ready.
replica_answer own_answer(self_ptr self, const gateway_state::flight& f) {
  auto& st = self->state;
  auto c = constraint_of(f.call);
  std::optional<uint64_t> highest;
  bool held = false;
  size_t ready = 0;
  for (const auto& [addr, m] : st.replicas) {
    if (m.pool != f.pool || !m.known)
      continue;
    if (m.info.applied_version >= 0) {
      auto v = static_cast<uint64_t>(m.info.applied_version);
      if (c.exact_version && v == *c.exact_version)
        held = true;
      if (m.info.ready)
        highest = std::max(highest.value_or(0), v);
    }
    if (m.info.ready)
      ++ready;
  }
  if (ready == 0 || !c.any())
    return unavailable("no replica of pool " + quote_untrusted(f.pool) + " is ready");
  rejection r = reject(c, highest);
  r.message = (c.exact_version ? "exact_version " + std::to_string(*c.exact_version)
                               : "min_version " + std::to_string(*c.min_version))
              + " was requested but the ready replicas of pool " + quote_untrusted(f.pool)
              + " serve at most version " + std::to_string(highest.value_or(0));
  // An exact pin the pool moved past and no replica holds is never served again.
  r.retryable = !(c.exact_version && highest && *c.exact_version < *highest && !held);
  r.message += r.retryable ? "; retry later" : "; the pool has moved past it for good";
  // Lagging replicas catch up now rather than at their next backstop tick.
  for (const auto& [addr, m] : st.replicas)
    if (m.pool == f.pool && m.info.applied_version >= 0
        && static_cast<uint64_t>(m.info.applied_version) < r.target_version)
      caf::anon_send(m.handle, atom::wake_v);
  replica_answer a;
  a.status = 409;
  a.error_type = "WeightVersionNotReady";
  a.retryable = r.retryable;
  a.retry_after = r.retryable ? 1 : 0;
  a.applied = highest ? static_cast<int64_t>(*highest) : -1;
  a.body = rejection_json(r);
  return a;
}

void on_answer(self_ptr self, uint64_t key, const caf::actor_addr& from, replica_answer a);

void dispatch(self_ptr self, uint64_t key, std::optional<replica_answer> last) {
  auto& st = self->state;
  auto& f = st.flights.at(key);
  const caf::actor_addr* chosen = nullptr;
  if (f.tried.size() < st.opts.max_attempts)
    chosen = choose_replica(st, f.pool, f.session, constraint_of(f.call), f.tried);
  if (!chosen) {
    finish(self, key, last ? std::move(*last) : own_answer(self, f));
    return;
  }
  auto& m = st.replicas.at(*chosen);
  ++m.outstanding;
  f.current = *chosen;
  f.tried.insert(*chosen);
  if (!f.session.empty())
    st.affinity[{f.pool, f.session}] = *chosen;
  replica_call call = f.call;
  call.key = key;
  // No timeout: generations may run for minutes. A replica that goes away is
  // noticed by `drop`, which answers its flights (and they are retried).
  self->request(m.handle, caf::infinite, atom::generate_v, std::move(call))
    .then([self, key, from = *chosen](
            replica_answer& answer) { on_answer(self, key, from, std::move(answer)); },
          [self, key, from = *chosen](caf::error& err) {
            on_answer(self, key, from,
                      unavailable("the replica did not answer: " + self->system().render(err)));
          });
}

void on_answer(self_ptr self, uint64_t key, const caf::actor_addr& from, replica_answer a) {
  auto& st = self->state;
  auto it = st.flights.find(key);
  // A late answer of an attempt the gateway gave up on (its replica was
  // dropped) is not the flight's answer any more.
  if (it == st.flights.end() || it->second.current != from)
    return;
  auto& f = it->second;
  if (auto m = st.replicas.find(f.current); m != st.replicas.end() && m->second.outstanding > 0)
    --m->second.outstanding;
  bool retry = (a.status == 409 || a.status == 503) && a.retryable && !f.streamed && !f.cancelled;
  if (!retry) {
    finish(self, key, std::move(a));
    return;
  }
  ++st.stats.retries_total;
  dispatch(self, key, std::move(a));
}

} // namespace

const caf::actor_addr* choose_replica(const gateway_state& st, const std::string& pool,
                                      const std::string& session, const constraint& c,
                                      const std::set<caf::actor_addr>& tried) {
  auto eligible = [&](const caf::actor_addr& addr, const gateway_state::member& m) {
    return m.pool == pool && m.known && m.info.ready && m.info.applied_version >= 0
           && c.satisfied_by(static_cast<uint64_t>(m.info.applied_version))
           && !tried.contains(addr);
  };
  if (!session.empty())
    if (auto a = st.affinity.find({pool, session}); a != st.affinity.end())
      if (auto m = st.replicas.find(a->second);
          m != st.replicas.end() && eligible(m->first, m->second))
        return &m->first;
  const caf::actor_addr* best = nullptr;
  uint64_t least = 0;
  for (const auto& [addr, m] : st.replicas)
    if (eligible(addr, m) && (!best || m.outstanding < least)) {
      best = &addr;
      least = m.outstanding;
    }
  return best;
}

namespace {

/// Stops routing to a replica that is gone.
void drop(self_ptr self, const caf::actor_addr& who, const std::string& why) {
  auto& st = self->state;
  auto it = st.replicas.find(who);
  if (it == st.replicas.end())
    return;
  log::warn("gateway",
            "replica "
              + (it->second.known ? it->second.info.replica_id : std::string{"(not yet reporting)"})
              + " is gone (" + why + "): removed from routing");
  auto handle = it->second.handle;
  st.replicas.erase(it);
  std::erase_if(st.affinity, [&](const auto& kv) { return kv.second == who; });
  // Requests in flight there will not be answered (a dead node's replica) or
  // are not wanted any more: tell it to stop, and retry them elsewhere.
  std::vector<uint64_t> stranded;
  for (const auto& [key, f] : st.flights)
    if (f.current == who)
      stranded.push_back(key);
  for (auto key : stranded) {
    self->send(handle, atom::cancel_v, key);
    on_answer(self, key, who, unavailable("replica left while serving the request (" + why + ")"));
  }
}

} // namespace

gateway_actor::behavior_type gateway_service(gateway_actor::stateful_pointer<gateway_state> self,
                                             gateway_options opts) {
  self->state.opts = opts;
  self->state.stats.latency_seconds = histogram::with_bounds(
    {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
  self->state.stats.staleness_versions = histogram::with_bounds({0, 1, 2, 3, 4, 5, 8, 16, 32, 64});
  self->set_down_handler([self](const caf::down_msg& down) {
    drop(self, down.source, self->system().render(down.reason));
  });
  return {
    [self](atom::retire, const replica_actor& replica) {
      drop(self, replica.address(), "the coordinator removed its node");
    },
    [self](atom::enroll, const std::string& pool, const replica_actor& replica) {
      auto& st = self->state;
      auto addr = replica.address();
      if (st.replicas.contains(addr))
        return;
      gateway_state::member m;
      m.handle = replica;
      m.pool = pool;
      st.replicas.emplace(addr, std::move(m));
      self->monitor(replica);
      self->send(replica, atom::subscribe_v, caf::actor_cast<caf::actor>(self));
    },
    [self](atom::generate, std::string& pool, std::string& session,
           replica_call& call) -> caf::result<replica_answer> {
      auto& st = self->state;
      auto client = caf::actor_cast<caf::actor>(self->current_sender());
      auto promise = self->make_response_promise<replica_answer>();
      uint64_t key = st.next_key++;
      gateway_state::flight f;
      f.client_key = call.key;
      f.client = client;
      f.promise = promise;
      f.pool = std::move(pool);
      f.session = std::move(session);
      f.call = std::move(call);
      f.started = std::chrono::steady_clock::now();
      if (client)
        st.by_client[{client.address(), f.client_key}] = key;
      st.flights.emplace(key, std::move(f));
      dispatch(self, key, std::nullopt);
      return promise;
    },
    [self](atom::cancel, uint64_t client_key) {
      auto& st = self->state;
      auto sender = self->current_sender();
      auto it = st.by_client.find({caf::actor_cast<caf::actor_addr>(sender), client_key});
      if (it == st.by_client.end())
        return;
      auto f = st.flights.find(it->second);
      if (f == st.flights.end())
        return;
      if (auto m = st.replicas.find(f->second.current); m != st.replicas.end())
        self->send(m->second.handle, atom::cancel_v, it->second);
      f->second.cancelled = true;
    },
    [self](atom::wake, const std::string& pool) {
      for (const auto& [addr, m] : self->state.replicas)
        if (pool.empty() || m.pool == pool)
          self->send(m.handle, atom::wake_v);
    },
    [self](atom::stats) { return self->state.stats; },
    [self](atom::pool_view, const std::string& pool) {
      std::vector<replica_info> out;
      for (const auto& [addr, m] : self->state.replicas)
        if ((pool.empty() || m.pool == pool) && m.known)
          out.push_back(m.info);
      return out;
    },
    [self](atom::replica_state, replica_info& info) {
      auto& st = self->state;
      auto it = st.replicas.find(caf::actor_cast<caf::actor_addr>(self->current_sender()));
      if (it == st.replicas.end())
        return;
      it->second.info = std::move(info);
      it->second.known = true;
    },
    [self](atom::event, uint64_t key, std::string& ev) {
      auto& st = self->state;
      auto it = st.flights.find(key);
      if (it == st.flights.end() || !it->second.client)
        return;
      it->second.streamed = true;
      caf::send_as(caf::actor_cast<caf::actor>(self), it->second.client, atom::event_v,
                   it->second.client_key, std::move(ev));
    },
  };
}

} // namespace stitch
