#include "actors/replica.hpp"

#include <caf/all.hpp>

#include "actors/peer_offer.hpp"
#include "actors/replica_internal.hpp"

#include <algorithm>

#include "actors/credentials.hpp"
#include "actors/log.hpp"
#include "gpu/checksum.hpp"
#include "runtime/core/checksum.hpp"
#include "runtime/core/constraint.hpp"
#include "runtime/core/manifest.hpp"

namespace stitch {

namespace replica_detail {
namespace rfx = reconcile_effects;
namespace qfx = request_effects;

namespace {

/// Whether a message carries the member capability (logged when not).
bool is_member(self_ptr self, const std::string& presented, std::string_view what) {
  return member_admits("replica", self->state.opts.member_token, presented, what);
}

} // namespace

clock_time now_of(self_ptr self) {
  return std::chrono::duration_cast<clock_time>(self->clock().now().time_since_epoch());
}

work_report report_of(uint64_t op, const status& outcome, std::chrono::nanoseconds took) {
  work_report r;
  r.op = op;
  r.nanos = took.count();
  if (!outcome)
    r.err = to_caf_error(outcome.error());
  return r;
}

status status_of(self_ptr self, const work_report& r) {
  if (!r.err)
    return {};
  return from_caf_error(self->system(), r.err);
}

std::chrono::nanoseconds since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::steady_clock::now() - t0;
}

/// Offers the engine's served weights to peers, on the reconcile worker
/// (registering memory and taking chunk digests take time that grows with
/// the model): the next job after an activation or a rebuild.
void expose_served(replica_state& st, const std::shared_ptr<engine_port>& engine) {
  if (!st.deps.holder)
    return;
  st.deps.reconcile_worker->post([holder = st.deps.holder, engine, id = st.opts.replica_id] {
    auto view = engine->host_view();
    if (!view) {
      holder->withdraw();
      return;
    }
    auto ref = view->version;
    if (auto ok = holder->expose(std::move(*view)); !ok) {
      holder->withdraw();
      log::warn("replica", id + " cannot offer " + to_string(ref)
                             + " to peers (they read the store instead): " + to_string(ok.error()));
    }
  });
}

/// What the versions a plan folds store (its anchor's tensors, its deltas'
/// frames): what the bytes on the wire compare with.
uint64_t stored_bytes_of(tensor_source& source, const chain_plan& plan) {
  uint64_t total = 0;
  auto add = [&](const version_ref& ref) {
    if (auto m = source.manifest_of(ref))
      total += m->total_size;
  };
  if (plan.anchor)
    add(*plan.anchor);
  for (const auto& ref : plan.deltas)
    add(ref);
  return total;
}

/// Where the bytes between two snapshots came from.
fetch_summary fetched_between(const counting_source::counts& before,
                              const counting_source::counts& after) {
  fetch_summary f;
  f.from_store = after.from_store - before.from_store;
  f.peer_delta_bytes = after.frames_from_peers - before.frames_from_peers;
  f.peer_full_bytes = after.whole_from_peers - before.whole_from_peers;
  for (const auto& [source, n] : after.from_peers) {
    auto was = before.from_peers.find(source);
    uint64_t d = n - (was == before.from_peers.end() ? 0 : was->second);
    if (d > 0)
      f.from_peers[source] = d;
  }
  // The newest problems since `before`, at most the ones still kept.
  uint64_t fresh =
    std::min<uint64_t>(after.problems_seen - before.problems_seen, after.recent_problems.size());
  for (auto it = after.recent_problems.end() - static_cast<ptrdiff_t>(fresh);
       it != after.recent_problems.end() && f.problems.size() < 8; ++it)
    f.problems.push_back(*it);
  return f;
}

/// What the engine answered; an engine error goes back as an error of its
/// own so that the lifecycle decides the answer.
std::pair<replica_answer, caf::error> answer_of(result<engine_reply> out) {
  if (!out)
    return {replica_answer{}, to_caf_error(out.error())};
  replica_answer r;
  r.status = out->status;
  r.content_type = std::move(out->content_type);
  r.body = std::move(out->body);
  r.stream = out->stream;
  return {std::move(r), caf::error{}};
}

void carry(self_ptr self, std::vector<request_effect> effects);

void answer(self_ptr self, request_id id, replica_answer reply) {
  reply.replica_id = self->state.opts.replica_id;
  auto& st = self->state;
  auto it = st.requests.find(id);
  if (it == st.requests.end())
    return;
  it->second.promise.deliver(std::move(reply));
  st.by_key.erase({it->second.caller.address(), it->second.call.key});
  st.requests.erase(it);
  if (st.profile && !st.profile->started)
    profile_progress(self);
  // A retiring replica leaves with its last answer, whichever path gave it.
  if (st.lane->retiring() && st.requests.empty() && st.lane->unanswered() == 0) {
    log::info("replica", st.opts.replica_id + " drained; leaving");
    self->quit();
  }
}

void reconcile_now(self_ptr self, trigger why) {
  // A profile runs its passes one by one, when told (a folded catch-up
  // needs the versions published with no pass in between).
  if (const auto& p = self->state.profile; p && p->started && !p->ending)
    return;
  apply(self, self->state.rec.on_trigger(why));
}

void start_generation(self_ptr self, request_id id, std::optional<uint64_t> served_version) {
  auto& st = self->state;
  auto it = st.requests.find(id);
  if (it == st.requests.end())
    return;
  auto& r = it->second;
  engine_call call;
  call.id = id;
  call.tag = st.opts.replica_id + "-" + std::to_string(id);
  call.method = r.call.method;
  call.route = r.call.route;
  call.body = r.call.body;
  std::optional<version_ref> served;
  if (served_version && st.rec.applied())
    served = version_ref{st.rec.applied()->run_id, *served_version};
  auto handle = caf::actor_cast<replica_actor>(self);
  st.deps.request_workers->post([handle, id, engine = st.engine, call = std::move(call), served,
                                 caller = r.caller, key = r.call.key,
                                 cancelled = r.cancelled]() mutable {
    if (served)
      call.body = engine->stamp_request(call.route, call.body, *served);
    event_sink sink;
    if (caller)
      // As the replica: the gateway takes a flight's events from the replica
      // serving it only.
      sink = [&](std::string ev) {
        caf::send_as(caf::actor_cast<caf::actor>(handle), caller, atom::event_v, key,
                     std::move(ev));
      };
    auto out = engine->forward(call, sink, [&] { return cancelled->load(); });
    caf::optional<uint64_t> last;
    if (out && out->last_token_version)
      last = *out->last_token_version;
    auto [reply, err] = answer_of(std::move(out));
    send_to_itself(handle, atom::generated_v, id, std::move(reply), std::move(err), last);
  });
}

void arm_drain_timer(self_ptr self) {
  auto& st = self->state;
  auto deadline = st.lane->view().drain_deadline;
  if (!deadline || st.drain_timer_armed)
    return;
  st.drain_timer_armed = true;
  auto wait = std::max(clock_time{0}, *deadline - now_of(self));
  self->delayed_send(self,
                     std::chrono::duration_cast<std::chrono::milliseconds>(wait)
                       + std::chrono::milliseconds{1},
                     atom::drain_check_v);
}

void run_commit(self_ptr self) {
  auto& st = self->state;
  if (!st.pending_commit)
    return;
  auto handle = caf::actor_cast<replica_actor>(self);
  st.deps.reconcile_worker->post([handle, engine = st.engine, c = *st.pending_commit] {
    // The pause: from stopping the engine to resuming it, nothing else.
    auto t0 = std::chrono::steady_clock::now();
    status outcome = engine->pause();
    if (outcome)
      outcome = engine->commit();
    if (outcome && c.flush_cache)
      outcome = engine->flush_cache();
    auto resumed = engine->resume();
    auto took = since(t0);
    if (outcome && !resumed)
      outcome = resumed;
    auto report = report_of(c.op, outcome, took);
    report.version = c.target;
    send_to_itself(handle, atom::committed_v, std::move(report));
  });
}

void read_pointer(self_ptr self, std::function<void(result<std::optional<pointer_record>>)> then) {
  auto& st = self->state;
  self
    ->request(st.deps.store, caf::duration{st.opts.store_timeout}, atom::read_pointer_v,
              st.opts.pool)
    .then(
      [then](const caf::optional<pointer_record>& r) {
        then(r ? std::optional<pointer_record>{*r} : std::nullopt);
      },
      [self, then](caf::error& err) { then(from_caf_error(self->system(), err)); });
}

void rebuild(self_ptr self, uint64_t op, std::optional<version_ref> last_good) {
  auto& st = self->state;
  auto handle = caf::actor_cast<replica_actor>(self);
  auto slot = std::make_shared<std::shared_ptr<engine_port>>();
  st.rebuilt_engine = slot;
  auto build = [&st, handle, op, slot](version_ref ref) {
    st.deps.reconcile_worker->post(
      [handle, op, slot, ref, make = st.deps.make_engine, bytes = st.bytes] {
        auto t0 = std::chrono::steady_clock::now();
        status outcome;
        auto made = make();
        if (!made) {
          outcome = std::move(made).error();
        } else {
          outcome = (*made)->reset_to_boot(ref, *bytes);
          if (outcome)
            *slot = std::move(*made);
        }
        auto report = report_of(op, outcome, since(t0));
        report.version = ref;
        send_to_itself(handle, atom::rebuilt_v, std::move(report));
      });
  };
  if (last_good) {
    build(*last_good);
    return;
  }
  // Nothing was ever activated: rebuild from the claimed run's boot anchor.
  read_pointer(self, [self, op, build](result<std::optional<pointer_record>> p) {
    if (!p || !p->has_value()) {
      error why = p ? error{errc::no_run_claimed, "no run claimed"} : p.error();
      apply(self, self->state.rec.on_rebuilt(op, why));
      return;
    }
    build(version_ref{(*p)->latest.run_id, (*p)->boot_version});
  });
}

void carry_out(self_ptr self, rfx::read_pointer e) {
  read_pointer(self, [self, op = e.op](result<std::optional<pointer_record>> p) {
    apply(self, self->state.rec.on_pointer_read(op, std::move(p)));
  });
}

void carry_out(self_ptr self, rfx::read_manifest e) {
  auto& st = self->state;
  self
    ->request(st.deps.store, caf::duration{st.opts.store_timeout}, atom::read_manifest_v,
              st.opts.pool, e.ref)
    .then(
      [self, e](manifest& m) {
        // The store may be another node's: its manifest is checked like input.
        result<manifest> checked = std::move(m);
        if (auto ok = validate(*checked); !ok)
          checked = make_error(errc::corrupt_data, "the store's manifest of " + to_string(e.ref)
                                                     + ": " + ok.error().message);
        apply(self, self->state.rec.on_manifest_read(e.op, e.ref, std::move(checked)));
      },
      [self, e](caf::error& err) {
        apply(self,
              self->state.rec.on_manifest_read(e.op, e.ref, from_caf_error(self->system(), err)));
      });
}

void carry_out(self_ptr self, rfx::stage e) {
  auto& st = self->state;
  auto handle = caf::actor_cast<replica_actor>(self);
  st.deps.reconcile_worker->post([handle, engine = st.engine, bytes = st.bytes, e] {
    auto t0 = std::chrono::steady_clock::now();
    auto before = bytes->snapshot();
    pipeline::stage_meter meter;
    status outcome;
    {
      pipeline::stage_meter::installed timed{&meter};
      outcome = engine->prefetch(e.plan);
      if (outcome)
        outcome = engine->stage(e.plan, e.onto_shadow, *bytes);
    }
    auto report = report_of(e.op, outcome, since(t0));
    report.version = e.plan.target;
    report.fetched = fetched_between(before, bytes->snapshot());
    report.fetched.version = e.plan.target;
    report.fetched.stored_bytes = stored_bytes_of(*bytes, e.plan);
    report.fetched.seconds = std::chrono::duration<double>(since(t0)).count();
    auto phases = meter.times();
    report.fetched.fetch_s = phases.fetch_s;
    report.fetched.decode_s = phases.decode_s;
    report.fetched.verify_s = phases.verify_s;
    send_to_itself(handle, atom::staged_v, std::move(report));
  });
}

void carry_out(self_ptr self, rfx::commit e) {
  auto& st = self->state;
  st.pending_commit = e;
  carry(self, st.lane->begin_commit(st.opts.mode, e.drain_all, now_of(self)));
  arm_drain_timer(self);
}

void carry_out(self_ptr self, rfx::advance e) {
  auto& st = self->state;
  if (auto ok = st.lane->advance(e.target.version); !ok)
    log::warn("replica", st.opts.replica_id + " cannot advance to " + to_string(e.target) + ": "
                           + to_string(ok.error()));
  else {
    // Tokens from now on are the new version's, as the stamps say.
    st.engine->relabel(e.target);
    log::info("replica", st.opts.replica_id + " advanced to " + to_string(e.target)
                           + " (the tail changes no weights: no activation)");
  }
}

void carry_out(self_ptr self, rfx::discard_shadow) {
  self->state.deps.reconcile_worker->post(
    [engine = self->state.engine] { engine->discard_shadow(); });
}

void carry_out(self_ptr self, rfx::rebuild_engine e) {
  rebuild(self, e.op, e.last_good);
}

void carry_out(self_ptr self, rfx::leave_rotation e) {
  log::warn("replica", self->state.opts.replica_id + " leaves rotation: " + e.reason);
  self->state.lane->stop_serving(e.reason);
}

void carry_out(self_ptr self, rfx::enter_rotation e) {
  log::info("replica", self->state.opts.replica_id + " enters rotation at " + to_string(e.version));
  self->state.lane->serve_if_open(e.version.version);
}

/// Tells subscribers when what routing depends on changed.
void publish_state(self_ptr self) {
  auto& st = self->state;
  if (st.subscribers.empty())
    return;
  auto info = describe(st);
  auto key = std::tuple{info.ready, info.applied, info.serving,
                        info.state, info.reason,  info.terminal_error};
  if (st.last_published == key)
    return;
  st.last_published = std::move(key);
  for (const auto& s : st.subscribers)
    caf::send_as(caf::actor_cast<caf::actor>(self), s, atom::replica_state_v, info);
}

void apply(self_ptr self, std::vector<reconcile_effect> effects) {
  for (auto& e : effects)
    std::visit([self](auto& x) { carry_out(self, std::move(x)); }, e);
  // Requests of the lane are stamped with the run applied now.
  const auto& applied = self->state.rec.applied();
  self->state.lane->set_run(applied ? applied->run_id : std::string{});
  profile_progress(self);
  publish_state(self);
}

/// Carries out what the request lifecycle decided, in order: the effects
/// that name requests of the lane are the lane's to carry out.
void carry(self_ptr self, std::vector<request_effect> decided) {
  auto& st = self->state;
  std::vector<request_effect> effects, lanes;
  for (auto& e : decided) {
    auto id = request_of(e);
    (id && !st.requests.contains(*id) ? lanes : effects).push_back(std::move(e));
  }
  if (!lanes.empty())
    st.lane->carry(std::move(lanes), &effects);
  for (auto& e : effects) {
    if (auto* a = std::get_if<qfx::start>(&e)) {
      start_generation(self, a->id, a->served);
    } else if (auto* x = std::get_if<qfx::stop>(&e)) {
      if (auto it = st.requests.find(x->id); it != st.requests.end())
        it->second.cancelled->store(true);
    } else if (auto* d = std::get_if<qfx::deliver>(&e)) {
      auto it = st.requests.find(d->id);
      if (it == st.requests.end())
        continue;
      auto reply = std::move(it->second.reply);
      if (d->stamped) {
        reply.stamped = d->stamped;
        reply.run_id = st.rec.applied() ? st.rec.applied()->run_id : std::string{};
        reply.body =
          st.engine->stamp_response(it->second.call.route, reply.body, *d->stamped, reply.run_id);
        ++st.counters.requests_completed_total;
      }
      answer(self, d->id, std::move(reply));
    } else if (auto* f = std::get_if<qfx::fail>(&e)) {
      answer(self, f->id, answer_of(f->error));
    } else if (std::holds_alternative<qfx::reconcile_now>(e)) {
      reconcile_now(self, trigger::rejected_request);
    } else if (auto* p = std::get_if<qfx::commit_may_proceed>(&e)) {
      st.counters.last_drain_ms = std::chrono::duration<double, std::milli>(p->drain).count();
      run_commit(self);
    }
  }
  publish_state(self);
}

void arm_backstop(self_ptr self) {
  if (self->state.opts.backstop.count() > 0)
    self->delayed_send(self, self->state.opts.backstop, atom::tick_v);
}

/// A request from a gateway (or another node): checked, then admitted by the
/// lifecycle or refused.
caf::result<replica_answer> on_generate(self_ptr self, replica_call& call) {
  auto& st = self->state;
  // Before the promise: making it takes the sender out of the message.
  auto caller = caf::actor_cast<caf::actor>(self->current_sender());
  auto promise = self->make_response_promise<replica_answer>();
  auto refuse = [&](http_failure why, std::string message) {
    auto a = answer_of(make_http_error(why, std::move(message)));
    a.replica_id = st.opts.replica_id;
    promise.deliver(std::move(a));
    return promise;
  };
  if (st.by_key.contains({caller.address(), call.key}))
    return refuse(http_failure::bad_request,
                  "request key " + std::to_string(call.key) + " is already in flight");
  const auto kind =
    is_versioned_route(call.route) ? request_kind::versioned : request_kind::passthrough;
  if (kind == request_kind::versioned) {
    // Parsed by the surface that received it; checked again as input
    // from another node.
    if (auto ok = merge(call.c, constraint{}); !ok)
      return refuse(http_failure::bad_request, ok.error().message);
  } else if (auto why = st.engine->route_refusal(call.method, call.route)) {
    return refuse(http_failure::route_blocked, std::move(*why));
  }
  request_id id = st.lane->next_id();
  st.by_key.emplace(std::pair{caller.address(), call.key}, id);
  auto c = call.c;
  replica_state::request r;
  r.call = std::move(call);
  r.promise = promise;
  r.caller = std::move(caller);
  st.requests.emplace(id, std::move(r));
  carry(self, st.lane->arrive(id, kind, c, now_of(self)));
  return promise;
}

/// Out of rotation, draining; a second retire (the drain deadline) leaves now.
void on_retire(self_ptr self) {
  auto& st = self->state;
  if (st.lane->retiring()) {
    // The drain deadline passed (or a second retire): leave now.
    log::warn("replica", st.opts.replica_id + " leaves with "
                           + std::to_string(st.requests.size() + st.lane->unanswered())
                           + " request(s) unfinished");
    self->quit(caf::exit_reason::user_shutdown);
    return;
  }
  st.lane->retire();
  st.lane->watch_idle(true);
  const size_t running = st.requests.size() + st.lane->unanswered();
  log::info("replica", st.opts.replica_id + " retiring: out of rotation, draining "
                         + std::to_string(running) + " request(s)");
  publish_state(self);
  if (running == 0) {
    self->quit();
    return;
  }
  self->delayed_send(self, st.opts.drain_timeout, atom::retire_v, st.opts.member_token);
}

/// A watcher is told of every change of what routing depends on.
void on_subscribe(self_ptr self, replica_watcher_actor& who) {
  auto& st = self->state;
  self->monitor(who);
  // A watcher subscribing again (after a coordinator restart) is told
  // once, through the handle it sent last.
  auto same = std::find_if(st.subscribers.begin(), st.subscribers.end(),
                           [&](const auto& s) { return s.address() == who.address(); });
  if (same != st.subscribers.end())
    *same = who;
  else
    st.subscribers.push_back(who);
  caf::send_as(caf::actor_cast<caf::actor>(self), who, atom::replica_state_v, describe(st));
}

/// A lease on the served weights for a peer to read.
caf::result<peer_offer> on_offer(self_ptr self, const version_ref& version, bool frames) {
  auto& st = self->state;
  const auto& holder = frames ? st.deps.frames_holder : st.deps.holder;
  if (!holder)
    return to_caf_error(
      error{errc::not_found, st.opts.replica_id + " serves no peers (" + st.deps.transport + ")"});
  auto o = holder->lease(version);
  if (!o)
    return to_caf_error(o.error());
  return to_peer_offer(*o);
}

/// A stage ended on the reconcile worker.
void on_staged(self_ptr self, const work_report& r) {
  auto& st = self->state;
  auto outcome = status_of(self, r);
  st.last_fetch = r.fetched;
  for (const auto& [source, n] : r.fetched.from_peers)
    st.counters.bytes_from_peers_total += n;
  st.counters.delta_bytes_from_peers_total += r.fetched.peer_delta_bytes;
  if (!r.fetched.from_peers.empty() || !r.fetched.problems.empty()) {
    std::string from;
    for (const auto& [source, n] : r.fetched.from_peers)
      from += " " + source + " " + std::to_string(n >> 20) + " MiB;";
    log::info(
      "replica",
      st.opts.replica_id + " staged " + to_string(r.version)
        + " from peers:" + (from.empty() ? " none;" : from) + " store "
        + std::to_string(r.fetched.from_store >> 20) + " MiB"
        + (r.fetched.problems.empty() ? std::string{} : " (" + r.fetched.problems.front() + ")"));
  }
  if (!outcome && outcome.error().code == errc::checksum_mismatch)
    ++st.counters.checksum_failures_total;
  if (!outcome)
    log::warn("replica", st.opts.replica_id + " staging " + to_string(r.version)
                           + " failed (serving weights untouched; retried on the next "
                             "trigger): "
                           + to_string(outcome.error()));
  apply(self, st.rec.on_staged(r.op, outcome, std::chrono::nanoseconds{r.nanos}));
}

/// A commit ended on the reconcile worker.
void on_committed(self_ptr self, const work_report& r) {
  auto& st = self->state;
  if (!st.pending_commit || st.pending_commit->op != r.op)
    return;
  st.pending_commit.reset();
  auto outcome = status_of(self, r);
  auto now = now_of(self);
  if (outcome) {
    double pause =
      std::chrono::duration<double, std::micro>(std::chrono::nanoseconds{r.nanos}).count();
    st.counters.last_pause_us = pause;
    st.counters.max_pause_us = std::max(st.counters.max_pause_us, pause);
    st.lane->set_run(r.version.run_id);
    carry(self, st.lane->end_commit(r.version.version, now));
    expose_served(st, st.engine);
    apply(self, st.rec.on_committed(r.op, outcome, std::chrono::nanoseconds{r.nanos}));
    auto m = describe(st).metrics;
    char line[256];
    std::snprintf(line, sizeof line,
                  " activated %s: folded %llu, stage %.3f s, drain %.2f ms, pause %.1f us",
                  to_string(r.version).c_str(), static_cast<unsigned long long>(m.last_folded),
                  m.last_stage_s, m.last_drain_ms, pause);
    log::info("replica", st.opts.replica_id + line);
    return;
  }
  log::error("replica", st.opts.replica_id + " activating " + to_string(r.version)
                          + " failed; rebuilding the engine: " + to_string(outcome.error()));
  apply(self, st.rec.on_committed(r.op, outcome, std::chrono::nanoseconds{r.nanos}));
  // The engine's weights are uncertain: nothing may finish on them.
  carry(self, st.lane->activation_failed(now));
}

/// A rebuild of the engine ended.
void on_rebuilt(self_ptr self, const work_report& r) {
  auto& st = self->state;
  auto outcome = status_of(self, r);
  if (outcome && st.rebuilt_engine && *st.rebuilt_engine) {
    st.engine = std::move(*st.rebuilt_engine);
    st.lane->set_engine(st.engine);
    st.rebuilt_engine.reset();
    ++st.counters.rebuilds_total;
    log::info("replica", st.opts.replica_id + " rebuilt its engine at " + to_string(r.version));
    expose_served(st, st.engine);
    apply(self, st.rec.on_rebuilt(r.op, r.version));
    return;
  }
  apply(self, st.rec.on_rebuilt(
                r.op, outcome ? error{errc::engine_unavailable, "rebuild produced no engine"}
                              : outcome.error()));
}

/// The request lane left effects for the actor, or fell idle.
void on_lane_work(self_ptr self) {
  auto& st = self->state;
  carry(self, st.lane->take_left());
  if (st.profile && !st.profile->started)
    profile_progress(self);
  if (st.lane->retiring() && st.requests.empty() && st.lane->unanswered() == 0) {
    log::info("replica", st.opts.replica_id + " drained; leaving");
    self->quit();
    return;
  }
  st.lane->watch_idle(st.lane->retiring() || (st.profile && !st.profile->started));
}

/// The engine answered a request of the actor's.
void on_generated(self_ptr self, uint64_t id, replica_answer& reply, const caf::error& err,
                  const caf::optional<uint64_t>& last_token_version) {
  auto& st = self->state;
  auto it = st.requests.find(id);
  if (it == st.requests.end())
    return;
  engine_outcome outcome;
  if (err)
    outcome.failed = from_caf_error(self->system(), err);
  else
    outcome.ok = reply.status == 200;
  if (last_token_version)
    outcome.last_token_version = *last_token_version;
  it->second.reply = std::move(reply);
  carry(self, st.lane->engine_done(id, outcome, now_of(self)));
}

} // namespace replica_detail

