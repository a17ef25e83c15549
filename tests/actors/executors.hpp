#pragma once

// Executors for actor tests: jobs wait until the test runs them, so what a
// worker does and when its report reaches the actor is stepped by hand.

#include <deque>
#include <functional>
#include <mutex>

#include "actors/store.hpp"
#include "actors/workers.hpp"

namespace stitch::testing {

/// Queues jobs until `run_one`/`run_all`; `try_post` refuses past `capacity`
/// (0: unbounded).
class manual_executor final : public executor {
public:
  explicit manual_executor(size_t capacity = 0) : capacity_(capacity) {}

  void post(std::function<void()> job) override {
    std::lock_guard guard{mutex_};
    jobs_.push_back(std::move(job));
  }
  bool try_post(std::function<void()> job) override {
    std::lock_guard guard{mutex_};
    if (capacity_ != 0 && jobs_.size() >= capacity_)
      return false;
    jobs_.push_back(std::move(job));
    return true;
  }
  /// Runs the oldest job; false when there is none.
  bool run_one() {
    std::function<void()> job;
    {
      std::lock_guard guard{mutex_};
      if (jobs_.empty())
        return false;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
    return true;
  }
  /// Runs jobs (and the jobs they post) until none is left; returns how many.
  size_t run_all() {
    size_t n = 0;
    while (run_one())
      ++n;
    return n;
  }
  size_t size() const {
    std::lock_guard guard{mutex_};
    return jobs_.size();
  }

private:
  size_t capacity_;
  mutable std::mutex mutex_;
  std::deque<std::function<void()>> jobs_;
};

/// Runs every job at once, on the thread that posts it (a store actor's
/// lanes in tests that step messages but not lanes).
class inline_executor final : public executor {
public:
  void post(std::function<void()> job) override { job(); }
};

inline store_lanes inline_lanes() {
  return {std::make_shared<inline_executor>(), std::make_shared<inline_executor>(),
          std::make_shared<inline_executor>()};
}

} // namespace stitch::testing
