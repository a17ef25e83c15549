#include "runtime/core/admission_gate.hpp"

#include <algorithm>

namespace stitch {

std::string_view to_string(commit_mode mode) noexcept {
  return mode == commit_mode::quiesce ? "quiesce" : "in_place";
}

result<commit_mode> parse_commit_mode(std::string_view text) {
  if (text == "quiesce")
    return commit_mode::quiesce;
  if (text == "in_place")
    return commit_mode::in_place;
  return make_error(errc::invalid_argument,
                    "commit mode '" + std::string{text} + "' is neither 'quiesce' nor 'in_place'");
}

admission_gate::admission_gate() : admission_gate(options{}) {}

admission_gate::admission_gate(options opts) : opts_(opts) {}

void admission_gate::serve(uint64_t version) {
  served_ = version;
  unavailable_reason_.clear();
}

void admission_gate::stop_serving(std::string reason) {
  served_.reset();
  unavailable_reason_ = std::move(reason);
}

void admission_gate::take_out(std::string reason) {
  taken_out_ = std::move(reason);
}

admission admission_gate::decide(const constraint& c) {
  if (taken_out_)
    return unavailable{*taken_out_};
  if (!served_)
    return unavailable{unavailable_reason_};
  if (c.satisfied_by(*served_)) {
    ++metrics_.admitted_total;
    return admitted{*served_};
  }
  ++metrics_.rejected_total;
  return rejected{reject(c, served_)};
}

admission admission_gate::admit(request_id id, const constraint& c, clock_time) {
  if (active_.contains(id))
    return unavailable{"request id " + std::to_string(id) + " is already in flight"};
  if (taken_out_)
    return unavailable{*taken_out_};
  if (phase_ != phase::open) {
    if (queue_.size() >= opts_.max_queued)
      return unavailable{"admission queue is full while a weight update is committing"};
    queue_.push_back(waiting{id, c});
    return queued{};
  }
  auto decision = decide(c);
  if (auto* ok = std::get_if<admitted>(&decision)) {
    active_.emplace(id, in_flight{ok->start_version, c.exact_version.has_value()});
    if (c.exact_version)
      ++exact_pins_;
  }
  return decision;
}

std::pair<std::optional<stamps>, std::vector<gate_effect>>
admission_gate::finish(request_id id, clock_time now, std::optional<uint64_t> last_token_version) {
  auto it = active_.find(id);
  if (it == active_.end()) {
    std::erase_if(queue_, [id](const waiting& w) { return w.id == id; });
    return {std::nullopt, {}};
  }
  // An exact pin holds every commit until it finishes, so the served version
  // can only have moved under it by `advance` — versions whose weights equal
  // the pinned one (empty deltas). It ran on exactly the pinned weights, and
  // says so: start = end = the pin.
  const uint64_t start = it->second.start_version;
  stamps s{start, it->second.exact ? start : served_.value_or(start)};
  // In place, the engine can activate a version and make a token with it
  // before the host hears the activation: the end stamp is no earlier than
  // the version the engine says made the last token.
  if (!it->second.exact && last_token_version && *last_token_version > s.end)
    s.end = *last_token_version;
  if (it->second.exact)
    --exact_pins_;
  active_.erase(it);
  return {s, maybe_proceed(now)};
}

bool admission_gate::holds_commit(const in_flight& r) const noexcept {
  return drain_all_ || commit_mode_ == commit_mode::quiesce || r.exact;
}

size_t admission_gate::holders() const noexcept {
  if (phase_ != phase::draining)
    return 0;
  return static_cast<size_t>(std::count_if(
    active_.begin(), active_.end(), [this](const auto& kv) { return holds_commit(kv.second); }));
}

std::optional<clock_time> admission_gate::drain_deadline() const noexcept {
  if (phase_ != phase::draining)
    return std::nullopt;
  return commit_began_ + opts_.drain_timeout;
}

std::vector<gate_effect> admission_gate::begin_commit(commit_mode mode, bool drain_all,
                                                      clock_time now) {
  if (phase_ != phase::open)
    return {};
  phase_ = phase::draining;
  commit_mode_ = mode;
  drain_all_ = drain_all;
  commit_began_ = now;
  return maybe_proceed(now);
}

std::vector<gate_effect> admission_gate::maybe_proceed(clock_time now) {
  if (phase_ != phase::draining || holders() != 0)
    return {};
  phase_ = phase::activating;
  proceed_at_ = now;
  metrics_.last_drain = now - commit_began_;
  return {gate_effects::commit_may_proceed{metrics_.last_drain}};
}

std::vector<gate_effect> admission_gate::tick(clock_time now) {
  if (phase_ != phase::draining || now < commit_began_ + opts_.drain_timeout)
    return {};
  std::vector<request_id> victims;
  for (const auto& [id, r] : active_)
    if (holds_commit(r))
      victims.push_back(id);
  std::sort(victims.begin(), victims.end());
  std::vector<gate_effect> effects;
  for (auto id : victims) {
    if (active_[id].exact)
      --exact_pins_;
    active_.erase(id);
    effects.emplace_back(gate_effects::abort_request{id});
  }
  if (!victims.empty())
    ++metrics_.drain_timeouts_total;
  auto more = maybe_proceed(now);
  effects.insert(effects.end(), more.begin(), more.end());
  return effects;
}

std::vector<gate_effect> admission_gate::end_commit(uint64_t new_version, clock_time now) {
  if (phase_ != phase::activating)
    return {};
  serve(new_version);
  metrics_.last_pause = now - proceed_at_;
  metrics_.max_pause = std::max(metrics_.max_pause, metrics_.last_pause);
  ++metrics_.commits_total;
  return reopen(now);
}

std::vector<gate_effect> admission_gate::abort_commit(clock_time now) {
  if (phase_ == phase::open)
    return {};
  return reopen(now);
}

status admission_gate::advance(uint64_t new_version) {
  if (phase_ != phase::open)
    return make_error(errc::invalid_argument, "cannot advance the served version during a commit");
  if (!served_)
    return make_error(errc::engine_unavailable, "cannot advance: nothing is served");
  served_ = new_version;
  return {};
}

std::vector<gate_effect> admission_gate::reopen(clock_time) {
  phase_ = phase::open;
  drain_all_ = false;
  std::vector<gate_effect> effects;
  auto pending = std::move(queue_);
  queue_.clear();
  for (auto& w : pending) {
    auto decision = decide(w.c);
    if (auto* ok = std::get_if<admitted>(&decision)) {
      active_.emplace(w.id, in_flight{ok->start_version, w.c.exact_version.has_value()});
      if (w.c.exact_version)
        ++exact_pins_;
      effects.emplace_back(gate_effects::admit{w.id, ok->start_version});
    } else if (auto* no = std::get_if<rejected>(&decision)) {
      effects.emplace_back(gate_effects::reject{w.id, std::move(no->body)});
    } else {
      effects.emplace_back(gate_effects::refuse{w.id, std::get<unavailable>(decision).reason});
    }
  }
  return effects;
}

} // namespace stitch
