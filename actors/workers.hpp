#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace stitch {

/// Where an actor runs slow work (staging, activation, generation, store I/O)
/// so that it never blocks its own thread: jobs report back by message.
class executor {
public:
  virtual ~executor() = default;
  virtual void post(std::function<void()> job) = 0;
  /// Like `post`, but refuses (false) instead of queueing past a bound.
  virtual bool try_post(std::function<void()> job) {
    post(std::move(job));
    return true;
  }
};

/// How a pool's threads are scheduled: bulk byte work (staging, publishing,
/// store bytes) runs in the background so request and control threads get
/// the cores first on a busy machine.
enum class priority : uint8_t { normal, background };

/// A fixed set of threads taking jobs in FIFO order. With one thread, jobs run
/// one after the other in posting order. `max_queued` bounds the jobs waiting
/// (0: unbounded) for `try_post`; `post` always queues. The destructor
/// finishes the jobs already posted, then joins — except a thread of its own
/// (a job held the last reference to the pool), which finishes them and ends
/// on its own.
class worker_pool final : public executor {
public:
  worker_pool(size_t threads, std::string name, size_t max_queued = 0,
              priority prio = priority::normal);
  ~worker_pool() override;
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  void post(std::function<void()> job) override;
  bool try_post(std::function<void()> job) override;
  /// Jobs waiting for a thread.
  size_t queued() const;

private:
  /// What the threads share; each holds it, so it outlives the pool object
  /// for a thread that ends on its own.
  struct shared {
    std::string name;
    size_t max_queued;
    priority prio;
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::function<void()>> jobs;
    bool stopping = false;
  };
  static void work(const std::shared_ptr<shared>& s);

  std::shared_ptr<shared> s_;
  std::vector<std::thread> threads_;
};

/// Runs its jobs one at a time, in posting order, on another executor's
/// threads (jobs of different strands run side by side). Make it with
/// `std::make_shared`: a queued strand keeps itself alive.
class strand final : public executor, public std::enable_shared_from_this<strand> {
public:
  explicit strand(std::shared_ptr<executor> on) : on_(std::move(on)) {}

  void post(std::function<void()> job) override;

private:
  void run_next();

  std::shared_ptr<executor> on_;
  std::mutex mutex_;
  std::deque<std::function<void()>> jobs_;
  bool running_ = false;
};

} // namespace stitch
