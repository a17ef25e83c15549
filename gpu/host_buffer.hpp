#pragma once

#include <cstddef>
#include <cstdint>
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

struct host_recycler;

/// A buffer from a `host_allocator`: move-only, freed (and unregistered) when
/// destroyed, or kept for reuse where its allocator recycles (below). Its bytes are uninitialized;
/// pages are faulted in on first touch (huge pages where the kernel allows, so a multi-GB buffer
/// costs thousands of faults, not millions).
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
  friend struct host_recycler;
  using registrars = std::vector<std::shared_ptr<buffer_registrar>>;
  host_buffer(std::byte* data, size_t size, size_t mapped, std::shared_ptr<const registrars> regs,
              std::shared_ptr<host_recycler> recycler)
      : data_(data), size_(size), mapped_(mapped), registrars_(std::move(regs)),
        recycler_(std::move(recycler)) {}
  void release() noexcept;

  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
  std::shared_ptr<const registrars> registrars_;
  std::shared_ptr<host_recycler> recycler_;
};

/// Hands out `host_buffer`s: anonymous mappings (2 MiB aligned, transparent
/// huge pages advised) for large buffers, the heap for small ones.
/// Thread-safe.
///
/// Recycling: a fresh mapping costs its page faults and every registrar's
/// registration (CUDA page locking runs at about 5 GB/s on the H200 machine:
/// half of a 16 GB anchor's stage). With a recycling limit, released mapped
/// buffers are kept, registered, up to that many bytes (the oldest go first
/// when more come), and an allocation of the same size takes one back
/// instead of mapping anew. A replica's versions repeat their tensors'
/// sizes, so from its third version on a staged version's buffers are the
/// ones its last but one released. The limit is the sum of what the users
/// that want it reserve (`recycling_reservation`); 0, the default, keeps
/// nothing.
class host_allocator {
public:
  host_allocator();
  /// Frees what it keeps.
  ~host_allocator();
  host_allocator(const host_allocator&) = delete;
  host_allocator& operator=(const host_allocator&) = delete;

  /// An uninitialized buffer of `bytes` (0 gives an empty buffer);
  /// `limit_exceeded` when the memory is not there.
  result<host_buffer> allocate(size_t bytes);
  /// Registers every buffer allocated from now on.
  void add_registrar(std::shared_ptr<buffer_registrar> registrar);

  struct recycling_stats {
    uint64_t limit = 0;
    /// Released buffers kept now: their number and mapped bytes.
    uint64_t kept = 0;
    uint64_t kept_bytes = 0;
    /// Allocations served by a kept buffer, and their bytes.
    uint64_t reused = 0;
    uint64_t reused_bytes = 0;
  };
  recycling_stats recycling() const;

private:
  friend class recycling_reservation;
  void change_recycling_limit(uint64_t add, uint64_t remove);

  std::mutex mutex_;
  std::shared_ptr<const host_buffer::registrars> registrars_ =
    std::make_shared<const host_buffer::registrars>();
  std::shared_ptr<host_recycler> recycler_;
};

/// Raises an allocator's recycling limit by `bytes` while it lives.
class recycling_reservation {
public:
  recycling_reservation() = default;
  recycling_reservation(host_allocator& allocator, uint64_t bytes);
  recycling_reservation(recycling_reservation&& other) noexcept;
  recycling_reservation& operator=(recycling_reservation&& other) noexcept;
  recycling_reservation(const recycling_reservation&) = delete;
  recycling_reservation& operator=(const recycling_reservation&) = delete;
  ~recycling_reservation();

private:
  host_allocator* allocator_ = nullptr;
  uint64_t bytes_ = 0;
};

/// The process-wide allocator.
host_allocator& staging_allocator();

} // namespace stitch::gpu
