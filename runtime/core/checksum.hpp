#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "runtime/core/error.hpp"

namespace stitch {

/// Runs `fn(0) ... fn(n - 1)`, possibly concurrently, and returns when all
/// calls are done. The seam through which the pure core is parallelized: the
/// core only ships the sequential runner; `gpu/` provides a thread pool.
class parallel_for {
public:
  virtual ~parallel_for() = default;
  virtual void run(size_t n, const std::function<void(size_t)>& fn) = 0;
};

/// Runs every index in order on the calling thread.
class sequential_for final : public parallel_for {
public:
  void run(size_t n, const std::function<void(size_t)>& fn) override;
};

} // namespace stitch

/// The DESIGN §1 tensor checksum `xxh3-64-tree-1MiB`: the xxh3-64 (seed 0) of
/// each 1 MiB chunk (the last one shorter), then the xxh3-64 of those digests
/// concatenated as little-endian 8-byte words. An empty tensor has no chunks,
/// so its checksum is the xxh3-64 of the empty string (0x2d06800538d394c2).
namespace stitch::checksum {

inline constexpr size_t chunk_size = size_t{1} << 20;

/// xxh3-64 with seed 0 of one chunk.
uint64_t chunk_digest(std::span<const std::byte> chunk) noexcept;

/// xxh3-64 of the digests written as consecutive little-endian 8-byte words.
uint64_t combine(std::span<const uint64_t> digests) noexcept;

/// Number of chunks of a tensor of `size` bytes (0 for an empty tensor).
constexpr size_t chunk_count(size_t size) noexcept {
  return size / chunk_size + (size % chunk_size != 0 ? 1 : 0);
}

/// The checksum, sequentially.
uint64_t tree_checksum(std::span<const std::byte> bytes) noexcept;

/// The checksum with the chunks hashed through `runner`; same value.
uint64_t tree_checksum(std::span<const std::byte> bytes, parallel_for& runner);

/// Computes the checksum of bytes that arrive in pieces of any size (e.g.
/// from the network) without buffering a chunk; `digest` equals
/// `tree_checksum` of everything given to `update` so far. A moved-from
/// hasher may only be assigned to or destroyed.
class tree_hasher {
public:
  tree_hasher();
  ~tree_hasher();
  tree_hasher(tree_hasher&&) noexcept;
  tree_hasher& operator=(tree_hasher&&) noexcept;
  tree_hasher(const tree_hasher&) = delete;
  tree_hasher& operator=(const tree_hasher&) = delete;

  void update(std::span<const std::byte> bytes) noexcept;

  /// The checksum of the bytes so far; does not end the stream.
  uint64_t digest() const noexcept;

  /// Starts over, as if newly constructed.
  void reset() noexcept;

  uint64_t size() const noexcept { return size_; }

private:
  struct states;

  void finish_chunk(uint64_t chunk_digest) noexcept;

  std::unique_ptr<states> states_;
  size_t in_chunk_ = 0;
  uint64_t size_ = 0;
};

/// 16 lowercase hex digits, most significant first (as in manifests).
std::string to_hex(uint64_t digest);

/// Parses exactly 16 lowercase hex digits; anything else is `invalid_argument`.
result<uint64_t> parse_hex(std::string_view text);

} // namespace stitch::checksum
