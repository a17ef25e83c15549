#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "runtime/pipeline/stage_meter.hpp"

namespace stitch::pipeline {
namespace {

using namespace std::chrono_literals;

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(stage_meter, nested_phases_count_for_the_inner_one_only) {
  stage_meter meter;
  auto t0 = std::chrono::steady_clock::now();
  {
    stage_meter::installed timed{&meter};
    phase_scope decoding{stage_phase::decode};
    std::this_thread::sleep_for(3ms);
    {
      phase_scope fetching{stage_phase::fetch};
      std::this_thread::sleep_for(4ms);
    }
    {
      phase_scope verifying{stage_phase::verify};
      std::this_thread::sleep_for(2ms);
    }
  }
  const double wall = since(t0);
  auto t = meter.times();
  EXPECT_GE(t.decode_s, 0.003);
  EXPECT_GE(t.fetch_s, 0.004);
  EXPECT_GE(t.verify_s, 0.002);
  // Exclusive: the phases never add up to more than the time that passed.
  EXPECT_LE(t.decode_s + t.fetch_s + t.verify_s, wall);
  EXPECT_LT(t.decode_s, wall - t.fetch_s - t.verify_s + 1e-9);
}

TEST(stage_meter, threads_without_the_meter_are_not_counted) {
  stage_meter meter;
  stage_meter::installed timed{&meter};
  std::thread other{[] {
    EXPECT_EQ(stage_meter::current(), nullptr);
    phase_scope fetching{stage_phase::fetch};
    std::this_thread::sleep_for(3ms);
  }};
  other.join();
  EXPECT_EQ(meter.times().fetch_s, 0.0);
  // A helper thread that installs the same meter adds its time.
  std::thread helper{[&meter] {
    stage_meter::installed also{&meter};
    phase_scope fetching{stage_phase::fetch};
    std::this_thread::sleep_for(2ms);
  }};
  helper.join();
  EXPECT_GE(meter.times().fetch_s, 0.002);
}

TEST(stage_meter, scopes_outside_any_meter_do_nothing_and_guards_restore) {
  EXPECT_EQ(stage_meter::current(), nullptr);
  { phase_scope nothing{stage_phase::verify}; }
  stage_meter outer, inner;
  {
    stage_meter::installed a{&outer};
    {
      stage_meter::installed b{&inner};
      phase_scope verifying{stage_phase::verify};
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_EQ(stage_meter::current(), &outer);
    phase_scope decoding{stage_phase::decode};
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(stage_meter::current(), nullptr);
  EXPECT_GE(inner.times().verify_s, 0.001);
  EXPECT_EQ(inner.times().decode_s, 0.0);
  EXPECT_GE(outer.times().decode_s, 0.001);
  EXPECT_EQ(outer.times().verify_s, 0.0);
}

} // namespace
} // namespace stitch::pipeline
