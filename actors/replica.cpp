#include "actors/replica.hpp"

#include <caf/all.hpp>

#include <algorithm>

#include "actors/log.hpp"
#include "runtime/core/constraint.hpp"
#include "runtime/core/manifest.hpp"

namespace stitch {

namespace {

using self_ptr = replica_actor::stateful_pointer<replica_state>;
namespace rfx = reconcile_effects;
namespace gfx = gate_effects;

clock_time now_of(self_ptr self) {
  return std::chrono::duration_cast<clock_time>(self->clock().now().time_since_epoch());
}

work_report report_of(uint64_t op, const status& outcome, std::chrono::nanoseconds took) {
  work_report r;
  r.op = op;
  r.nanos = took.count();
  if (!outcome) {
    r.code = static_cast<uint8_t>(outcome.error().code);
    r.message = outcome.error().message;
  }
  return r;
}

status status_of(const work_report& r) {
  if (r.code == 0)
    return {};
  return error{static_cast<errc>(r.code), r.message};
}

std::chrono::nanoseconds since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::steady_clock::now() - t0;
}

replica_answer failure(uint16_t http, std::string type, const std::string& message,
                       bool retryable) {
  replica_answer r;
  r.status = http;
  r.body = error_json(type, message, retryable);
  r.error_type = std::move(type);
  r.retryable = retryable;
  if (retryable && (http == 409 || http == 503))
    r.retry_after = 1;
  return r;
}

replica_answer unavailable_reply(const std::string& reason) {
  return failure(503, "EngineUnavailable", reason, true);
}

replica_answer conflict_reply(const rejection& body) {
  replica_answer r;
  r.status = 409;
  r.body = rejection_json(body);
  r.error_type = "WeightVersionNotReady";
  r.retryable = body.retryable;
  r.retry_after = body.retryable ? 1 : 0;
  r.applied = body.applied ? static_cast<int64_t>(*body.applied) : -1;
  return r;
}

/// The engine's answer (stamps are added by the actor).
replica_answer answer_of(result<engine_reply> out) {
  if (!out) {
    const auto& e = out.error();
    switch (e.code) {
      case errc::invalid_argument:
      case errc::limit_exceeded: return failure(400, "BadRequest", e.message, false);
      case errc::engine_unavailable: return unavailable_reply(e.message);
      default: return failure(500, "EngineError", to_string(e), true);
    }
  }
  replica_answer r;
  r.status = out->status;
  r.content_type = std::move(out->content_type);
  r.body = std::move(out->body);
  r.stream = out->stream;
  return r;
}

/// The call's constraint; bad values are refused naming the field.
result<constraint> constraint_of(const replica_call& call) {
  auto bound = [](int64_t v, const char* name) -> result<std::optional<uint64_t>> {
    if (v == -1)
      return std::optional<uint64_t>{};
    if (v < 0)
      return make_error(errc::invalid_argument,
                        std::string{"weight_version."} + name + " must not be negative");
    return std::optional<uint64_t>{static_cast<uint64_t>(v)};
  };
  constraint c;
  auto min = bound(call.min_version, "min_version");
  if (!min)
    return std::move(min).error();
  auto exact = bound(call.exact_version, "exact_version");
  if (!exact)
    return std::move(exact).error();
  c.min_version = *min;
  c.exact_version = *exact;
  if (c.min_version && c.exact_version && *c.exact_version < *c.min_version)
    return make_error(errc::invalid_argument,
                      "weight_version.exact_version is below weight_version.min_version");
  return c;
}

bool blocked(const std::vector<std::string>& routes, std::string_view route) {
  return std::find(routes.begin(), routes.end(), route) != routes.end();
}

void apply(self_ptr self, std::vector<reconcile_effect> effects);
void apply_gate(self_ptr self, std::vector<gate_effect> effects);

void answer(self_ptr self, request_id id, replica_answer reply) {
  reply.replica_id = self->state.opts.replica_id;
  auto& st = self->state;
  auto it = st.requests.find(id);
  if (it == st.requests.end())
    return;
  it->second.promise.deliver(std::move(reply));
  st.by_key.erase({it->second.caller.address(), it->second.call.key});
  st.requests.erase(it);
  // A retiring replica leaves with its last answer, whichever path gave it.
  if (st.retiring && st.requests.empty()) {
    log::info("replica", st.opts.replica_id + " drained; leaving");
    self->quit();
  }
}

void reconcile_now(self_ptr self, trigger why) {
  apply(self, self->state.rec.on_trigger(why));
}

void start_generation(self_ptr self, request_id id) {
  auto& st = self->state;
  auto it = st.requests.find(id);
  if (it == st.requests.end())
    return;
  auto& r = it->second;
  r.running = true;
  engine_call call;
  call.id = id;
  call.tag = st.opts.replica_id + "-" + std::to_string(id);
  call.method = r.call.method;
  call.route = r.call.route;
  call.body = r.call.body;
  std::optional<version_ref> served;
  if (r.gated && st.rec.applied() && st.gate.served_version())
    served = version_ref{st.rec.applied()->run_id, *st.gate.served_version()};
  auto handle = caf::actor_cast<replica_actor>(self);
  st.deps.request_workers->post([handle, id, engine = st.engine, call = std::move(call), served,
                                 caller = r.caller, key = r.call.key,
                                 cancelled = r.cancelled]() mutable {
    if (served)
      call.body = engine->stamp_request(call.route, call.body, *served);
    event_sink sink;
    if (caller)
      sink = [&](std::string ev) { caf::anon_send(caller, atom::event_v, key, std::move(ev)); };
    auto out = engine->forward(call, sink, [&] { return cancelled->load(); });
    caf::anon_send(handle, atom::generated_v, id, answer_of(std::move(out)));
  });
}

void arm_drain_timer(self_ptr self) {
  auto& st = self->state;
  auto deadline = st.gate.drain_deadline();
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
    caf::anon_send(handle, atom::committed_v, std::move(report));
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
        caf::anon_send(handle, atom::rebuilt_v, std::move(report));
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
    status outcome = engine->prefetch(e.plan);
    if (outcome)
      outcome = engine->stage(e.plan, e.onto_shadow, *bytes);
    auto report = report_of(e.op, outcome, since(t0));
    report.version = e.plan.target;
    caf::anon_send(handle, atom::staged_v, std::move(report));
  });
}

