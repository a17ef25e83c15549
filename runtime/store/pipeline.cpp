#include "runtime/store/pipeline.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace stitch::store {

void run_as_background_thread() noexcept {
  sched_param param{};
  (void) ::pthread_setschedparam(::pthread_self(), SCHED_BATCH, &param);
  (void) ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
}

result<std::unique_ptr<buffer_pipeline>> buffer_pipeline::start(size_t depth, size_t piece_bytes,
                                                                consumer consume) {
  std::unique_ptr<buffer_pipeline> p{new buffer_pipeline()};
  p->consume_ = std::move(consume);
  p->depth_ = std::max<size_t>(depth, 2);
  for (size_t i = 0; i < std::max<size_t>(depth, 2); ++i) {
    auto b = gpu::staging_allocator().allocate(piece_bytes);
    if (!b)
      return std::move(b).error();
    p->buffers_.push_back(std::move(*b));
    p->free_.push_back(i);
  }
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
        consume_(next.owner ? next.external : buffers_[next.buffer].bytes().first(next.bytes));
    next.owner.reset();
    {
      std::lock_guard guard{mutex_};
      if (!outcome && failure_)
        failure_ = std::move(outcome);
      if (next.external.empty())
        free_.push_back(next.buffer);
      --busy_;
    }
    changed_.notify_all();
  }
}

result<std::span<std::byte>> buffer_pipeline::acquire() {
  std::unique_lock lock{mutex_};
  changed_.wait(lock, [&] { return !free_.empty() || !failure_; });
  if (!failure_)
    return failure_.error();
  acquired_ = free_.front();
  free_.pop_front();
  return buffers_[*acquired_].bytes();
}

status buffer_pipeline::submit(size_t n) {
  {
    std::lock_guard guard{mutex_};
    if (!acquired_)
      return make_error(errc::invalid_argument, "submit without a buffer acquired");
    filled_.push_back({*acquired_, n, {}, nullptr});
    acquired_.reset();
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

} // namespace stitch::store
