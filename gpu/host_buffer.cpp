#include "gpu/host_buffer.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace stitch::gpu {

namespace {

/// Smaller buffers come from the heap: a mapping per small buffer costs more
/// than it saves.
constexpr size_t map_threshold = size_t{4} << 20;
constexpr size_t huge_page = size_t{2} << 20;

} // namespace

host_buffer::host_buffer(host_buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)), registrars_(std::move(other.registrars_)) {}

host_buffer& host_buffer::operator=(host_buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    registrars_ = std::move(other.registrars_);
  }
  return *this;
}

host_buffer::~host_buffer() {
  release();
}

void host_buffer::release() noexcept {
  if (!data_)
    return;
  if (registrars_)
    for (const auto& r : *registrars_)
      r->on_release({data_, size_});
  if (mapped_ != 0)
    ::munmap(data_, mapped_);
  else
    std::free(data_);
  data_ = nullptr;
  size_ = 0;
  mapped_ = 0;
}

result<host_buffer> host_allocator::allocate(size_t bytes) {
  if (bytes == 0)
    return host_buffer{};
  std::shared_ptr<const host_buffer::registrars> regs;
  {
    std::lock_guard guard{mutex_};
    regs = registrars_;
  }
  std::byte* data = nullptr;
  size_t mapped = 0;
  if (bytes < map_threshold) {
    data = static_cast<std::byte*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    if (!data)
      return make_error(errc::limit_exceeded,
                        "cannot allocate " + std::to_string(bytes) + " bytes of host memory");
  } else {
    // Over-map by one huge page so the buffer can start on a 2 MiB boundary.
    const size_t want = (bytes + huge_page - 1) / huge_page * huge_page;
    const size_t span = want + huge_page;
    void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
      return make_error(errc::limit_exceeded, "cannot map " + std::to_string(bytes)
                                                + " bytes of host memory: " + std::strerror(errno));
    auto base = reinterpret_cast<uintptr_t>(raw);
    auto aligned = (base + huge_page - 1) / huge_page * huge_page;
    // Give back the unaligned head and the tail beyond `want`.
    if (aligned > base)
      ::munmap(raw, aligned - base);
    const size_t tail = base + span - (aligned + want);
    if (tail > 0)
      ::munmap(reinterpret_cast<void*>(aligned + want), tail);
    data = reinterpret_cast<std::byte*>(aligned);
    mapped = want;
    (void) ::madvise(data, mapped, MADV_HUGEPAGE);
  }
  host_buffer out{data, bytes, mapped, regs};
  for (const auto& r : *regs)
    if (auto ok = r->on_allocate({data, bytes}); !ok)
      return std::move(ok).error();
  return out;
}

void host_allocator::add_registrar(std::shared_ptr<buffer_registrar> registrar) {
  std::lock_guard guard{mutex_};
  auto next = std::make_shared<host_buffer::registrars>(*registrars_);
  next->push_back(std::move(registrar));
  registrars_ = std::move(next);
}

host_allocator& staging_allocator() {
  static host_allocator instance;
  return instance;
}

} // namespace stitch::gpu
