#include "runtime/pipeline/stage_meter.hpp"

namespace stitch::pipeline {

namespace {

using clock = std::chrono::steady_clock;

/// This thread's meter, the phase it is in, and since when.
struct thread_state {
  stage_meter* meter = nullptr;
  stage_phase phase = stage_phase::rest;
  clock::time_point since{};
};

thread_local thread_state here;

/// Charges the time since the last edge to the current phase.
void charge(clock::time_point now) noexcept {
  here.meter->add(here.phase, now - here.since);
  here.since = now;
}

double seconds(int64_t nanos) {
  return static_cast<double>(nanos) / 1e9;
}

} // namespace

stage_times stage_meter::times() const noexcept {
  stage_times t;
  t.fetch_s = seconds(nanos_[static_cast<size_t>(stage_phase::fetch)].load());
  t.decode_s = seconds(nanos_[static_cast<size_t>(stage_phase::decode)].load());
  t.verify_s = seconds(nanos_[static_cast<size_t>(stage_phase::verify)].load());
  return t;
}

void stage_meter::add(stage_phase phase, std::chrono::nanoseconds took) noexcept {
  nanos_[static_cast<size_t>(phase)].fetch_add(took.count(), std::memory_order_relaxed);
}

stage_meter* stage_meter::current() noexcept {
  return here.meter;
}

stage_meter::installed::installed(stage_meter* meter) noexcept
    : previous_(here.meter), previous_phase_(here.phase), previous_since_(here.since) {
  auto now = clock::now();
  if (here.meter)
    charge(now);
  here.meter = meter;
  here.phase = stage_phase::rest;
  here.since = now;
}

stage_meter::installed::~installed() {
  auto now = clock::now();
  if (here.meter)
    charge(now);
  here.meter = previous_;
  here.phase = previous_phase_;
  here.since = previous_ ? now : previous_since_;
}

phase_scope::phase_scope(stage_phase phase) noexcept : active_(here.meter != nullptr) {
  if (!active_)
    return;
  charge(clock::now());
  outer_ = here.phase;
  here.phase = phase;
}

phase_scope::~phase_scope() {
  if (!active_ || !here.meter)
    return;
  charge(clock::now());
  here.phase = outer_;
}

} // namespace stitch::pipeline
