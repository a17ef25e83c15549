#include "runtime/core/request_lifecycle.hpp"

#include <algorithm>
#include <tuple>

namespace stitch {

namespace fx = request_effects;

request_lifecycle::request_lifecycle() : request_lifecycle(admission_gate::options{}) {}

request_lifecycle::request_lifecycle(admission_gate::options opts) : gate_(opts) {}

bool request_lifecycle::running(request_id id) const {
  auto it = requests_.find(id);
  return it != requests_.end() && it->second.running;
}

std::vector<request_effect> request_lifecycle::arrive(request_id id, request_kind kind,
                                                      const constraint& c, clock_time now) {
  std::vector<request_effect> out;
  if (requests_.contains(id)) {
    out.emplace_back(
      fx::fail{id, make_http_error(http_failure::bad_request,
                                   "request " + std::to_string(id) + " is already in flight")});
    return out;
  }
  if (retiring_) {
    out.emplace_back(
      fx::fail{id, make_http_error(http_failure::unavailable,
                                   "this replica is retiring (draining before it leaves); retry")});
    return out;
  }
  if (kind == request_kind::passthrough) {
    requests_.emplace(id, state{kind, true});
    out.emplace_back(fx::start{id, std::nullopt});
    return out;
  }
  auto decision = gate_.admit(id, c, now);
  if (auto* ok = std::get_if<admitted>(&decision)) {
    requests_.emplace(id, state{kind, true});
    out.emplace_back(fx::start{id, ok->start_version});
  } else if (auto* no = std::get_if<rejected>(&decision)) {
    out.emplace_back(fx::fail{id, not_ready_error(std::move(no->body))});
    out.emplace_back(fx::reconcile_now{});
  } else if (auto* down = std::get_if<unavailable>(&decision)) {
    out.emplace_back(fx::fail{id, make_http_error(http_failure::unavailable, down->reason)});
  } else {
    // Queued behind a commit: decided when the gate reopens.
    requests_.emplace(id, state{kind, false});
  }
  return out;
}

std::vector<request_effect>
request_lifecycle::engine_done(request_id id, const engine_outcome& outcome, clock_time now) {
  std::vector<request_effect> out;
  auto it = requests_.find(id);
  if (it == requests_.end() || !it->second.running)
    return out;
  const state r = it->second;
  requests_.erase(it);
  std::vector<gate_effect> unblocked;
  std::optional<stamps> stamped;
  if (r.kind == request_kind::versioned)
    std::tie(stamped, unblocked) = gate_.finish(id, now, outcome.last_token_version);
  if (r.engine_failed)
    out.emplace_back(fx::fail{id, make_http_error(http_failure::unavailable,
                                                  "the engine failed while activating new "
                                                  "weights; retry")});
  else if (r.aborted_for_drain)
    out.emplace_back(fx::fail{id, make_http_error(http_failure::drain_timeout,
                                                  "aborted: the request held a weight update "
                                                  "past replica.drain_timeout")});
  else if (r.cancelled_by_client)
    out.emplace_back(
      fx::fail{id, make_http_error(http_failure::client_closed, "the client went away")});
  else if (outcome.failed)
    out.emplace_back(fx::fail{id, http_error_of(*outcome.failed)});
  else if (r.kind == request_kind::passthrough || !outcome.ok)
    out.emplace_back(fx::deliver{id, std::nullopt});
  else if (!stamped)
    out.emplace_back(fx::fail{
      id, make_http_error(http_failure::unavailable, "the request lost its admission; retry")});
  else
    out.emplace_back(fx::deliver{id, stamped});
  apply_gate(std::move(unblocked), out);
  return out;
}

std::vector<request_effect> request_lifecycle::cancel(request_id id, clock_time now) {
  std::vector<request_effect> out;
  auto it = requests_.find(id);
  if (it == requests_.end())
    return out;
  if (it->second.running) {
    it->second.cancelled_by_client = true;
    out.emplace_back(fx::stop{id});
    return out;
  }
  // Still queued behind a commit: it never started.
  requests_.erase(it);
  auto [stamped, unblocked] = gate_.finish(id, now);
  out.emplace_back(
    fx::fail{id, make_http_error(http_failure::client_closed, "the client went away")});
  apply_gate(std::move(unblocked), out);
  return out;
}

std::vector<request_effect> request_lifecycle::begin_commit(commit_mode mode, bool drain_all,
                                                            clock_time now) {
  std::vector<request_effect> out;
  apply_gate(gate_.begin_commit(mode, drain_all, now), out);
  return out;
}

std::vector<request_effect> request_lifecycle::tick(clock_time now) {
  std::vector<request_effect> out;
  apply_gate(gate_.tick(now), out);
  return out;
}

std::vector<request_effect> request_lifecycle::end_commit(uint64_t version, clock_time now) {
  std::vector<request_effect> out;
  apply_gate(gate_.end_commit(version, now), out);
  return out;
}

std::vector<request_effect> request_lifecycle::activation_failed(clock_time now) {
  std::vector<request_effect> out;
  std::vector<request_id> running;
  for (auto& [id, r] : requests_)
    if (r.running && !r.engine_failed) {
      r.engine_failed = true;
      running.push_back(id);
    }
  std::sort(running.begin(), running.end());
  for (auto id : running)
    out.emplace_back(fx::stop{id});
  apply_gate(gate_.abort_commit(now), out);
  return out;
}

std::vector<request_effect> request_lifecycle::commit_cancelled(clock_time now) {
  std::vector<request_effect> out;
  apply_gate(gate_.abort_commit(now), out);
  return out;
}

void request_lifecycle::apply_gate(std::vector<gate_effect> effects,
                                   std::vector<request_effect>& out) {
  for (auto& e : effects) {
    if (auto* a = std::get_if<gate_effects::admit>(&e)) {
      if (auto it = requests_.find(a->id); it != requests_.end()) {
        it->second.running = true;
        out.emplace_back(fx::start{a->id, a->start_version});
      }
    } else if (auto* r = std::get_if<gate_effects::reject>(&e)) {
      requests_.erase(r->id);
      out.emplace_back(fx::fail{r->id, not_ready_error(std::move(r->body))});
      out.emplace_back(fx::reconcile_now{});
    } else if (auto* f = std::get_if<gate_effects::refuse>(&e)) {
      requests_.erase(f->id);
      out.emplace_back(fx::fail{f->id, make_http_error(http_failure::unavailable, f->reason)});
    } else if (auto* x = std::get_if<gate_effects::abort_request>(&e)) {
      if (auto it = requests_.find(x->id); it != requests_.end()) {
        it->second.aborted_for_drain = true;
        out.emplace_back(fx::stop{x->id});
      }
    } else if (auto* p = std::get_if<gate_effects::commit_may_proceed>(&e)) {
      out.emplace_back(fx::commit_may_proceed{p->drain});
    }
  }
}

} // namespace stitch
