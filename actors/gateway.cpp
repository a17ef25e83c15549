#include "actors/gateway.hpp"

#include <caf/all.hpp>

#include <algorithm>

#include "actors/credentials.hpp"
#include "actors/log.hpp"
#include "runtime/core/version_ref.hpp"

namespace stitch {

namespace {

using self_ptr = gateway_actor::stateful_pointer<gateway_state>;

clock_time now_of(self_ptr self) {
  return std::chrono::duration_cast<clock_time>(self->clock().now().time_since_epoch());
}

replica_answer unavailable(const std::string& message) {
  return answer_of(make_http_error(http_failure::unavailable, message));
}

/// The newest pointer version of `run` the replicas of `pool` reported.
std::optional<uint64_t> pointer_of(const gateway_state& st, const std::string& pool,
                                   const std::string& run) {
  std::optional<uint64_t> best;
  for (const auto& [slot, m] : st.replicas)
    if (m.info && m.info->pool == pool && m.info->pointer && m.info->pointer->run_id == run)
      best = std::max(best.value_or(0), m.info->pointer->version);
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
    if (auto latest = pointer_of(st, f.pool, a.run_id); latest && *latest >= a.stamped->start) {
      s.last_staleness = static_cast<double>(*latest - a.stamped->start);
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
  auto own = st.router.refuse(f.pool, f.call.c);
  for (auto slot : own.wake)
    if (auto m = st.replicas.find(slot); m != st.replicas.end())
      self->send(m->second.handle, atom::wake_v);
  return answer_of(own.answer);
}

void on_answer(self_ptr self, uint64_t key, replica_slot from, replica_answer a);
void drop(self_ptr self, const caf::actor_addr& who, const std::string& why);

void dispatch(self_ptr self, uint64_t key, std::optional<replica_answer> last) {
  auto& st = self->state;
  auto& f = st.flights.at(key);
  std::optional<replica_slot> chosen;
  if (f.tried.size() < st.opts.max_attempts)
    chosen = st.router.choose(f.pool, f.session, f.call.c, f.tried, now_of(self));
  if (!chosen) {
    finish(self, key, last ? std::move(*last) : own_answer(self, f));
    return;
  }
  f.current = *chosen;
  f.tried.insert(*chosen);
  replica_call call = f.call;
  call.key = key;
  // No timeout: generations may run for minutes. A replica that goes away is
  // noticed by `drop`, which answers its flights (and they are retried).
  self->request(st.replicas.at(*chosen).handle, caf::infinite, atom::generate_v, std::move(call))
    .then([self, key, from = *chosen](
            replica_answer& answer) { on_answer(self, key, from, std::move(answer)); },
          [self, key, from = *chosen](caf::error& err) {
            auto why = self->system().render(err);
            // Its route is gone (the node that relayed to it died): nothing
            // more reaches it until it is enrolled again.
            // (`drop` retries its flights, this one included.)
            if (auto m = self->state.replicas.find(from);
                err == caf::sec::request_receiver_down && m != self->state.replicas.end()) {
              drop(self, m->second.handle.address(), why);
              return;
            }
            on_answer(self, key, from, unavailable("the replica did not answer: " + why));
          });
}

void on_answer(self_ptr self, uint64_t key, replica_slot from, replica_answer a) {
  auto& st = self->state;
  auto it = st.flights.find(key);
  // A late answer of an attempt the gateway gave up on (its replica was
  // dropped) is not the flight's answer any more.
  if (it == st.flights.end() || it->second.current != from)
    return;
  auto& f = it->second;
  st.router.finished(from);
  f.current = 0;
  if (!st.router.should_retry(a.status, a.retryable, f.streamed, f.cancelled, f.tried.size())) {
    finish(self, key, std::move(a));
    return;
  }
  ++st.stats.retries_total;
  dispatch(self, key, std::move(a));
}

/// Stops routing to a replica that is gone.
void drop(self_ptr self, const caf::actor_addr& who, const std::string& why) {
  auto& st = self->state;
  auto s = st.slot_of.find(who);
  if (s == st.slot_of.end())
    return;
  auto slot = s->second;
  st.slot_of.erase(s);
  auto it = st.replicas.find(slot);
  log::warn("gateway",
            "replica "
              + (it->second.info ? it->second.info->replica_id : std::string{"(not yet reporting)"})
              + " is gone (" + why + "): removed from routing");
  auto handle = it->second.handle;
  st.replicas.erase(it);
  st.router.remove(slot);
  // Requests in flight there will not be answered (a dead node's replica) or
  // are not wanted any more: tell it to stop, and retry them elsewhere.
  std::vector<uint64_t> stranded;
  for (const auto& [key, f] : st.flights)
    if (f.current == slot)
      stranded.push_back(key);
  for (auto key : stranded) {
    self->send(handle, atom::cancel_v, key);
    on_answer(self, key, slot, unavailable("replica left while serving the request (" + why + ")"));
  }
}

} // namespace

gateway_actor::behavior_type gateway_service(gateway_actor::stateful_pointer<gateway_state> self,
                                             gateway_options opts) {
  self->state.opts = opts;
  self->state.router = replica_router{{opts.max_attempts, opts.max_sessions,
                                       std::chrono::duration_cast<clock_time>(opts.session_ttl)}};
  self->state.stats.latency_seconds = histogram::with_bounds(
    {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
  self->state.stats.staleness_versions = histogram::with_bounds({0, 1, 2, 3, 4, 5, 8, 16, 32, 64});
  self->set_down_handler([self](const caf::down_msg& down) {
    drop(self, down.source, self->system().render(down.reason));
  });
  return {
    [self](atom::retire, const replica_actor& replica, const std::string& cap) {
      if (member_admits("gateway", self->state.opts.member_token, cap, "a replica's removal"))
        drop(self, replica.address(), "the coordinator removed its node");
    },
    [self](atom::enroll, const std::string& pool, const replica_actor& replica,
           const std::string& cap) {
      auto& st = self->state;
      // A foreign replica enrolled would answer rollout clients with samples
      // stamped as it pleases.
      if (!replica
          || !member_admits("gateway", st.opts.member_token, cap,
                            "enrolling a replica of pool '" + pool + "'"))
        return;
      auto addr = replica.address();
      if (auto known = st.slot_of.find(addr); known != st.slot_of.end()) {
        // Enrolled again by a restarted coordinator: the handle may be a
        // fresh proxy of the same replica (the old one's route went with the
        // coordinator's node), so it replaces the one held.
        auto& m = st.replicas.at(known->second);
        if (caf::actor_cast<caf::abstract_actor*>(m.handle)
            != caf::actor_cast<caf::abstract_actor*>(replica)) {
          m.handle = replica;
          self->monitor(replica);
          self->send(replica, atom::subscribe_v, caf::actor_cast<replica_watcher_actor>(self));
        }
        return;
      }
      auto slot = st.next_slot++;
      st.slot_of.emplace(addr, slot);
      st.replicas.emplace(slot, gateway_state::member{replica, std::nullopt});
      st.router.upsert(slot, replica_view{pool, false, false, std::nullopt});
      self->monitor(replica);
      self->send(replica, atom::subscribe_v, caf::actor_cast<replica_watcher_actor>(self));
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
      for (const auto& [slot, m] : self->state.replicas)
        if (const auto* v = self->state.router.find(slot); v && (pool.empty() || v->pool == pool))
          self->send(m.handle, atom::wake_v);
    },
    [self](atom::stats) { return self->state.stats; },
    [self](atom::pool_view, const std::string& pool) {
      std::vector<replica_info> out;
      for (const auto& [slot, m] : self->state.replicas)
        if (m.info && (pool.empty() || m.info->pool == pool))
          out.push_back(*m.info);
      return out;
    },
    [self](atom::replica_state, replica_info& info) {
      auto& st = self->state;
      auto s = st.slot_of.find(caf::actor_cast<caf::actor_addr>(self->current_sender()));
      if (s == st.slot_of.end())
        return;
      const auto* known = st.router.find(s->second);
      // The pool is the one the replica was enrolled in.
      st.router.upsert(
        s->second, replica_view{known ? known->pool : info.pool, true, info.ready, info.serving});
      st.replicas.at(s->second).info = std::move(info);
    },
    [self](atom::event, uint64_t key, std::string& ev) {
      auto& st = self->state;
      auto it = st.flights.find(key);
      if (it == st.flights.end() || !it->second.client)
        return;
      // Only the replica serving the flight streams into it (keys count up:
      // anyone could guess one and inject events into a client's stream).
      auto serving = st.replicas.find(it->second.current);
      if (serving == st.replicas.end()
          || serving->second.handle.address() != self->current_sender())
        return;
      it->second.streamed = true;
      caf::send_as(caf::actor_cast<caf::actor>(self), it->second.client, atom::event_v,
                   it->second.client_key, std::move(ev));
    },
  };
}

} // namespace stitch