void carry_out(self_ptr self, rfx::commit e) {
  auto& st = self->state;
  st.pending_commit = e;
  apply_gate(self, st.gate.begin_commit(st.opts.mode, e.drain_all, now_of(self)));
  arm_drain_timer(self);
}

void carry_out(self_ptr self, rfx::advance e) {
  auto& st = self->state;
  if (auto ok = st.gate.advance(e.target.version); !ok)
    log::warn("replica", st.opts.replica_id + " cannot advance to " + to_string(e.target) + ": "
                           + to_string(ok.error()));
  else
    log::info("replica", st.opts.replica_id + " advanced to " + to_string(e.target)
                           + " (the tail changes no weights: no activation)");
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
  self->state.gate.stop_serving(e.reason);
}

void carry_out(self_ptr self, rfx::enter_rotation e) {
  log::info("replica", self->state.opts.replica_id + " enters rotation at " + to_string(e.version));
  auto& gate = self->state.gate;
  if (gate.open())
    gate.serve(e.version.version);
}

/// Tells subscribers when what routing depends on changed.
void publish_state(self_ptr self) {
  auto& st = self->state;
  if (st.subscribers.empty())
    return;
  auto info = describe(st);
  std::string key = std::to_string(info.ready) + "|" + info.applied + "|"
                    + std::to_string(info.applied_version) + "|" + info.sync_state + "|"
                    + info.reason + "|" + info.terminal_error;
  if (key == st.last_published)
    return;
  st.last_published = std::move(key);
  for (const auto& s : st.subscribers)
    caf::send_as(caf::actor_cast<caf::actor>(self), s, atom::replica_state_v, info);
}

