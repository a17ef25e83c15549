// The replica's side of `stitch profile`: taken out of rotation, it follows
// a scratch pool step by step, each step judged against the manifest, and
// goes home when done or when no step comes for its lease.

#include <caf/all.hpp>

#include <algorithm>

#include "actors/credentials.hpp"
#include "actors/log.hpp"
#include "actors/replica_internal.hpp"
#include "gpu/checksum.hpp"
#include "runtime/core/checksum.hpp"

namespace stitch::replica_detail {

namespace {

caf::error profile_refusal(errc code, std::string message) {
  return to_caf_error(error{code, std::move(message)});
}

/// The checksum verdict on what the engine serves after a profile step: its
/// every tensor hashed against `target`'s manifest when its weights are in
/// host memory; otherwise what the stage verified.
void judge_served(profile_step& out, engine_port& engine, tensor_source& bytes) {
  auto view = engine.host_view();
  if (!view) {
    out.checksum_basis = "staged tensors";
    out.checksum_ok = true;
    out.checksum_detail = "the engine's weights are not readable from the host; every tensor "
                          "the stage wrote was verified against the manifest before activation";
    return;
  }
  out.checksum_basis = "served weights";
  if (view->version != out.target) {
    out.checksum_detail = "the engine serves " + to_string(view->version);
    return;
  }
  auto m = bytes.manifest_of(out.target);
  if (!m) {
    out.checksum_detail = "reading the manifest failed: " + to_string(m.error());
    return;
  }
  uint64_t hashed = 0;
  for (const auto& t : view->tensors) {
    auto expected = m->checksums.find(t.name);
    if (expected == m->checksums.end()) {
      out.checksum_detail = "the engine serves tensor '" + t.name + "', which the manifest lacks";
      return;
    }
    if (uint64_t got = gpu::parallel_tree_checksum(t.bytes); got != expected->second) {
      out.checksum_detail = "tensor '" + t.name + "' has checksum " + checksum::to_hex(got)
                            + " but the manifest says " + checksum::to_hex(expected->second);
      return;
    }
    hashed += t.bytes.size();
  }
  if (view->tensors.size() != m->checksums.size()) {
    out.checksum_detail = "the engine serves " + std::to_string(view->tensors.size())
                          + " tensors; the manifest has " + std::to_string(m->checksums.size());
    return;
  }
  out.checksum_ok = true;
  out.checksum_detail =
    std::to_string(view->tensors.size()) + " tensors, " + std::to_string(hashed) + " bytes hashed";
}

/// A profile step's pass ended: what it did, then the verdict (on the
/// worker, after whatever the pass posted there).
void finish_step(self_ptr self) {
  auto& st = self->state;
  auto& r = *st.profile->running;
  const auto& applied = st.rec.applied();
  if (!applied || *applied != r.target) {
    auto why = st.rec.snapshot().reason;
    r.promise.deliver(profile_refusal(errc::engine_unavailable,
                                      st.opts.replica_id + " did not reach " + to_string(r.target)
                                        + "; it serves "
                                        + (applied ? to_string(*applied) : std::string{"nothing"})
                                        + (why.empty() ? std::string{} : " (" + why + ")")));
    st.profile->running.reset();
    return;
  }
  const auto& m = st.rec.metrics();
  profile_step out;
  out.target = r.target;
  out.from = r.from;
  out.activated = m.commits_total > r.before.commits_total;
  if (out.activated || m.skipped_activations_total > r.before.skipped_activations_total)
    out.folded = m.last_folded;
  out.reset = out.activated && r.from && r.from->run_id != r.target.run_id;
  if (m.stages_total > r.before.stages_total) {
    out.stage_s = std::chrono::duration<double>(m.last_stage).count();
    out.fetch_s = st.last_fetch.fetch_s;
    out.decode_s = st.last_fetch.decode_s;
    out.verify_s = st.last_fetch.verify_s;
    out.rest_s = std::max(0.0, out.stage_s - out.fetch_s - out.decode_s - out.verify_s);
  }
  if (out.activated) {
    out.drain_ms = st.counters.last_drain_ms;
    out.pause_us = st.counters.last_pause_us;
    if (auto load = st.engine->last_load()) {
      out.load_kind = load->kind;
      out.load_detail = load->detail;
      out.load_tensors = load->tensors;
      out.load_bytes = load->bytes;
      out.load_s = load->seconds;
    }
  }
  out.total_s = std::chrono::duration<double>(since(r.began)).count();
  auto moved = fetched_between(r.bytes_before, st.bytes->snapshot());
  out.bytes_from_store = moved.from_store;
  for (const auto& [source, n] : moved.from_peers)
    out.bytes_from_peers += n;
  r.verifying = true;
  st.deps.reconcile_worker->post([handle = caf::actor_cast<replica_actor>(self), engine = st.engine,
                                  bytes = st.bytes, id = r.id, out = std::move(out)]() mutable {
    judge_served(out, *engine, *bytes);
    send_to_itself(handle, atom::profile_v, id, std::move(out));
  });
}

} // namespace

/// Moves a profile on whenever the replica may have become quiet: the
/// begin once nothing runs, a step once its pass ended, the way home.
void profile_progress(self_ptr self) {
  auto& st = self->state;
  if (!st.profile)
    return;
  auto& p = *st.profile;
  const bool quiet = !st.rec.busy() && !st.pending_commit;
  if (!p.started) {
    if (!p.begin || !st.requests.empty() || st.lane->unanswered() > 0 || !quiet)
      return;
    auto promise = std::move(*p.begin);
    p.begin.reset();
    if (auto ok = st.rec.retarget(true); !ok) {
      st.lane->put_back();
      st.profile.reset();
      promise.deliver(to_caf_error(ok.error()));
      return;
    }
    st.opts.pool = p.pool;
    st.bytes->retarget(st.deps.source_for(p.pool));
    p.started = true;
    log::info("replica", st.opts.replica_id + " follows scratch pool " + p.pool
                           + " for a profile (out of rotation)");
    renew_lease(self);
    promise.deliver(describe(st));
    return;
  }
  if (p.ending) {
    if (!quiet || p.running)
      return;
    if (!p.returned) {
      p.returned = true;
      (void) st.rec.retarget(false);
      st.opts.pool = p.home_pool;
      st.bytes->retarget(st.deps.source_for(p.home_pool));
      // Nothing is admitted on the scratch weights: serving resumes when a
      // pass catches up with the replica's own pool.
      st.lane->stop_serving("returning to pool " + p.home_pool + " after a profile");
      st.lane->put_back();
      log::info("replica", st.opts.replica_id + " returns to pool " + p.home_pool);
      apply(self, st.rec.on_trigger(trigger::wake));
      return;
    }
    auto promise = std::move(p.end);
    st.profile.reset();
    if (promise)
      promise->deliver(describe(st));
    return;
  }
  if (p.running && !p.running->verifying && quiet)
    finish_step(self);
}

/// Renews the profile's lease: it runs out `profile_lease` from now unless
/// a step renews it again.
void renew_lease(self_ptr self) {
  auto& st = self->state;
  if (!st.profile || st.opts.profile_lease.count() <= 0)
    return;
  self->delayed_send(self, st.opts.profile_lease, atom::profile_v, atom::tick_v,
                     ++st.profile->lease);
}

/// Takes the replica out of rotation to follow scratch pool `pool` once it is
/// quiet (answered then).
caf::result<replica_info> begin_profile(self_ptr self, const std::string& pool, bool take_out) {
  auto& st = self->state;
  const auto& id = st.opts.replica_id;
  if (st.profile)
    return profile_refusal(errc::conflict, id + " is being profiled already");
  if (st.lane->retiring())
    return profile_refusal(errc::engine_unavailable, id + " is retiring");
  if (st.rec.terminal())
    return profile_refusal(errc::engine_unavailable,
                           id + " has a failed engine: " + st.rec.snapshot().terminal_error);
  if (!st.deps.source_for)
    return profile_refusal(errc::invalid_argument,
                           id + " cannot read another pool's bytes, so it cannot be profiled");
  if (pool.empty() || pool == st.opts.pool)
    return profile_refusal(errc::invalid_argument,
                           "the scratch pool must be named and differ from the replica's own");
  if (auto info = describe(st); info.ready && !take_out)
    return profile_refusal(errc::conflict, in_rotation_refusal(info));
  st.lane->take_out("out of rotation: profiling");
  st.lane->watch_idle(true);
  auto promise = self->make_response_promise<replica_info>();
  auto& p = st.profile.emplace();
  p.home_pool = st.opts.pool;
  p.pool = pool;
  p.begin = promise;
  log::info("replica", id + " taken out of rotation for a profile; draining "
                         + std::to_string(st.requests.size()) + " request(s)");
  publish_state(self);
  profile_progress(self);
  return promise;
}

/// One profile step: a pass to `target`, answered when it ended and was judged.
caf::result<profile_step> begin_step(self_ptr self, const version_ref& target) {
  auto& st = self->state;
  if (!st.profile || !st.profile->started || st.profile->ending)
    return profile_refusal(errc::invalid_argument,
                           st.opts.replica_id + " is not following a scratch pool");
  if (st.profile->running)
    return profile_refusal(errc::conflict, "a profile step is running already");
  auto& r = st.profile->running.emplace();
  r.id = ++st.profile->steps;
  r.promise = self->make_response_promise<profile_step>();
  r.target = target;
  r.from = st.rec.applied();
  r.began = std::chrono::steady_clock::now();
  r.before = st.rec.metrics();
  r.bytes_before = st.bytes->snapshot();
  auto promise = r.promise;
  apply(self, st.rec.on_trigger(trigger::wake));
  return promise;
}

/// The worker judged step `step`: its answer goes out, the lease is renewed.
void step_judged(self_ptr self, uint64_t step, profile_step& out) {
  auto& p = self->state.profile;
  if (!p || !p->running || p->running->id != step)
    return;
  auto promise = std::move(p->running->promise);
  p->running.reset();
  renew_lease(self);
  promise.deliver(std::move(out));
}

/// No step came for `profile_lease`: the profile is abandoned, the replica goes home.
void lease_ran_out(self_ptr self, uint64_t lease) {
  auto& st = self->state;
  auto& p = st.profile;
  if (!p || !p->started || p->ending || p->running || p->lease != lease)
    return;
  log::warn("replica", st.opts.replica_id + " profile abandoned (no step for "
                         + std::to_string(st.opts.profile_lease.count() / 1000)
                         + " s); back to pool " + p->home_pool);
  p->ending = true;
  profile_progress(self);
  publish_state(self);
}

/// Ends a profile: back to the home pool, answered once there.
caf::result<replica_info> end_profile(self_ptr self) {
  auto& st = self->state;
  if (!st.profile || st.profile->ending)
    return profile_refusal(errc::invalid_argument, st.opts.replica_id + " is not being profiled");
  auto promise = self->make_response_promise<replica_info>();
  if (!st.profile->started) {
    // Still draining for the begin: call it off.
    if (st.profile->begin)
      st.profile->begin->deliver(
        profile_refusal(errc::engine_unavailable, "the profile was called off"));
    st.profile.reset();
    st.lane->put_back();
    promise.deliver(describe(st));
    publish_state(self);
    return promise;
  }
  st.profile->ending = true;
  st.profile->end = promise;
  profile_progress(self);
  publish_state(self);
  return promise;
}

} // namespace stitch::replica_detail