replica_answer answer_of(const http_error& e) {
  replica_answer a;
  a.status = e.status;
  a.body = e.body();
  a.error_type = e.type;
  a.retryable = e.retryable;
  a.retry_after = e.retry_after;
  return a;
}

std::string in_rotation_refusal(const replica_info& info) {
  return info.replica_id + " is in rotation (serving pool " + info.pool + " at "
         + (info.applied ? to_string(*info.applied) : std::string{"?"})
         + "); pass --take-out to take it out for the profile (it is put back after, converged "
           "to its pool again)";
}

replica_info describe(const replica_state& st) {
  replica_info info;
  info.replica_id = st.opts.replica_id;
  info.pool = st.opts.pool;
  auto snap = st.rec.snapshot();
  const auto gate = st.lane->view();
  // Ready means admitting: caught up, in rotation, not terminally failed.
  info.ready = snap.ready && snap.terminal_error.empty() && gate.served.has_value()
               && !gate.retiring && !gate.taken_out;
  info.applied = snap.applied;
  if (snap.applied)
    info.serving = gate.served.value_or(snap.applied->version);
  info.pointer = snap.pointer;
  info.state = snap.state;
  info.reason = snap.reason;
  if (gate.retiring)
    info.reason = "retiring";
  else if (st.profile)
    info.reason = "out of rotation: profiling (its own pool is " + st.profile->home_pool + ")";
  if (info.reason.empty() && !info.ready)
    info.reason = "not ready";
  if (!snap.terminal_error.empty())
    info.terminal_error = snap.terminal_error;
  info.mode = st.opts.mode;
  info.active_requests = gate.active;
  info.queued_requests = gate.queued;
  replica_metrics m = st.counters;
  m.last_stage_s = std::chrono::duration<double>(snap.metrics.last_stage).count();
  m.last_folded = snap.metrics.last_folded;
  m.folded_versions_total = snap.metrics.folded_versions_total;
  m.activations_total = snap.metrics.commits_total;
  m.skipped_activations_total = snap.metrics.skipped_activations_total;
  m.stages_total = snap.metrics.stages_total;
  m.stage_failures_total = snap.metrics.stage_failures_total;
  m.activation_failures_total = snap.metrics.activation_failures_total;
  m.bytes_fetched_total = st.bytes ? st.bytes->bytes() : 0;
  m.bytes_from_store_total = st.bytes ? st.bytes->store_bytes() : 0;
  info.transport = st.deps.transport;
  info.version_spans = st.engine && st.engine->reports_version_spans();
  if (st.engine) {
    auto h = st.engine->health();
    info.device = st.engine->device_usage();
    info.engine = std::move(h.detail);
    info.engine_healthy = h.healthy;
    // An engine out of service (restarting, being re-synced) takes the
    // replica out of rotation until it serves the activated version again.
    if (info.ready && !h.healthy) {
      info.ready = false;
      info.reason = "engine unavailable: " + info.engine;
    }
  }
  info.last_fetch = st.last_fetch;
  m.requests_admitted_total = gate.metrics.admitted_total;
  m.requests_rejected_total = gate.metrics.rejected_total;
  m.drain_timeouts_total = gate.metrics.drain_timeouts_total;
  m.requests_completed_total += st.lane->completed_total();
  info.metrics = m;
  return info;
}