void apply(self_ptr self, std::vector<reconcile_effect> effects) {
  for (auto& e : effects)
    std::visit([self](auto& x) { carry_out(self, std::move(x)); }, e);
  publish_state(self);
}

void apply_gate(self_ptr self, std::vector<gate_effect> effects) {
  auto& st = self->state;
  for (auto& e : effects) {
    if (auto* a = std::get_if<gfx::admit>(&e)) {
      start_generation(self, a->id);
    } else if (auto* r = std::get_if<gfx::reject>(&e)) {
      answer(self, r->id, conflict_reply(r->body));
      reconcile_now(self, trigger::rejected_request);
    } else if (auto* f = std::get_if<gfx::refuse>(&e)) {
      answer(self, f->id, unavailable_reply(f->reason));
    } else if (auto* x = std::get_if<gfx::abort_request>(&e)) {
      if (auto it = st.requests.find(x->id); it != st.requests.end()) {
        it->second.aborted_for_drain = true;
        it->second.cancelled->store(true);
      }
      ++st.counters.drain_timeouts_total;
    } else if (auto* p = std::get_if<gfx::commit_may_proceed>(&e)) {
      st.counters.last_drain_ms = std::chrono::duration<double, std::milli>(p->drain).count();
      run_commit(self);
    }
  }
  publish_state(self);
}

/// The engine's weights are uncertain: nothing may finish on them.
void abort_running(self_ptr self) {
  for (auto& [id, r] : self->state.requests)
    if (r.running) {
      r.engine_failed = true;
      r.cancelled->store(true);
    }
}

void arm_backstop(self_ptr self) {
  if (self->state.opts.backstop.count() > 0)
    self->delayed_send(self, self->state.opts.backstop, atom::tick_v);
}

} // namespace

replica_info describe(const replica_state& st) {
  replica_info info;
  info.replica_id = st.opts.replica_id;
  info.pool = st.opts.pool;
  auto snap = st.rec.snapshot();
  // Ready means admitting: caught up, in rotation, not terminally failed.
  info.ready = snap.ready && snap.terminal_error.empty() && st.gate.served_version().has_value()
               && !st.retiring;
  if (snap.applied) {
    info.applied = to_string(*snap.applied);
    info.run_id = snap.applied->run_id;
    info.applied_version =
      static_cast<int64_t>(st.gate.served_version().value_or(snap.applied->version));
  }
  if (snap.pointer)
    info.pointer = to_string(*snap.pointer);
  info.sync_state = std::string{to_string(snap.state)};
  info.reason = snap.reason;
  if (st.retiring)
    info.reason = "retiring";
  if (info.reason.empty() && !info.ready)
    info.reason = "not ready";
  info.terminal_error = snap.terminal_error;
  info.commit_mode = std::string{to_string(st.opts.mode)};
  info.active_requests = st.gate.active_requests();
  info.queued_requests = st.gate.queued_requests();
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
  m.requests_admitted_total = st.gate.metrics().admitted_total;
  m.requests_rejected_total = st.gate.metrics().rejected_total;
  info.metrics = m;
  return info;
}

namespace {

replica_actor::behavior_type behavior(self_ptr self);

} // namespace

replica_actor::behavior_type replica_service(replica_actor::stateful_pointer<replica_state> self,
                                             replica_options opts, replica_deps deps) {
  auto& init = self->state;
  init.opts = std::move(opts);
  init.deps = std::move(deps);
  init.gate = admission_gate{admission_gate::options{
    std::chrono::duration_cast<clock_time>(init.opts.drain_timeout), init.opts.max_queued}};
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
  self->set_down_handler([self](const caf::down_msg& down) {
    std::erase_if(self->state.subscribers,
                  [&](const caf::actor& a) { return a.address() == down.source; });
  });
  self->attach_functor([self] {
    // Generations still running stop at their next step.
    for (auto& [id, r] : self->state.requests)
      r.cancelled->store(true);
  });
  self->send(init.deps.store, atom::subscribe_v, init.opts.pool,
             caf::actor_cast<pointer_listener_actor>(self));
  reconcile_now(self, trigger::startup);
  arm_backstop(self);
  return behavior(self);
}

