#include "actors/request_lane.hpp"

#include <algorithm>

#include "actors/http_front.hpp"
#include "actors/replica.hpp"

namespace stitch {

namespace qfx = request_effects;

namespace {

/// The lifecycle's clock: the steady clock, as the actor's (CAF's
/// `actor_clock` is the steady clock).
clock_time lane_now() {
  return std::chrono::duration_cast<clock_time>(
    std::chrono::steady_clock::now().time_since_epoch());
}

} // namespace

admission_gate::options gate_options_of(const replica_options& o) {
  return admission_gate::options{std::chrono::duration_cast<clock_time>(o.drain_timeout),
                                 o.max_queued};
}

request_lane::request_lane(admission_gate::options opts) : life_(opts) {}

void request_lane::set_engine(std::shared_ptr<engine_port> engine) {
  std::lock_guard lock{mutex_};
  engine_ = std::move(engine);
}

void request_lane::set_run(std::string run_id) {
  std::lock_guard lock{mutex_};
  run_id_ = std::move(run_id);
}

void request_lane::set_identity(std::string replica_id, std::shared_ptr<executor> workers) {
  std::lock_guard lock{mutex_};
  replica_id_ = std::move(replica_id);
  workers_ = std::move(workers);
}

void request_lane::set_notify(std::function<void()> notify) {
  std::lock_guard lock{mutex_};
  notify_ = std::move(notify);
}

std::vector<request_effect> request_lane::take_left() {
  std::lock_guard lock{mutex_};
  return std::exchange(left_, {});
}

bool request_lane::owns(request_id id) const {
  std::lock_guard lock{mutex_};
  return requests_.contains(id);
}

size_t request_lane::unanswered() const {
  std::lock_guard lock{mutex_};
  return requests_.size();
}

void request_lane::detach() {
  std::lock_guard lock{mutex_};
  for (auto& [id, r] : requests_)
    r.cancelled->store(true);
  notify_ = {};
  left_.clear();
}

bool request_lane::ready() const {
  std::lock_guard lock{mutex_};
  return engine_ && workers_;
}

void request_lane::submit(request_kind kind, const constraint& c, std::string method,
                          std::string route, std::string body,
                          std::shared_ptr<transport::http_responder> out) {
  std::shared_ptr<engine_port> engine;
  std::string replica_id;
  {
    std::lock_guard lock{mutex_};
    engine = engine_;
    replica_id = replica_id_;
  }
  if (auto why =
        kind == request_kind::passthrough ? engine->route_refusal(method, route) : std::nullopt) {
    auto a = answer_of(make_http_error(http_failure::route_blocked, std::move(*why)));
    a.replica_id = replica_id;
    deliver(a, *out, false);
    return;
  }
  const request_id id = next_id();
  {
    std::lock_guard lock{mutex_};
    request r;
    r.method = std::move(method);
    r.route = std::move(route);
    r.body = std::move(body);
    r.out = out;
    requests_.emplace(id, std::move(r));
  }
  // On the server's thread, once: the lifecycle decides what a client that
  // went away gets (its engine request stopped, or its place in the queue).
  out->on_disconnect([weak = weak_from_this(), id] {
    auto self = weak.lock();
    if (!self)
      return;
    std::vector<request_effect> effects;
    {
      std::lock_guard lock{self->mutex_};
      if (!self->requests_.contains(id))
        return;
      effects = self->life_.cancel(id, lane_now());
    }
    self->carry(std::move(effects));
  });
  std::vector<request_effect> effects;
  {
    std::lock_guard lock{mutex_};
    effects = life_.arrive(id, kind, c, lane_now());
  }
  carry(std::move(effects));
}

void request_lane::carry(std::vector<request_effect> effects, std::vector<request_effect>* others) {
  std::vector<request_effect> left;
  for (auto& e : effects) {
    auto id = request_of(e);
    if (!id || !owns(*id)) {
      left.push_back(std::move(e));
      continue;
    }
    if (auto* a = std::get_if<qfx::start>(&e)) {
      start(a->id, a->served);
    } else if (auto* x = std::get_if<qfx::stop>(&e)) {
      std::lock_guard lock{mutex_};
      if (auto it = requests_.find(x->id); it != requests_.end())
        it->second.cancelled->store(true);
    } else if (auto* d = std::get_if<qfx::deliver>(&e)) {
      answer(d->id, d->stamped, nullptr);
    } else if (auto* f = std::get_if<qfx::fail>(&e)) {
      answer(f->id, std::nullopt, &f->error);
    }
  }
  if (others)
    std::move(left.begin(), left.end(), std::back_inserter(*others));
  else if (!left.empty())
    tell_actor(std::move(left));
}

void request_lane::start(request_id id, std::optional<uint64_t> served) {
  engine_call call;
  std::shared_ptr<engine_port> engine;
  std::shared_ptr<executor> workers;
  std::optional<version_ref> served_ref;
  std::shared_ptr<transport::http_responder> out;
  std::shared_ptr<std::atomic<bool>> cancelled, streaming;
  {
    std::lock_guard lock{mutex_};
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second.started)
      return;
    auto& r = it->second;
    r.started = true;
    call.id = id;
    call.tag = replica_id_ + "-" + std::to_string(id);
    call.method = r.method;
    call.route = r.route;
    call.body = std::move(r.body);
    if (served && !run_id_.empty())
      served_ref = version_ref{run_id_, *served};
    engine = engine_;
    workers = workers_;
    out = r.out;
    cancelled = r.cancelled;
    streaming = r.streaming;
  }
  workers->post([self = shared_from_this(), id, engine = std::move(engine), call = std::move(call),
                 served_ref, out = std::move(out), cancelled = std::move(cancelled),
                 streaming = std::move(streaming)]() mutable {
    if (served_ref)
      call.body = engine->stamp_request(call.route, call.body, *served_ref);
    event_sink sink = [&](std::string ev) {
      if (!streaming->exchange(true))
        out->start_events({});
      out->event(std::move(ev));
    };
    auto got = engine->forward(call, sink, [&] { return cancelled->load(); });
    self->finished(id, std::move(got));
  });
}

