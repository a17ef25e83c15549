#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace stitch {

/// Where an actor runs slow work (staging, activation, generation) so that it
/// never blocks its own thread: jobs report back by message.
class executor {
public:
  virtual ~executor() = default;
  virtual void post(std::function<void()> job) = 0;
};

/// A fixed set of threads taking jobs in FIFO order. With one thread, jobs run
/// one after the other in posting order. The destructor finishes the jobs
/// already posted, then joins.
class worker_pool final : public executor {
public:
  worker_pool(size_t threads, std::string name);
  ~worker_pool() override;
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  void post(std::function<void()> job) override;

private:
  void work();

  std::string name_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

} // namespace stitch
