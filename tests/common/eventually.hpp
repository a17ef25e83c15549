#pragma once

// Polling for a condition that other threads or processes make true.

#include <chrono>
#include <thread>

namespace stitch::testing {

/// Polls `ok` every `poll` until it holds or `limit` passes; answers
/// whether it held (checked once more at the deadline).
template <class F>
bool eventually(F&& ok, std::chrono::milliseconds limit,
                std::chrono::milliseconds poll = std::chrono::milliseconds{10}) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (ok())
      return true;
    std::this_thread::sleep_for(poll);
  }
  return ok();
}

} // namespace stitch::testing
