#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "gpu/host_buffer.hpp"
#include "runtime/core/error.hpp"

namespace stitch::pipeline {

/// Lowers the calling thread's scheduling priority (SCHED_BATCH, nice 10,
/// the kernel's default time slice): bulk byte work (staging, publishing,
/// streaming) runs there, so on a busy machine the threads that answer
/// control messages and requests get the cores first. Threads it starts
/// inherit it.
void run_as_background_thread() noexcept;

/// Asks for the shortest time slice the kernel gives (0.1 ms; Linux 6.12's
/// EEVDF custom slices, ignored by older kernels) for the calling thread and
/// every thread it starts, at its normal priority and share of the CPU. A
/// thread with a shorter slice than the running one preempts it when it
/// wakes instead of waiting out that thread's slice (1–3 ms), so a node's
/// control threads (the network thread, actors, the store's fast lane)
/// answer within microseconds of a wakeup while bulk threads
/// (`run_as_background_thread`, which goes back to the default slice) and
/// other processes keep the cores busy. `stitch-node` calls it first thing.
void run_as_latency_thread() noexcept;

/// Staging buffers of one size that rotate between a producer and the
/// threads consuming them, guarded by their owner's mutex: which are free,
/// and the one the producer holds.
struct buffer_ring {
  std::vector<gpu::host_buffer> buffers;
  std::deque<size_t> free;
  std::optional<size_t> acquired;

  /// `count` buffers of `bytes` each, all free.
  status allocate(size_t count, size_t bytes);
  /// Waits (the owner's `lock` held, `changed` told when a buffer comes
  /// back) until a buffer is free, then holds it as `acquired`; `failure`'s
  /// error instead once it has one.
  result<std::span<std::byte>> acquire(std::unique_lock<std::mutex>& lock,
                                       std::condition_variable& changed, const status& failure);
  /// The held buffer, no longer held; `invalid_argument` without one.
  result<size_t> release_acquired();
};

/// Overlaps producing bytes with consuming them: the producer fills one of
/// `depth` rotating buffers while a thread of its own hands the filled ones
/// to `consume` in order (a disk write while the next piece is read and
/// decoded, say). Memory is `depth` x `piece_bytes` whatever flows through.
/// The consumer's first error stops it; `acquire`, `submit` and `finish`
/// report it from then on. One producer thread.
class buffer_pipeline {
public:
  using consumer = std::function<status(std::span<const std::byte>)>;

  static result<std::unique_ptr<buffer_pipeline>> start(size_t depth, size_t piece_bytes,
                                                        consumer consume);
  ~buffer_pipeline();
  buffer_pipeline(const buffer_pipeline&) = delete;
  buffer_pipeline& operator=(const buffer_pipeline&) = delete;

  /// A free buffer of `piece_bytes` to fill; waits for one.
  result<std::span<std::byte>> acquire();
  /// Hands the first `n` bytes of the buffer `acquire` gave to the consumer.
  status submit(size_t n);
  /// Hands bytes the pipeline does not own to the consumer, in order with
  /// the buffers; `owner` keeps them valid and is dropped once consumed.
  /// Waits while the consumer is `depth` pieces behind.
  status submit_external(std::span<const std::byte> bytes, std::shared_ptr<const void> owner);
  /// Waits until everything submitted was consumed.
  status finish();

private:
  buffer_pipeline() = default;
  void run();

  consumer consume_;
  std::mutex mutex_;
  std::condition_variable changed_;
  buffer_ring ring_;
  /// What waits for the consumer: a buffer's first bytes, or lent bytes.
  struct job {
    size_t buffer = 0;
    size_t bytes = 0;
    std::span<const std::byte> external;
    std::shared_ptr<const void> owner;
  };
  std::deque<job> filled_;
  size_t depth_ = 2;
  size_t busy_ = 0;
  bool stopping_ = false;
  status failure_;
  std::thread thread_;
};

} // namespace stitch::pipeline
