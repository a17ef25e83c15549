#include "transport/buffer_pool.hpp"

#include <new>

namespace stitch::transport {

buffer_pool::buffer_pool(size_t max_buffer, size_t kept_limit)
    : max_buffer_(max_buffer), kept_limit_(kept_limit),
      free_((max_buffer + granule - 1) / granule) {}

buffer_pool::~buffer_pool() {
  for (auto& cls : free_)
    for (char* raw : cls)
      delete[] raw;
}

std::shared_ptr<char[]> buffer_pool::take(size_t size) noexcept {
  if (size == 0 || size > max_buffer_) {
    char* raw = new (std::nothrow) char[size == 0 ? 1 : size];
    if (!raw)
      return nullptr;
    try {
      return std::shared_ptr<char[]>{raw};
    } catch (const std::bad_alloc&) {
      // The shared_ptr deleted `raw` already.
      return nullptr;
    }
  }
  const size_t cls = (size + granule - 1) / granule;
  char* raw = nullptr;
  {
    std::lock_guard lock{mutex_};
    auto& free = free_[cls - 1];
    if (!free.empty()) {
      raw = free.back();
      free.pop_back();
      kept_ -= cls * granule;
    }
  }
  if (!raw)
    raw = new (std::nothrow) char[cls * granule];
  if (!raw)
    return nullptr;
  try {
    return std::shared_ptr<char[]>{raw, [this, cls](char* p) { give_back(cls, p); }};
  } catch (const std::bad_alloc&) {
    // No room for the control block: the deleter gave `raw` back already.
    return nullptr;
  }
}

size_t buffer_pool::kept() const {
  std::lock_guard lock{mutex_};
  return kept_;
}

void buffer_pool::give_back(size_t cls, char* raw) noexcept {
  {
    std::lock_guard lock{mutex_};
    if (kept_ + cls * granule <= kept_limit_) {
      try {
        free_[cls - 1].push_back(raw);
        kept_ += cls * granule;
        return;
      } catch (...) {
        // No room to remember it: free it below.
      }
    }
  }
  delete[] raw;
}

} // namespace stitch::transport
