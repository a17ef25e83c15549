#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "gpu/host_buffer.hpp"
#include "runtime/core/error.hpp"

/// Device memory, streams and events with RAII, and the operations the
/// staging pipeline needs on them, behind an interface free of CUDA headers.
///
/// Every object names the device it lives on: a CUDA device (0, 1, ...), or
/// `host_device` (-1), the CPU standing in with the same API: buffers in host
/// memory, streams that run each operation at once, kernels on the thread
/// pool. Code above (the staging pipeline, the engine) runs unchanged on a
/// machine without CUDA, and the tests compare both sides on the same inputs.
/// CUDA errors carry CUDA's own text and name the call that failed.
namespace stitch::gpu {

inline constexpr int host_device = -1;

namespace detail {
/// Destroy a `cudaStream_t` / `cudaEvent_t` (null: nothing).
struct stream_release {
  void operator()(void* stream) const noexcept;
};
struct event_release {
  void operator()(void* event) const noexcept;
};
} // namespace detail

/// Device memory: `cudaMalloc` (never managed memory) on a CUDA device, the
/// staging allocator on the host. Move-only; freed when destroyed.
class device_buffer {
public:
  device_buffer() = default;
  device_buffer(device_buffer&& other) noexcept;
  device_buffer& operator=(device_buffer&& other) noexcept;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer();

  /// `bytes` of uninitialized memory on `device`; `limit_exceeded` naming the
  /// size and the device when it is not there.
  static result<device_buffer> allocate(int device, size_t bytes);

  void* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  bool on_host() const noexcept { return device_ == host_device; }
  /// The bytes, for a buffer on the host (empty otherwise).
  std::span<std::byte> host_bytes() const noexcept;

private:
  void release() noexcept;
  void* data_ = nullptr;
  size_t size_ = 0;
  int device_ = host_device;
  host_buffer host_;
};

/// An ordered queue of device work (`cudaStream_t`, non-blocking); on the
/// host, operations complete before they return.
class device_stream {
public:
  static result<device_stream> create(int device);

  int device() const noexcept { return device_; }
  /// The `cudaStream_t` (null on the host).
  void* native() const noexcept { return stream_.get(); }
  /// Waits for everything queued; a kernel's fault surfaces here.
  status synchronize();

private:
  std::unique_ptr<void, detail::stream_release> stream_;
  int device_ = host_device;
};

/// A point in a stream (`cudaEvent_t`, timing enabled); on the host, the
/// wall-clock time it was recorded.
class device_event {
public:
  static result<device_event> create(int device);

  status record(device_stream& stream);
  /// Waits until the work before the recording is done.
  status synchronize();
  /// Milliseconds from `start` to this event (both recorded and done).
  result<double> elapsed_ms_since(const device_event& start) const;

private:
  std::unique_ptr<void, detail::event_release> event_;
  int device_ = host_device;
  double host_ms_ = 0;
};

/// Queues a copy of host bytes into `dst` at `offset`. From pageable memory
/// CUDA stages through its own buffer; from pinned memory (a
/// `pinned_registrar`'s buffers, `pinned_buffer`) it is a DMA that overlaps
/// with compute on other streams. The host bytes must stay valid until the
/// stream passes the copy.
status copy_to_device(const device_buffer& dst, size_t offset, std::span<const std::byte> src,
                      device_stream& stream);
/// Queues a copy of `dst.size()` bytes of `src` at `offset` into host memory.
status copy_to_host(std::span<std::byte> dst, const device_buffer& src, size_t offset,
                    device_stream& stream);
/// Queues a copy of `n` bytes between buffers of the same device.
status copy_on_device(const device_buffer& dst, size_t dst_offset, const device_buffer& src,
                      size_t src_offset, size_t n, device_stream& stream);
/// Queues `dst[dst_offset ..] ^= delta[delta_offset ..]` over `n` bytes
/// (the `xor` delta encoding of DESIGN §1), both on the same device.
status xor_on_device(const device_buffer& dst, size_t dst_offset, const device_buffer& delta,
                     size_t delta_offset, size_t n, device_stream& stream);
/// The DESIGN §1 checksum (`xxh3-64-tree-1MiB`) of `n` bytes of `buffer` at
/// `offset` (a multiple of 8), computed where the bytes are; waits for the
/// stream. Equal to `checksum::tree_checksum` of the same bytes.
result<uint64_t> device_tree_checksum(const device_buffer& buffer, size_t offset, size_t n,
                                      device_stream& stream);

struct device_memory_info {
  size_t free = 0;
  size_t total = 0;
};

/// Free and total memory of `device` (the host's available and total
/// memory for `host_device`).
result<device_memory_info> memory_info(int device);
/// "NVIDIA H200", or "host".
std::string device_name(int device);

/// Page-locks the staging allocator's buffers for `device`'s DMA
/// (`cudaHostRegister`), in place: what lands in staging buffers is copied
/// to the device without a bounce through CUDA's own buffers. A buffer that
/// cannot be locked (the limit of locked memory) stays pageable, and is
/// counted in `refused()`; copies from it are then slower, never wrong.
class pinned_registrar final : public buffer_registrar {
public:
  status on_allocate(std::span<std::byte> buffer) override;
  void on_release(std::span<std::byte> buffer) noexcept override;
  uint64_t registered() const noexcept;
  uint64_t refused() const noexcept;

private:
  struct counters;
  std::shared_ptr<counters> counters_;

public:
  pinned_registrar();
};

/// Host memory allocated page-locked (`cudaHostAlloc`), for the staging
/// pipeline's own ring; plain host memory on the host device.
class pinned_buffer {
public:
  pinned_buffer() = default;
  pinned_buffer(pinned_buffer&& other) noexcept;
  pinned_buffer& operator=(pinned_buffer&& other) noexcept;
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer();

  static result<pinned_buffer> allocate(int device, size_t bytes);
  std::span<std::byte> bytes() const noexcept { return {data_, size_}; }

private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
  host_buffer host_;
};

} // namespace stitch::gpu
