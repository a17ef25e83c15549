#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace stitch::transport {

/// Recycled, uninitialized byte buffers in size classes of whole MiB, up to
/// `max_buffer` bytes. When the last reference to a buffer goes it returns
/// to the pool (which keeps at most `kept_limit` bytes of them) instead of
/// to the system, so a stream of large buffers (request bodies, pieces of a
/// publish) reuses warm memory.
///
/// Why not malloc: glibc serves a thread other than the main one from an
/// arena of 64 MiB heaps and unmaps a heap once it is empty, so every few
/// 16 MiB buffers land in freshly mapped pages, faulted in (and zeroed by
/// the kernel) one page at a time: about 1 ms per MiB on a VM that backs
/// memory lazily, measured as a 60 ms stall every third request body of an
/// HTTP publish.
class buffer_pool {
public:
  static constexpr size_t granule = size_t{1} << 20;

  buffer_pool(size_t max_buffer, size_t kept_limit);
  buffer_pool(const buffer_pool&) = delete;
  buffer_pool& operator=(const buffer_pool&) = delete;
  ~buffer_pool();

  /// A buffer of at least `size` bytes (more than zero), its contents
  /// undefined; nullptr when there is no memory for it. A size over
  /// `max_buffer` is allocated and freed plainly. The pool must outlive
  /// every buffer it hands out. Never throws.
  std::shared_ptr<char[]> take(size_t size) noexcept;

  /// Bytes kept for reuse now.
  size_t kept() const;

private:
  void give_back(size_t cls, char* raw) noexcept;

  const size_t max_buffer_;
  const size_t kept_limit_;
  mutable std::mutex mutex_;
  /// Free buffers per class: index `c` holds buffers of `(c + 1)` MiB.
  std::vector<std::vector<char*>> free_;
  size_t kept_ = 0;
};

} // namespace stitch::transport
