#include "gpu/cpu_parallel.hpp"

#include <algorithm>
#include <utility>

namespace stitch::gpu {

namespace {

/// Set while a thread runs pool tasks, so a nested `run` goes sequential.
thread_local bool inside_task = false;

} // namespace

thread_pool::thread_pool(size_t threads) {
  if (threads == 0)
    threads = std::max<size_t>(1, std::thread::hardware_concurrency());
  workers_.reserve(threads - 1);
  for (size_t i = 1; i < threads; ++i)
    workers_.emplace_back([this] { worker_loop(); });
}

thread_pool::~thread_pool() {
  {
    std::lock_guard lock{mutex_};
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_)
    worker.join();
}

void thread_pool::run(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0)
    return;
  if (n == 1 || workers_.empty() || inside_task) {
    for (size_t i = 0; i < n; ++i)
      fn(i);
    return;
  }
  std::lock_guard run_lock{run_mutex_};
  {
    std::lock_guard lock{mutex_};
    fn_ = &fn;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    failure_ = nullptr;
    busy_workers_ = workers_.size();
    ++generation_;
  }
  wake_.notify_all();
  work();
  std::exception_ptr failure;
  {
    std::unique_lock lock{mutex_};
    done_.wait(lock, [this] { return busy_workers_ == 0; });
    fn_ = nullptr;
    failure = std::exchange(failure_, nullptr);
  }
  if (failure)
    std::rethrow_exception(failure);
}

void thread_pool::work() noexcept {
  inside_task = true;
  for (size_t i = next_.fetch_add(1); i < n_; i = next_.fetch_add(1)) {
    try {
      (*fn_)(i);
    } catch (...) {
      std::lock_guard lock{mutex_};
      if (!failure_)
        failure_ = std::current_exception();
    }
  }
  inside_task = false;
}

void thread_pool::worker_loop() {
  uint64_t seen = 0;
  std::unique_lock lock{mutex_};
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_)
      return;
    seen = generation_;
    lock.unlock();
    work();
    lock.lock();
    if (--busy_workers_ == 0)
      done_.notify_one();
  }
}

thread_pool& shared_pool() {
  static thread_pool pool;
  return pool;
}

} // namespace stitch::gpu
