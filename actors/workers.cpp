#include "actors/workers.hpp"

#include <pthread.h>

#include "runtime/pipeline/pipeline.hpp"

namespace stitch {

worker_pool::worker_pool(size_t threads, std::string name, size_t max_queued, priority prio)
    : s_(std::make_shared<shared>()) {
  s_->name = std::move(name);
  s_->max_queued = max_queued;
  s_->prio = prio;
  threads_.reserve(std::max<size_t>(threads, 1));
  for (size_t i = 0; i < std::max<size_t>(threads, 1); ++i)
    threads_.emplace_back([s = s_] { work(s); });
}

worker_pool::~worker_pool() {
  {
    std::lock_guard guard{s_->mutex};
    s_->stopping = true;
  }
  s_->ready.notify_all();
  for (auto& t : threads_) {
    if (t.get_id() == std::this_thread::get_id())
      t.detach(); // this thread is running the job that dropped the pool
    else
      t.join();
  }
}

void worker_pool::post(std::function<void()> job) {
  {
    std::lock_guard guard{s_->mutex};
    s_->jobs.push_back(std::move(job));
  }
  s_->ready.notify_one();
}

bool worker_pool::try_post(std::function<void()> job) {
  {
    std::lock_guard guard{s_->mutex};
    if (s_->max_queued != 0 && s_->jobs.size() >= s_->max_queued)
      return false;
    s_->jobs.push_back(std::move(job));
  }
  s_->ready.notify_one();
  return true;
}

size_t worker_pool::queued() const {
  std::lock_guard guard{s_->mutex};
  return s_->jobs.size();
}

void worker_pool::work(const std::shared_ptr<shared>& s) {
  // Thread names are at most 15 characters.
  pthread_setname_np(pthread_self(), s->name.substr(0, 15).c_str());
  if (s->prio == priority::background)
    pipeline::run_as_background_thread();
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock{s->mutex};
      s->ready.wait(lock, [&] { return s->stopping || !s->jobs.empty(); });
      if (s->jobs.empty())
        return;
      job = std::move(s->jobs.front());
      s->jobs.pop_front();
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
