#include "runtime/pipeline/pipeline.hpp"

#include <cerrno>
#include <cstdint>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace stitch::pipeline {

namespace {

/// `struct sched_attr` of sched_setattr(2) (glibc has no wrapper before 2.41).
struct sched_attributes {
  uint32_t size = sizeof(sched_attributes);
  uint32_t policy = 0;
  uint64_t flags = 0;
  int32_t nice = 0;
  uint32_t priority = 0;
  /// For SCHED_OTHER and SCHED_BATCH since Linux 6.12: the time slice in
  /// nanoseconds (0: the kernel's default).
  uint64_t runtime = 0;
  uint64_t deadline = 0;
  uint64_t period = 0;
};

bool set_attributes(uint32_t policy, int nice, uint64_t slice_ns) noexcept {
  sched_attributes a;
  a.policy = policy;
  a.nice = nice;
  a.runtime = slice_ns;
  return ::syscall(SYS_sched_setattr, 0, &a, 0) == 0;
}

int current_nice() noexcept {
  errno = 0;
  const int n = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
  return errno == 0 ? n : 0;
}

} // namespace

void run_as_background_thread() noexcept {
  // A custom slice survives sched_setscheduler(2): set the policy, nice and
  // the default slice at once.
  if (set_attributes(SCHED_BATCH, 10, 0))
    return;
  sched_param param{};
  (void) ::pthread_setschedparam(::pthread_self(), SCHED_BATCH, &param);
  (void) ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
}

void run_as_latency_thread() noexcept {
  constexpr uint64_t shortest_slice_ns = 100'000;
  (void) set_attributes(SCHED_OTHER, current_nice(), shortest_slice_ns);
}

status buffer_ring::allocate(size_t count, size_t bytes) {
  for (size_t i = 0; i < count; ++i) {
    auto b = gpu::staging_allocator().allocate(bytes);
    if (!b)
      return std::move(b).error();
    buffers.push_back(std::move(*b));
    free.push_back(buffers.size() - 1);
  }
  return {};
}

result<std::span<std::byte>> buffer_ring::acquire(std::unique_lock<std::mutex>& lock,
                                                  std::condition_variable& changed,
                                                  const status& failure) {
  changed.wait(lock, [&] { return !free.empty() || !failure; });
  if (!failure)
    return failure.error();
  acquired = free.front();
  free.pop_front();
  return buffers[*acquired].bytes();
}

result<size_t> buffer_ring::release_acquired() {
  if (!acquired)
    return make_error(errc::invalid_argument, "submit without a buffer acquired");
  const size_t i = *acquired;
  acquired.reset();
  return i;
}

result<std::unique_ptr<buffer_pipeline>> buffer_pipeline::start(size_t depth, size_t piece_bytes,
                                                                consumer consume) {
  std::unique_ptr<buffer_pipeline> p{new buffer_pipeline()};
  p->consume_ = std::move(consume);
  p->depth_ = std::max<size_t>(depth, 2);
  if (auto ok = p->ring_.allocate(p->depth_, piece_bytes); !ok)
    return std::move(ok).error();
  p->thread_ = std::thread{[raw = p.get()] { raw->run(); }};
  return p;
}

buffer_pipeline::~buffer_pipeline() {
  {
    std::lock_guard guard{mutex_};
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable())
    thread_.join();
}

void buffer_pipeline::run() {
  pthread_setname_np(pthread_self(), "pipeline");
  run_as_background_thread();
  for (;;) {
    job next;
    {
      std::unique_lock lock{mutex_};
      changed_.wait(lock, [&] { return stopping_ || !filled_.empty(); });
      if (filled_.empty())
        return;
      next = std::move(filled_.front());
      filled_.pop_front();
      ++busy_;
    }
    status outcome;
    {
      std::lock_guard guard{mutex_};
      outcome = failure_;
    }
    // After a failure the rest is dropped unconsumed.
    if (outcome)
      outcome =
        consume_(next.owner ? next.external : ring_.buffers[next.buffer].bytes().first(next.bytes));
    next.owner.reset();
    {
      std::lock_guard guard{mutex_};
      if (!outcome && failure_)
        failure_ = std::move(outcome);
      if (next.external.empty())
        ring_.free.push_back(next.buffer);
      --busy_;
    }
    changed_.notify_all();
  }
}

result<std::span<std::byte>> buffer_pipeline::acquire() {
  std::unique_lock lock{mutex_};
  return ring_.acquire(lock, changed_, failure_);
}

status buffer_pipeline::submit(size_t n) {
  {
    std::lock_guard guard{mutex_};
    auto buffer = ring_.release_acquired();
    if (!buffer)
      return std::move(buffer).error();
    filled_.push_back({*buffer, n, {}, nullptr});
    if (!failure_)
      return failure_;
  }
  changed_.notify_all();
  return {};
}

status buffer_pipeline::submit_external(std::span<const std::byte> bytes,
                                        std::shared_ptr<const void> owner) {
  if (!owner || bytes.empty())
    return make_error(errc::invalid_argument, "lent bytes need an owner");
  {
    std::unique_lock lock{mutex_};
    // As many lent pieces in flight as the pipeline has buffers.
    changed_.wait(lock, [&] { return filled_.size() + busy_ < depth_ || !failure_; });
    if (!failure_)
      return failure_;
    filled_.push_back({0, 0, bytes, std::move(owner)});
  }
  changed_.notify_all();
  return {};
}

status buffer_pipeline::finish() {
  std::unique_lock lock{mutex_};
  changed_.wait(lock, [&] { return filled_.empty() && busy_ == 0; });
  return failure_;
}

} // namespace stitch::pipeline