namespace {

replica_actor::behavior_type behavior(self_ptr self) {
  return {
    [self](atom::generate, replica_call& call) -> caf::result<replica_answer> {
      auto& st = self->state;
      // Before the promise: making it takes the sender out of the message.
      auto caller = caf::actor_cast<caf::actor>(self->current_sender());
      auto promise = self->make_response_promise<replica_answer>();
      auto refuse = [&](replica_answer a) {
        a.replica_id = st.opts.replica_id;
        promise.deliver(std::move(a));
        return promise;
      };
      if (st.by_key.contains({caller.address(), call.key}))
        return refuse(failure(400, "BadRequest",
                              "request key " + std::to_string(call.key) + " is already in flight",
                              false));
      if (st.retiring)
        return refuse(unavailable_reply("replica " + st.opts.replica_id
                                        + " is retiring (draining before it leaves); retry"));
      const bool versioned = is_versioned_route(call.route);
      constraint c;
      if (versioned) {
        auto parsed = constraint_of(call);
        if (!parsed)
          return refuse(failure(400, "BadRequest", parsed.error().message, false));
        c = *parsed;
      } else if (blocked(st.engine->blocked_routes(), call.route)) {
        return refuse(failure(403, "RouteBlocked",
                              "route " + call.route + " controls the engine; Stitch owns it",
                              false));
      }
      request_id id = st.next_id++;
      st.by_key.emplace(std::pair{caller.address(), call.key}, id);
      replica_state::request r;
      r.call = std::move(call);
      r.promise = promise;
      r.gated = versioned;
      r.caller = std::move(caller);
      st.requests.emplace(id, std::move(r));
      if (!versioned) {
        start_generation(self, id);
        return promise;
      }
      auto decision = st.gate.admit(id, c, now_of(self));
      if (std::holds_alternative<admitted>(decision)) {
        start_generation(self, id);
      } else if (auto* no = std::get_if<rejected>(&decision)) {
        answer(self, id, conflict_reply(no->body));
        reconcile_now(self, trigger::rejected_request);
      } else if (auto* down = std::get_if<unavailable>(&decision)) {
        answer(self, id, unavailable_reply(down->reason));
      }
      // queued: decided when the gate reopens.
      return promise;
    },
    [self](atom::cancel, uint64_t key) {
      auto& st = self->state;
      auto k = st.by_key.find({caf::actor_cast<caf::actor_addr>(self->current_sender()), key});
      if (k == st.by_key.end())
        return;
      auto id = k->second;
      auto& r = st.requests.at(id);
      r.cancelled_by_client = true;
      r.cancelled->store(true);
      if (!r.running) {
        // Still queued behind a commit: it never started.
        auto [stamped, effects] = st.gate.finish(id, now_of(self));
        answer(self, id, failure(499, "ClientClosedRequest", "the client went away", false));
        apply_gate(self, std::move(effects));
      }
    },
    [self](atom::retire) {
      auto& st = self->state;
      if (st.retiring) {
        // The drain deadline passed (or a second retire): leave now.
        log::warn("replica", st.opts.replica_id + " leaves with "
                               + std::to_string(st.requests.size()) + " request(s) unfinished");
        self->quit(caf::exit_reason::user_shutdown);
        return;
      }
      st.retiring = true;
      log::info("replica", st.opts.replica_id + " retiring: out of rotation, draining "
                             + std::to_string(st.requests.size()) + " request(s)");
      publish_state(self);
      if (st.requests.empty()) {
        self->quit();
        return;
      }
      self->delayed_send(self, st.opts.drain_timeout, atom::retire_v);
    },
    [self](atom::wake) { reconcile_now(self, trigger::wake); },
    [self](atom::server_info) -> replica_info { return describe(self->state); },
    [self](atom::subscribe, caf::actor& who) {
      auto& st = self->state;
      self->monitor(who);
      st.subscribers.push_back(who);
      caf::send_as(caf::actor_cast<caf::actor>(self), who, atom::replica_state_v, describe(st));
    },
    [self](atom::pointer_moved, const std::string& pool, const pointer_record&) {
      if (pool == self->state.opts.pool)
        reconcile_now(self, trigger::wake);
    },
    [self](atom::tick) {
      reconcile_now(self, trigger::backstop);
      arm_backstop(self);
    },
    [self](atom::drain_check) {
      auto& st = self->state;
      st.drain_timer_armed = false;
      apply_gate(self, st.gate.tick(now_of(self)));
      arm_drain_timer(self);
    },
    [self](atom::staged, const work_report& r) {
      auto& st = self->state;
      auto outcome = status_of(r);
      if (!outcome && outcome.error().code == errc::checksum_mismatch)
        ++st.counters.checksum_failures_total;
      if (!outcome)
        log::warn("replica", st.opts.replica_id + " staging " + to_string(r.version)
                               + " failed (serving weights untouched; retried on the next "
                                 "trigger): "
                               + to_string(outcome.error()));
      apply(self, st.rec.on_staged(r.op, outcome, std::chrono::nanoseconds{r.nanos}));
    },
    [self](atom::committed, const work_report& r) {
      auto& st = self->state;
      if (!st.pending_commit || st.pending_commit->op != r.op)
        return;
      st.pending_commit.reset();
      auto outcome = status_of(r);
      auto now = now_of(self);
      if (outcome) {
        double pause =
          std::chrono::duration<double, std::micro>(std::chrono::nanoseconds{r.nanos}).count();
        st.counters.last_pause_us = pause;
        st.counters.max_pause_us = std::max(st.counters.max_pause_us, pause);
        apply_gate(self, st.gate.end_commit(r.version.version, now));
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
      abort_running(self);
      apply(self, st.rec.on_committed(r.op, outcome, std::chrono::nanoseconds{r.nanos}));
      apply_gate(self, st.gate.abort_commit(now));
    },
    [self](atom::rebuilt, const work_report& r) {
      auto& st = self->state;
      auto outcome = status_of(r);
      if (outcome && st.rebuilt_engine && *st.rebuilt_engine) {
        st.engine = std::move(*st.rebuilt_engine);
        st.rebuilt_engine.reset();
        ++st.counters.rebuilds_total;
        log::info("replica", st.opts.replica_id + " rebuilt its engine at " + to_string(r.version));
        apply(self, st.rec.on_rebuilt(r.op, r.version));
        return;
      }
      apply(self, st.rec.on_rebuilt(
                    r.op, outcome ? error{errc::engine_unavailable, "rebuild produced no engine"}
                                  : outcome.error()));
    },
    [self](atom::generated, uint64_t id, replica_answer& reply) {
      auto& st = self->state;
      auto it = st.requests.find(id);
      if (it == st.requests.end())
        return;
      const auto& r = it->second;
      if (!r.gated) {
        answer(self, id,
               r.cancelled_by_client
                 ? failure(499, "ClientClosedRequest", "the client went away", false)
                 : std::move(reply));
        return;
      }
      auto [stamped, effects] = st.gate.finish(id, now_of(self));
      if (r.engine_failed) {
        reply = unavailable_reply("the engine failed while activating new weights; retry");
      } else if (r.aborted_for_drain) {
        reply =
          failure(503, "DrainTimeout",
                  "aborted: the request held a weight update past replica.drain_timeout", true);
      } else if (r.cancelled_by_client) {
        reply = failure(499, "ClientClosedRequest", "the client went away", false);
      } else if (reply.status == 200) {
        if (!stamped) {
          reply = unavailable_reply("the request lost its admission; retry");
        } else {
          reply.stamped = true;
          reply.weight_version_start = stamped->start;
          reply.weight_version_end = stamped->end;
          reply.run_id = st.rec.applied() ? st.rec.applied()->run_id : std::string{};
          reply.body = st.engine->stamp_response(r.call.route, reply.body, *stamped, reply.run_id);
          ++st.counters.requests_completed_total;
        }
      }
      answer(self, id, std::move(reply));
      apply_gate(self, std::move(effects));
    },
  };
}

} // namespace

} // namespace stitch
