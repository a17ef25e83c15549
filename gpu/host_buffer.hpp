#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "runtime/core/error.hpp"

/// Host memory for version bytes: the publisher's copy of a run's last
/// version, the staging buffers a replica builds its next weights in, the
/// scratch of streamed reads. One allocator for all of them, so that what
/// moves bytes into such memory registers the same buffers instead of copying
/// through its own: UCX memory registration (the transport) and CUDA page
/// locking (the GPU replica) plug in as `buffer_registrar`s.
namespace stitch::gpu {

/// Told of every buffer an allocator hands out and takes back.
class buffer_registrar {
public:
  virtual ~buffer_registrar() = default;
  /// A new buffer; an error fails the allocation.
  virtual status on_allocate(std::span<std::byte> buffer) = 0;
  /// The buffer is about to be freed (also after a later registrar refused
  /// it: registrars must ignore buffers they do not know).
  virtual void on_release(std::span<std::byte> buffer) noexcept = 0;
};

/// A buffer from a `host_allocator`: move-only, freed (and unregistered) when
/// destroyed. Its bytes are uninitialized; pages are faulted in on first
/// touch (huge pages where the kernel allows, so a multi-GB buffer costs
/// thousands of faults, not millions).
class host_buffer {
public:
  host_buffer() = default;
  host_buffer(host_buffer&& other) noexcept;
  host_buffer& operator=(host_buffer&& other) noexcept;
  host_buffer(const host_buffer&) = delete;
  host_buffer& operator=(const host_buffer&) = delete;
  ~host_buffer();

  std::byte* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }
  std::span<std::byte> bytes() const noexcept { return {data_, size_}; }
  explicit operator bool() const noexcept { return data_ != nullptr; }

private:
  friend class host_allocator;
  using registrars = std::vector<std::shared_ptr<buffer_registrar>>;
  host_buffer(std::byte* data, size_t size, size_t mapped, std::shared_ptr<const registrars> regs)
      : data_(data), size_(size), mapped_(mapped), registrars_(std::move(regs)) {}
  void release() noexcept;

  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
  std::shared_ptr<const registrars> registrars_;
};

/// Hands out `host_buffer`s: anonymous mappings (2 MiB aligned, transparent
/// huge pages advised) for large buffers, the heap for small ones.
/// Thread-safe.
class host_allocator {
public:
  /// An uninitialized buffer of `bytes` (0 gives an empty buffer);
  /// `limit_exceeded` when the memory is not there.
  result<host_buffer> allocate(size_t bytes);
  /// Registers every buffer allocated from now on.
  void add_registrar(std::shared_ptr<buffer_registrar> registrar);

private:
  std::mutex mutex_;
  std::shared_ptr<const host_buffer::registrars> registrars_ =
    std::make_shared<const host_buffer::registrars>();
};

/// The process-wide allocator.
host_allocator& staging_allocator();

} // namespace stitch::gpu
