#include "gpu/device_memory.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gpu/checksum.hpp"
#include "gpu/cuda_backend.hpp"
#include "runtime/core/checksum.hpp"

namespace stitch::gpu {

namespace {

status out_of_range(const char* what, size_t offset, size_t n, size_t size) {
  return make_error(errc::invalid_argument, std::string{what} + ": " + std::to_string(n)
                                              + " bytes at offset " + std::to_string(offset)
                                              + " do not fit a buffer of " + std::to_string(size));
}

bool fits(size_t offset, size_t n, size_t size) {
  return offset <= size && n <= size - offset;
}

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

std::byte* host_at(const device_buffer& b, size_t offset) {
  return static_cast<std::byte*>(b.data()) + offset;
}

} // namespace

// --- device_buffer --------------------------------------------------------

device_buffer::device_buffer(device_buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)),
      device_(std::exchange(other.device_, host_device)), host_(std::move(other.host_)) {}

device_buffer& device_buffer::operator=(device_buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = std::exchange(other.device_, host_device);
    host_ = std::move(other.host_);
  }
  return *this;
}

device_buffer::~device_buffer() {
  release();
}

void device_buffer::release() noexcept {
  if (device_ != host_device && data_)
    cuda::free(device_, data_);
  host_ = host_buffer{};
  data_ = nullptr;
  size_ = 0;
}

result<device_buffer> device_buffer::allocate(int device, size_t bytes) {
  device_buffer out;
  out.device_ = device;
  out.size_ = bytes;
  if (device == host_device) {
    auto b = staging_allocator().allocate(bytes);
    if (!b)
      return std::move(b).error();
    out.host_ = std::move(*b);
    out.data_ = out.host_.data();
    return out;
  }
  if (bytes == 0)
    return out;
  void* p = nullptr;
  if (auto ok = cuda::malloc(device, bytes, &p); !ok)
    return std::move(ok).error();
  out.data_ = p;
  return out;
}

std::span<std::byte> device_buffer::host_bytes() const noexcept {
  if (!on_host())
    return {};
  return {static_cast<std::byte*>(data_), size_};
}

// --- device_stream --------------------------------------------------------

void detail::stream_release::operator()(void* stream) const noexcept {
  cuda::stream_destroy(stream);
}

void detail::event_release::operator()(void* event) const noexcept {
  cuda::event_destroy(event);
}

result<device_stream> device_stream::create(int device) {
  device_stream out;
  out.device_ = device;
  if (device == host_device)
    return out;
  void* stream = nullptr;
  if (auto ok = cuda::stream_create(device, &stream); !ok)
    return std::move(ok).error();
  out.stream_.reset(stream);
  return out;
}

status device_stream::synchronize() {
  if (device_ == host_device)
    return {};
  return cuda::stream_sync(stream_.get());
}

// --- device_event ---------------------------------------------------------

result<device_event> device_event::create(int device) {
  device_event out;
  out.device_ = device;
  if (device == host_device)
    return out;
  void* event = nullptr;
  if (auto ok = cuda::event_create(device, &event); !ok)
    return std::move(ok).error();
  out.event_.reset(event);
  return out;
}

status device_event::record(device_stream& stream) {
  if (device_ == host_device) {
    host_ms_ = now_ms();
    return {};
  }
  return cuda::event_record(event_.get(), stream.native());
}

status device_event::synchronize() {
  if (device_ == host_device)
    return {};
  return cuda::event_sync(event_.get());
}

result<double> device_event::elapsed_ms_since(const device_event& start) const {
  if (device_ == host_device)
    return host_ms_ - start.host_ms_;
  return cuda::event_elapsed_ms(start.event_.get(), event_.get());
}

// --- operations -----------------------------------------------------------

status copy_to_device(const device_buffer& dst, size_t offset, std::span<const std::byte> src,
                      device_stream& stream) {
  if (!fits(offset, src.size(), dst.size()))
    return out_of_range("copy to the device", offset, src.size(), dst.size());
  if (dst.on_host()) {
    if (!src.empty())
      std::memcpy(host_at(dst, offset), src.data(), src.size());
    return {};
  }
  return cuda::memcpy_async(host_at(dst, offset), src.data(), src.size(), stream.native(),
                            "host-to-device copy");
}

