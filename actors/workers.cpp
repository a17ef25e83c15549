#include "actors/workers.hpp"

#include <pthread.h>

#include "runtime/store/pipeline.hpp"

namespace stitch {

worker_pool::worker_pool(size_t threads, std::string name, size_t max_queued, priority prio)
    : name_(std::move(name)), max_queued_(max_queued), priority_(prio) {
  threads_.reserve(std::max<size_t>(threads, 1));
  for (size_t i = 0; i < std::max<size_t>(threads, 1); ++i)
    threads_.emplace_back([this] { work(); });
}

worker_pool::~worker_pool() {
  {
    std::lock_guard guard{mutex_};
    stopping_ = true;
  }
  ready_.notify_all();
  for (auto& t : threads_)
    t.join();
}

void worker_pool::post(std::function<void()> job) {
  {
    std::lock_guard guard{mutex_};
    jobs_.push_back(std::move(job));
  }
  ready_.notify_one();
}

bool worker_pool::try_post(std::function<void()> job) {
  {
    std::lock_guard guard{mutex_};
    if (max_queued_ != 0 && jobs_.size() >= max_queued_)
      return false;
    jobs_.push_back(std::move(job));
  }
  ready_.notify_one();
  return true;
}

size_t worker_pool::queued() const {
  std::lock_guard guard{mutex_};
  return jobs_.size();
}

void worker_pool::work() {
  // Thread names are at most 15 characters.
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  if (priority_ == priority::background)
    store::run_as_background_thread();
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock{mutex_};
      ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty())
        return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

void strand::post(std::function<void()> job) {
  {
    std::lock_guard guard{mutex_};
    jobs_.push_back(std::move(job));
    if (running_)
      return;
    running_ = true;
  }
  on_->post([self = shared_from_this()] { self->run_next(); });
}

void strand::run_next() {
  std::function<void()> job;
  {
    std::lock_guard guard{mutex_};
    job = std::move(jobs_.front());
    jobs_.pop_front();
  }
  job();
  {
    std::lock_guard guard{mutex_};
    if (jobs_.empty()) {
      running_ = false;
      return;
    }
  }
  // One job per turn, so a busy strand shares the threads with the others.
  on_->post([self = shared_from_this()] { self->run_next(); });
}

} // namespace stitch
