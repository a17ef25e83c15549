#pragma once

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

/// The versions the CUDA engines of this process serve, by GPU, so that a
/// replica on another GPU of the node takes a version it needs from the GPU
/// that already holds it, over NCCL, instead of fetching it again: one
/// network fetch feeds every local GPU. (Two replicas on one GPU share it
/// the same way, through a one-rank group.) Thread-safe; process-wide.
class device_fanout {
public:
  static device_fanout& instance();

  /// `owner` (an engine) serves `ref` on `gpu` with `weights`; replaces what
  /// it offered before. Only a weak reference is kept.
  void offer(const void* owner, const version_ref& ref, int gpu,
             const std::shared_ptr<const device_weights>& weights);
  /// `owner` offers nothing any more.
  void withdraw(const void* owner);

  struct holding {
    int gpu = 0;
    std::shared_ptr<const device_weights> weights;
  };
  /// A holder of `ref` other than `asker`, alive.
  std::optional<holding> find(const version_ref& ref, const void* asker);

  /// Tensor `name` of `from` copied into a new buffer on `gpu` by an NCCL
  /// broadcast (the group of the two GPUs, made once and kept).
  result<std::shared_ptr<gpu::device_buffer>> take(const holding& from, const std::string& name,
                                                   int gpu);

  /// Bytes moved by `take` (for tests and metrics).
  uint64_t bytes_taken() const;

private:
  struct offered {
    version_ref ref;
    int gpu = 0;
    std::weak_ptr<const device_weights> weights;
  };
  mutable std::mutex mutex_;
  std::map<const void*, offered> offers_;
  std::map<std::pair<int, int>, std::unique_ptr<gpu::nccl_group>> groups_;
  std::mutex broadcast_mutex_;
  uint64_t bytes_taken_ = 0;
};

} // namespace stitch::engine