status copy_to_host(std::span<std::byte> dst, const device_buffer& src, size_t offset,
                    device_stream& stream) {
  if (!fits(offset, dst.size(), src.size()))
    return out_of_range("copy to the host", offset, dst.size(), src.size());
  if (src.on_host()) {
    if (!dst.empty())
      std::memcpy(dst.data(), host_at(src, offset), dst.size());
    return {};
  }
  return cuda::memcpy_async(dst.data(), host_at(src, offset), dst.size(), stream.native(),
                            "device-to-host copy");
}

status copy_on_device(const device_buffer& dst, size_t dst_offset, const device_buffer& src,
                      size_t src_offset, size_t n, device_stream& stream) {
  if (!fits(dst_offset, n, dst.size()))
    return out_of_range("copy on the device", dst_offset, n, dst.size());
  if (!fits(src_offset, n, src.size()))
    return out_of_range("copy on the device", src_offset, n, src.size());
  if (dst.device() != src.device())
    return make_error(errc::invalid_argument, "copy on the device between devices "
                                                + std::to_string(src.device()) + " and "
                                                + std::to_string(dst.device()));
  if (dst.on_host()) {
    if (n > 0)
      std::memmove(host_at(dst, dst_offset), host_at(src, src_offset), n);
    return {};
  }
  return cuda::memcpy_async(host_at(dst, dst_offset), host_at(src, src_offset), n, stream.native(),
                            "device-to-device copy");
}

status xor_on_device(const device_buffer& dst, size_t dst_offset, const device_buffer& delta,
                     size_t delta_offset, size_t n, device_stream& stream) {
  if (!fits(dst_offset, n, dst.size()))
    return out_of_range("xor on the device", dst_offset, n, dst.size());
  if (!fits(delta_offset, n, delta.size()))
    return out_of_range("xor on the device", delta_offset, n, delta.size());
  if (dst.device() != delta.device())
    return make_error(errc::invalid_argument, "xor on the device between devices "
                                                + std::to_string(delta.device()) + " and "
                                                + std::to_string(dst.device()));
  if (dst.on_host())
    return parallel_xor_apply({host_at(dst, dst_offset), n}, {host_at(delta, delta_offset), n});
  return cuda::xor_async(dst.device(), host_at(dst, dst_offset), host_at(delta, delta_offset), n,
                         stream.native());
}

result<uint64_t> device_tree_checksum(const device_buffer& buffer, size_t offset, size_t n,
                                      device_stream& stream) {
  if (!fits(offset, n, buffer.size()))
    return out_of_range("device checksum", offset, n, buffer.size()).error();
  if (buffer.on_host())
    return parallel_tree_checksum({host_at(buffer, offset), n});
  if (offset % 8 != 0)
    return make_error(errc::invalid_argument, "device checksum at offset " + std::to_string(offset)
                                                + ", which is not a multiple of 8");
  std::vector<uint64_t> digests(checksum::chunk_count(n));
  if (auto ok = cuda::chunk_digests(host_at(buffer, offset), n, digests.data(), stream.native());
      !ok)
    return std::move(ok).error();
  // A last chunk of 240 bytes or less takes XXH3's short paths: hashed here.
  if (!digests.empty()) {
    const size_t last = (digests.size() - 1) * checksum::chunk_size;
    if (n - last <= 240) {
      std::byte tail[240];
      std::span<std::byte> bytes{tail, n - last};
      if (auto ok = copy_to_host(bytes, buffer, offset + last, stream); !ok)
        return std::move(ok).error();
      if (auto ok = stream.synchronize(); !ok)
        return std::move(ok).error();
      digests.back() = checksum::chunk_digest(bytes);
    }
  }
  return checksum::combine(digests);
}

result<device_memory_info> memory_info(int device) {
  device_memory_info info;
  if (device != host_device) {
    if (auto ok = cuda::mem_info(device, info.free, info.total); !ok)
      return std::move(ok).error();
    return info;
  }
  std::ifstream meminfo{"/proc/meminfo"};
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemTotal:")
      info.total = kib * 1024;
    else if (key == "MemAvailable:")
      info.free = kib * 1024;
  }
  if (info.total == 0)
    return make_error(errc::engine_unavailable, "cannot read /proc/meminfo");
  return info;
}

std::string device_name(int device) {
  return device == host_device ? std::string{"host"} : cuda::device_name(device);
}