namespace replica_detail {

replica_actor::behavior_type behavior(self_ptr self);

} // namespace replica_detail

using replica_detail::arm_backstop;
using replica_detail::behavior;
using replica_detail::reconcile_now;

replica_actor::behavior_type replica_service(replica_actor::stateful_pointer<replica_state> self,
                                             replica_options opts, replica_deps deps) {
  auto& init = self->state;
  init.opts = std::move(opts);
  init.deps = std::move(deps);
  init.lane =
    init.deps.lane ? init.deps.lane : std::make_shared<request_lane>(gate_options_of(init.opts));
  init.lane->set_identity(init.opts.replica_id, init.deps.request_workers);
  init.lane->set_notify([addr = self->address()] {
    if (auto h = caf::actor_cast<replica_actor>(addr))
      send_to_itself(h, atom::lane_work_v);
  });
  init.bytes =
    std::make_shared<counting_source>(init.deps.bytes, [id = init.opts.replica_id](uint64_t total) {
      log::info("replica", id + " fetching: " + std::to_string(total >> 20) + " MiB so far");
    });
  auto made = init.deps.make_engine();
  if (!made) {
    log::error("replica",
               init.opts.replica_id + " cannot create its engine: " + to_string(made.error()));
    self->quit(to_caf_error(made.error()));
    return behavior(self);
  }
  init.engine = std::move(*made);
  init.lane->set_engine(init.engine);
  self->set_down_handler([self](const caf::down_msg& down) {
    std::erase_if(self->state.subscribers,
                  [&](const replica_watcher_actor& a) { return a.address() == down.source; });
  });
  self->send(init.deps.store, atom::subscribe_v, init.opts.pool,
             caf::actor_cast<pointer_listener_actor>(self));
  reconcile_now(self, trigger::startup);
  arm_backstop(self);
  return behavior(self);
}

