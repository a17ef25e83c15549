#include "gpu/host_buffer.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace stitch::gpu {

namespace {

/// Smaller buffers come from the heap: a mapping per small buffer costs more
/// than it saves.
constexpr size_t map_threshold = size_t{4} << 20;
constexpr size_t huge_page = size_t{2} << 20;

/// Unregisters and frees a buffer for good.
void free_buffer(std::byte* data, size_t size, size_t mapped,
                 const std::vector<std::shared_ptr<buffer_registrar>>* regs) noexcept {
  if (regs)
    for (const auto& r : *regs)
      r->on_release({data, size});
  if (mapped != 0)
    ::munmap(data, mapped);
  else
    std::free(data);
}

} // namespace

/// The released buffers an allocator keeps, oldest first.
struct host_recycler {
  struct entry {
    std::byte* data = nullptr;
    size_t size = 0;
    size_t mapped = 0;
    std::shared_ptr<const host_buffer::registrars> regs;
  };

  mutable std::mutex mutex;
  std::list<entry> kept;
  uint64_t limit = 0;
  uint64_t kept_bytes = 0;
  uint64_t reused = 0;
  uint64_t reused_bytes = 0;

  /// The oldest entries until `kept_bytes + room <= limit`, out of the list
  /// (freed by the caller outside the lock). Under `mutex`.
  std::list<entry> evict_for(uint64_t room) {
    std::list<entry> out;
    while (!kept.empty() && kept_bytes + room > limit) {
      kept_bytes -= kept.front().mapped;
      out.splice(out.end(), kept, kept.begin());
    }
    return out;
  }

  static void free_all(std::list<entry>& entries) noexcept {
    for (auto& e : entries)
      free_buffer(e.data, e.size, e.mapped, e.regs.get());
    entries.clear();
  }
};

host_buffer::host_buffer(host_buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)), registrars_(std::move(other.registrars_)),
      recycler_(std::move(other.recycler_)) {}

host_buffer& host_buffer::operator=(host_buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    registrars_ = std::move(other.registrars_);
    recycler_ = std::move(other.recycler_);
  }
  return *this;
}

host_buffer::~host_buffer() {
  release();
}

void host_buffer::release() noexcept {
  if (!data_)
    return;
  bool kept = false;
  if (recycler_ && mapped_ != 0) {
    std::list<host_recycler::entry> evicted;
    try {
      std::lock_guard guard{recycler_->mutex};
      if (mapped_ <= recycler_->limit) {
        evicted = recycler_->evict_for(mapped_);
        recycler_->kept.push_back({data_, size_, mapped_, registrars_});
        recycler_->kept_bytes += mapped_;
        kept = true;
      }
    } catch (...) {
      // No memory for the entry: the buffer is freed instead.
    }
    host_recycler::free_all(evicted);
  }
  if (!kept)
    free_buffer(data_, size_, mapped_, registrars_.get());
  data_ = nullptr;
  size_ = 0;
  mapped_ = 0;
  registrars_.reset();
  recycler_.reset();
}

host_allocator::host_allocator() : recycler_(std::make_shared<host_recycler>()) {}

host_allocator::~host_allocator() {
  std::list<host_recycler::entry> all;
  {
    std::lock_guard guard{recycler_->mutex};
    recycler_->limit = 0;
    all = recycler_->evict_for(0);
  }
  host_recycler::free_all(all);
}

void host_allocator::change_recycling_limit(uint64_t add, uint64_t remove) {
  std::list<host_recycler::entry> evicted;
  {
    std::lock_guard guard{recycler_->mutex};
    recycler_->limit += add;
    recycler_->limit -= std::min(remove, recycler_->limit);
    evicted = recycler_->evict_for(0);
  }
  host_recycler::free_all(evicted);
}

host_allocator::recycling_stats host_allocator::recycling() const {
  std::lock_guard guard{recycler_->mutex};
  return {recycler_->limit, recycler_->kept.size(), recycler_->kept_bytes, recycler_->reused,
          recycler_->reused_bytes};
}

recycling_reservation::recycling_reservation(host_allocator& allocator, uint64_t bytes)
    : allocator_(&allocator), bytes_(bytes) {
  allocator_->change_recycling_limit(bytes_, 0);
}

recycling_reservation::recycling_reservation(recycling_reservation&& other) noexcept
    : allocator_(std::exchange(other.allocator_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {
}

recycling_reservation& recycling_reservation::operator=(recycling_reservation&& other) noexcept {
  if (this != &other) {
    if (allocator_)
      allocator_->change_recycling_limit(0, bytes_);
    allocator_ = std::exchange(other.allocator_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

recycling_reservation::~recycling_reservation() {
  if (allocator_)
    allocator_->change_recycling_limit(0, bytes_);
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
  if (bytes >= map_threshold) {
    // A kept buffer of this size, registered by the registrars of now (kept
    // ones of this size from before a registrar was added are freed).
    std::optional<host_recycler::entry> found;
    std::list<host_recycler::entry> stale;
    {
      std::lock_guard guard{recycler_->mutex};
      for (auto it = recycler_->kept.end(); it != recycler_->kept.begin() && !found;) {
        --it;
        if (it->size != bytes)
          continue;
        recycler_->kept_bytes -= it->mapped;
        if (it->regs == regs) {
          found = std::move(*it);
          recycler_->kept.erase(it);
          ++recycler_->reused;
          recycler_->reused_bytes += bytes;
        } else {
          auto next = std::next(it);
          stale.splice(stale.end(), recycler_->kept, it);
          it = next;
        }
      }
    }
    host_recycler::free_all(stale);
    if (found)
      return host_buffer{found->data, found->size, found->mapped, std::move(found->regs),
                         recycler_};
  }
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
  host_buffer out{data, bytes, mapped, regs, nullptr};
  for (const auto& r : *regs)
    if (auto ok = r->on_allocate({data, bytes}); !ok)
      return std::move(ok).error();
  // Kept when released only once every registrar has it.
  if (mapped != 0)
    out.recycler_ = recycler_;
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