// --- pinned memory --------------------------------------------------------

/// Buffers below this stay pageable: registering costs more than it saves.
constexpr size_t pin_threshold = size_t{1} << 20;

struct pinned_registrar::counters {
  std::atomic<uint64_t> registered{0};
  std::atomic<uint64_t> refused{0};
  std::mutex mutex;
  std::unordered_set<void*> pinned;
};

pinned_registrar::pinned_registrar() : counters_(std::make_shared<counters>()) {}

status pinned_registrar::on_allocate(std::span<std::byte> buffer) {
  if (buffer.size() < pin_threshold)
    return {};
  if (auto ok = cuda::host_register(buffer.data(), buffer.size()); !ok) {
    counters_->refused.fetch_add(1);
    return {};
  }
  counters_->registered.fetch_add(1);
  std::lock_guard guard{counters_->mutex};
  counters_->pinned.insert(buffer.data());
  return {};
}

void pinned_registrar::on_release(std::span<std::byte> buffer) noexcept {
  {
    std::lock_guard guard{counters_->mutex};
    if (counters_->pinned.erase(buffer.data()) == 0)
      return;
  }
  cuda::host_unregister(buffer.data());
}

uint64_t pinned_registrar::registered() const noexcept {
  return counters_->registered.load();
}

uint64_t pinned_registrar::refused() const noexcept {
  return counters_->refused.load();
}

pinned_buffer::pinned_buffer(pinned_buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)),
      pinned_(std::exchange(other.pinned_, false)), host_(std::move(other.host_)) {}

pinned_buffer& pinned_buffer::operator=(pinned_buffer&& other) noexcept {
  if (this != &other) {
    if (pinned_)
      cuda::host_free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    pinned_ = std::exchange(other.pinned_, false);
    host_ = std::move(other.host_);
  }
  return *this;
}

pinned_buffer::~pinned_buffer() {
  if (pinned_)
    cuda::host_free(data_);
}

result<pinned_buffer> pinned_buffer::allocate(int device, size_t bytes) {
  pinned_buffer out;
  out.size_ = bytes;
  if (device == host_device || bytes == 0) {
    auto b = staging_allocator().allocate(bytes);
    if (!b)
      return std::move(b).error();
    out.host_ = std::move(*b);
    out.data_ = out.host_.data();
    return out;
  }
  void* p = nullptr;
  if (auto ok = cuda::host_alloc(bytes, &p); !ok)
    return std::move(ok).error();
  out.data_ = static_cast<std::byte*>(p);
  out.pinned_ = true;
  return out;
}

} // namespace stitch::gpu

#ifndef STITCH_HAVE_CUDA
// The build has no nvcc: every CUDA call says so. `device_count` is 0, so
// nothing asks for a device unless told to, and then it hears why not.
namespace stitch::gpu::cuda {

namespace {
status absent() {
  return make_error(errc::engine_unavailable, "this build of Stitch has no CUDA (no nvcc)");
}
} // namespace

int device_count() noexcept {
  return 0;
}
std::string device_name(int device) {
  return "CUDA device " + std::to_string(device);
}
status mem_info(int, size_t&, size_t&) {
  return absent();
}
status malloc(int, size_t, void**) {
  return absent();
}
void free(int, void*) noexcept {}
status host_alloc(size_t, void**) {
  return absent();
}
void host_free(void*) noexcept {}
status host_register(void*, size_t) {
  return absent();
}
void host_unregister(void*) noexcept {}
status stream_create(int, void**) {
  return absent();
}
void stream_destroy(void*) noexcept {}
status stream_sync(void*) {
  return absent();
}
status event_create(int, void**) {
  return absent();
}
void event_destroy(void*) noexcept {}
status event_record(void*, void*) {
  return absent();
}
status event_sync(void*) {
  return absent();
}
result<bool> event_done(void*) {
  return absent().error();
}
result<double> event_elapsed_ms(void*, void*) {
  return absent().error();
}
status stream_wait(void*, void*) {
  return absent();
}
status memcpy_async(void*, const void*, size_t, void*, const char*) {
  return absent();
}
status xor_async(int, void*, const void*, size_t, void*) {
  return absent();
}
status chunk_digests(const void*, size_t, uint64_t*, void*) {
  return absent();
}

} // namespace stitch::gpu::cuda
#endif