void request_lane::finished(request_id id, result<engine_reply> out) {
  engine_outcome outcome;
  if (!out) {
    outcome.failed = out.error();
  } else {
    outcome.ok = out->status == 200;
    outcome.last_token_version = out->last_token_version;
  }
  std::vector<request_effect> effects;
  {
    std::lock_guard lock{mutex_};
    auto it = requests_.find(id);
    if (it == requests_.end())
      return;
    if (out)
      it->second.reply = std::move(*out);
    effects = life_.engine_done(id, outcome, lane_now());
  }
  carry(std::move(effects));
}

void request_lane::answer(request_id id, std::optional<stamps> stamped, const http_error* failure) {
  request r;
  std::string run_id, replica_id;
  std::shared_ptr<engine_port> engine;
  bool idle = false;
  {
    std::lock_guard lock{mutex_};
    auto it = requests_.find(id);
    if (it == requests_.end())
      return;
    r = std::move(it->second);
    requests_.erase(it);
    run_id = run_id_;
    replica_id = replica_id_;
    engine = engine_;
    idle = requests_.empty();
  }
  replica_answer a;
  if (failure) {
    a = answer_of(*failure);
  } else if (r.reply) {
    a.status = r.reply->status;
    a.content_type = std::move(r.reply->content_type);
    a.body = std::move(r.reply->body);
    a.stream = r.reply->stream;
    if (stamped) {
      a.stamped = stamped;
      a.run_id = run_id;
      a.body = engine->stamp_response(r.route, a.body, *stamped, run_id);
      completed_.fetch_add(1, std::memory_order_relaxed);
    }
  } else {
    a = answer_of(make_http_error(http_failure::unavailable, "the engine gave no answer; retry"));
  }
  a.replica_id = std::move(replica_id);
  deliver(a, *r.out, r.streaming->load());
  if (idle && watch_idle_.load(std::memory_order_relaxed))
    tell_actor({});
}

void request_lane::tell_actor(std::vector<request_effect> left) {
  std::function<void()> notify;
  {
    std::lock_guard lock{mutex_};
    notify = notify_;
    if (notify)
      std::move(left.begin(), left.end(), std::back_inserter(left_));
  }
  if (notify)
    notify();
}

} // namespace stitch
