#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpu/device_memory.hpp"
#include "gpu/nccl_group.hpp"
#include "runtime/core/version_ref.hpp"
#include "runtime/engine/device_model.hpp"

namespace stitch::engine {

/// The versions the CUDA engines of this process hold on their devices
/// (served, or staged and verified), by GPU, so that a replica on another
/// GPU of the node takes a version it needs from the GPU that holds it, over
/// NCCL, instead of fetching it again: one network fetch feeds every local
/// GPU. When the pointer moves, every local replica starts staging at once;
/// the first to start fetches, and the others wait for it (bounded) and take
/// its copy. (Two replicas on one GPU share it the same way, through a
/// one-rank group.) Thread-safe; process-wide.
class device_fanout {
public:
  /// The process's (tests make their own).
  static device_fanout& instance();

  struct holding {
    int gpu = 0;
    std::shared_ptr<const device_weights> weights;
  };

  /// `owner` (an engine) holds `ref` on `gpu` as `weights` (a weak reference
  /// is kept: dropped weights are no longer offered).
  void offer(const void* owner, const version_ref& ref, int gpu,
             const std::shared_ptr<const device_weights>& weights);
  /// `owner` offers nothing any more.
  void withdraw(const void* owner);

  /// A live holder of `ref` other than `asker`.
  std::optional<holding> find(const version_ref& ref, const void* asker);

  /// Before `asker` stages `ref`: a holder if there is one; else, when
  /// another engine is staging it right now, waits up to `patience` for it
  /// and returns its copy (nullopt if it failed or took too long); else
  /// nullopt, and `asker` is the one staging it until `staged`.
  std::optional<holding> join(const version_ref& ref, const void* asker,
                              std::chrono::milliseconds patience);
  /// `owner`'s stage of `ref` ended: with its weights (offered, and handed to
  /// whoever waits), or none when it failed.
  void staged(const void* owner, const version_ref& ref, int gpu,
              const std::shared_ptr<const device_weights>& weights);

  /// Tensor `name` of `from` copied into a new buffer on `gpu` by an NCCL
  /// broadcast (the group of the two GPUs, made once and kept).
  result<std::shared_ptr<gpu::device_buffer>> take(const holding& from, const std::string& name,
                                                   int gpu);

  /// Bytes moved by `take` (for tests and metrics).
  uint64_t bytes_taken() const;

private:
  struct offered {
    int gpu = 0;
    std::weak_ptr<const device_weights> weights;
  };
  mutable std::mutex mutex_;
  std::condition_variable staged_;
  std::map<std::pair<const void*, version_ref>, offered> offers_;
  /// Who is staging each version right now.
  std::map<version_ref, const void*> staging_;
  std::map<std::pair<int, int>, std::unique_ptr<gpu::nccl_group>> groups_;
  std::mutex broadcast_mutex_;
  uint64_t bytes_taken_ = 0;

  std::optional<holding> find_locked(const version_ref& ref, const void* asker);
};

} // namespace stitch::engine