namespace replica_detail {

replica_actor::behavior_type behavior(self_ptr self) {
  return {
    [self](atom::generate, replica_call& call) -> caf::result<replica_answer> {
      return on_generate(self, call);
    },
    [self](atom::cancel, uint64_t key) {
      auto& st = self->state;
      auto k = st.by_key.find({caf::actor_cast<caf::actor_addr>(self->current_sender()), key});
      if (k == st.by_key.end())
        return;
      carry(self, st.lane->cancel(k->second, now_of(self)));
    },
    [self](atom::retire, const std::string& cap) {
      if (is_member(self, cap, "a retire"))
        on_retire(self);
    },
    [self](atom::wake) { reconcile_now(self, trigger::wake); },
    [self](atom::profile, const std::string& pool, bool take_out,
           const std::string& cap) -> caf::result<replica_info> {
      if (!is_member(self, cap, "a profile"))
        return not_a_member("profiling a replica");
      return begin_profile(self, pool, take_out);
    },
    [self](atom::profile, const version_ref& target,
           const std::string& cap) -> caf::result<profile_step> {
      if (!is_member(self, cap, "a profile step"))
        return not_a_member("profiling a replica");
      return begin_step(self, target);
    },
    [self](atom::profile, uint64_t step, profile_step& out) {
      if (from_itself(self))
        step_judged(self, step, out);
    },
    [self](atom::profile, atom::tick, uint64_t lease) {
      if (from_itself(self))
        lease_ran_out(self, lease);
    },
    [self](atom::profile, atom::done, const std::string& cap) -> caf::result<replica_info> {
      if (!is_member(self, cap, "the end of a profile"))
        return not_a_member("profiling a replica");
      return end_profile(self);
    },
    [self](atom::server_info) -> replica_info { return describe(self->state); },
    [self](atom::subscribe, replica_watcher_actor& who) { on_subscribe(self, who); },
    [self](atom::offer, const version_ref& version, bool frames,
           const std::string& cap) -> caf::result<peer_offer> {
      // The offer names registered memory and its remote keys.
      if (!is_member(self, cap, "a peer's offer request"))
        return not_a_member("reading a version from a peer");
      return on_offer(self, version, frames);
    },
    [self](atom::release, uint64_t lease) {
      // Lease ids are unique in the process: only the holder that gave it
      // knows it.
      for (const auto& h : {self->state.deps.holder, self->state.deps.frames_holder})
        if (h)
          h->release(lease);
    },
    [self](atom::pointer_moved, const std::string& pool, const pointer_record&) {
      if (pool == self->state.opts.pool)
        reconcile_now(self, trigger::wake);
    },
    // Internal: timers and the workers' reports come from the actor itself
    // (`send_to_itself`); the same message from anyone else is dropped.
    [self](atom::tick) {
      if (!from_itself(self))
        return;
      reconcile_now(self, trigger::backstop);
      arm_backstop(self);
    },
    [self](atom::drain_check) {
      auto& st = self->state;
      if (!from_itself(self))
        return;
      st.drain_timer_armed = false;
      carry(self, st.lane->tick(now_of(self)));
      arm_drain_timer(self);
    },
    [self](atom::staged, const work_report& r) {
      if (from_itself(self))
        on_staged(self, r);
    },
    [self](atom::committed, const work_report& r) {
      if (from_itself(self))
        on_committed(self, r);
    },
    [self](atom::rebuilt, const work_report& r) {
      if (from_itself(self))
        on_rebuilt(self, r);
    },
    [self](atom::lane_work) {
      if (from_itself(self))
        on_lane_work(self);
    },
    [self](atom::generated, uint64_t id, replica_answer& reply, caf::error& err,
           const caf::optional<uint64_t>& last_token_version) {
      if (from_itself(self))
        on_generated(self, id, reply, err, last_token_version);
    },
  };
}

} // namespace replica_detail

} // namespace stitch
