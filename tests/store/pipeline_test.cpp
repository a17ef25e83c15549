#include "runtime/store/pipeline.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace {

using stitch::store::buffer_pipeline;

/// Everything a consumer saw, in order: a buffer's first byte, or a call's tag.
struct seen_log {
  std::vector<std::string> items;
};

} // namespace

TEST(buffer_pipeline, calls_run_in_order_with_the_buffers_and_never_free_a_buffer) {
  seen_log log;
  auto p = buffer_pipeline::start(2, 64, [&](std::span<const std::byte> bytes) -> stitch::status {
    // Slow enough that the producer runs ahead and reuses freed buffers.
    std::this_thread::sleep_for(std::chrono::milliseconds{1});
    log.items.push_back("b" + std::to_string(static_cast<int>(bytes[0])) + ":"
                        + std::to_string(bytes.size()));
    return {};
  });
  ASSERT_TRUE(p);
  auto& pipe = **p;
  std::vector<std::string> expected;
  for (int i = 0; i < 40; ++i) {
    // Calls between pieces: each must hold no buffer, or two pieces would
    // be filled into one while the first waits (the bytes seen would change).
    ASSERT_TRUE(pipe.submit_call([&log, i] {
      log.items.push_back("c" + std::to_string(i));
      return stitch::status{};
    }));
    expected.push_back("c" + std::to_string(i));
    auto b = pipe.acquire();
    ASSERT_TRUE(b);
    std::memset(b->data(), i, b->size());
    ASSERT_TRUE(pipe.submit(10 + static_cast<size_t>(i)));
    expected.push_back("b" + std::to_string(i) + ":" + std::to_string(10 + i));
  }
  ASSERT_TRUE(pipe.finish());
  EXPECT_EQ(log.items, expected);
}

TEST(buffer_pipeline, a_failing_call_stops_the_pipeline_and_the_rest_is_dropped) {
  std::atomic<int> consumed{0};
  auto p = buffer_pipeline::start(2, 16, [&](std::span<const std::byte>) -> stitch::status {
    ++consumed;
    return {};
  });
  ASSERT_TRUE(p);
  auto& pipe = **p;
  ASSERT_TRUE(pipe.submit_call([] {
    return stitch::status{stitch::make_error(stitch::errc::backend_failure, "frame refused")};
  }));
  auto done = pipe.finish();
  ASSERT_FALSE(done);
  EXPECT_EQ(done.error().message, "frame refused");
  EXPECT_FALSE(pipe.acquire()) << "a failed pipeline hands out no more buffers";
  EXPECT_FALSE(pipe.submit_call([] { return stitch::status{}; }));
  EXPECT_EQ(consumed.load(), 0);
}
