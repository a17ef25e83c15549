#include "actors/value_types.hpp"

#include <caf/actor_system.hpp>
#include <caf/message.hpp>

#include "transport/buffer_pool.hpp"

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

result<piece_buffer> take_piece_buffer(size_t size) {
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
  // Never destroyed: pieces may be released while the process exits.
  static auto* pool = new transport::buffer_pool{max_chunk_bytes, size_t{64} << 20};
  auto raw = pool->take(size);
  if (!raw)
    return make_error(errc::limit_exceeded,
                      "no memory for a piece of " + std::to_string(size) + " bytes");
  char* data = raw.get();
  return piece_buffer{std::shared_ptr<const void>{std::move(raw), data}, data, size};
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
