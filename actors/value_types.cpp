#include "actors/value_types.hpp"

#include <caf/actor_system.hpp>
#include <caf/message.hpp>

#include <array>
#include <mutex>
#include <vector>

namespace stitch {

caf::error to_caf_error(const error& err) {
  return caf::make_error(err.code, err.message);
}

error from_caf_error(const caf::actor_system& sys, const caf::error& err) {
  if (!err)
    return {};
  if (err.category() == caf::atom("stitch")) {
    std::string message;
    const auto& ctx = err.context();
    if (ctx.match_elements<std::string>())
      message = ctx.get_as<std::string>(0);
    return error{static_cast<errc>(err.code()), std::move(message)};
  }
  return error{errc::backend_failure, sys.render(err)};
}

namespace {

/// Recycled piece buffers in size classes of whole MiB (a piece of at most
/// `max_chunk_bytes` takes the class it fits).
class piece_pool {
public:
  static constexpr size_t granule = size_t{1} << 20;
  static constexpr size_t classes = max_chunk_bytes / granule;
  static constexpr size_t kept_limit = size_t{64} << 20;

  result<piece_buffer> take(size_t size) {
    if (size > max_chunk_bytes)
      return make_error(errc::limit_exceeded, "a piece of " + std::to_string(size)
                                                + " bytes is over the limit of "
                                                + std::to_string(max_chunk_bytes));
    if (size == 0) {
      // Nothing to hold: an owner that keeps nothing alive.
      static char none = 0;
      return piece_buffer{std::shared_ptr<const void>{std::shared_ptr<const void>{}, &none}, &none,
                          0};
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
      return make_error(errc::limit_exceeded,
                        "no memory for a piece of " + std::to_string(size) + " bytes");
    std::shared_ptr<const void> owner{raw, [this, cls](const void* p) {
                                        give_back(cls, static_cast<char*>(const_cast<void*>(p)));
                                      }};
    return piece_buffer{std::move(owner), raw, size};
  }

private:
  void give_back(size_t cls, char* raw) noexcept {
    {
      std::lock_guard lock{mutex_};
      if (kept_ + cls * granule <= kept_limit) {
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

  std::mutex mutex_;
  std::array<std::vector<char*>, classes> free_;
  size_t kept_ = 0;
};

} // namespace

result<piece_buffer> take_piece_buffer(size_t size) {
  // Never destroyed: pieces may be released while the process exits.
  static auto* pool = new piece_pool;
  return pool->take(size);
}

void warm_piece_buffers(size_t count, size_t size) {
  constexpr size_t page = 4096;
  std::vector<piece_buffer> held;
  held.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    auto b = take_piece_buffer(size);
    if (!b)
      break;
    // A write per page: the pages of a recycled buffer are already there.
    for (size_t at = 0; at < b->size; at += page)
      reinterpret_cast<volatile char*>(b->data)[at] = 0;
    held.push_back(std::move(*b));
  }
  // All go back to the pool here, as far as it keeps them.
}

} // namespace stitch
