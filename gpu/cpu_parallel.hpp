#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/core/checksum.hpp"

namespace stitch::gpu {

/// A fixed pool of worker threads behind the core's `parallel_for` seam. The
/// calling thread works too, so a pool of one worker uses two cores. Calls
/// from several threads are served one at a time; a call from inside a task
/// runs sequentially instead of deadlocking. The first exception a task throws
/// is rethrown to the caller after all indices have run.
class thread_pool final : public parallel_for {
public:
  /// `threads` threads work on each call, counting the caller; 0 means
  /// `std::thread::hardware_concurrency()`.
  explicit thread_pool(size_t threads = 0);
  ~thread_pool() override;

  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  /// Threads that work on a call, the caller included.
  size_t size() const noexcept { return workers_.size() + 1; }

  void run(size_t n, const std::function<void(size_t)>& fn) override;

private:
  void worker_loop();
  void work() noexcept;

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  uint64_t generation_ = 0;
  size_t busy_workers_ = 0;
  bool stop_ = false;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
  std::exception_ptr failure_;
};

/// A process-wide pool sized to the machine, created on first use.
thread_pool& shared_pool();

} // namespace stitch::gpu
