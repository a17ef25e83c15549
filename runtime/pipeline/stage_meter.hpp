#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace stitch::pipeline {

/// Where a stage spends its time (`stitch profile`): reading bytes (the store
/// or peers), decoding delta frames, verifying checksums; whatever else the
/// engine does (allocating, copying, building the shadow) is the rest.
enum class stage_phase : uint8_t { rest, fetch, decode, verify };

/// Seconds a stage spent in each phase, exclusive: time inside a nested
/// phase (a read while decoding) counts for the inner one only.
struct stage_times {
  double fetch_s = 0;
  double decode_s = 0;
  double verify_s = 0;
};

/// Collects the phase times of one stage. The stage's thread installs it
/// (`installed`); code on that thread marks its phases with `phase_scope`,
/// which costs one clock read per edge and nothing on threads without a
/// meter. A helper thread of the stage (a read-ahead) installs the same
/// meter: each thread nests its own phases and their times add up.
class stage_meter {
public:
  stage_meter() = default;
  stage_meter(const stage_meter&) = delete;
  stage_meter& operator=(const stage_meter&) = delete;

  stage_times times() const noexcept;
  void add(stage_phase phase, std::chrono::nanoseconds took) noexcept;

  /// The meter installed on this thread, or null.
  static stage_meter* current() noexcept;

  /// Installs `meter` on this thread for the guard's lifetime (null: none).
  class installed {
  public:
    explicit installed(stage_meter* meter) noexcept;
    ~installed();
    installed(const installed&) = delete;
    installed& operator=(const installed&) = delete;

  private:
    stage_meter* previous_;
    stage_phase previous_phase_;
    std::chrono::steady_clock::time_point previous_since_;
  };

private:
  std::array<std::atomic<int64_t>, 4> nanos_{};
};

/// Marks the enclosing block as `phase` on this thread's meter, if any.
class phase_scope {
public:
  explicit phase_scope(stage_phase phase) noexcept;
  ~phase_scope();
  phase_scope(const phase_scope&) = delete;
  phase_scope& operator=(const phase_scope&) = delete;

private:
  bool active_;
  stage_phase outer_ = stage_phase::rest;
};

} // namespace stitch::pipeline
