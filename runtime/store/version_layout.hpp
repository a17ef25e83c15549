#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/core/store_port.hpp"

namespace stitch::store {

/// Where a tensor's stored bytes live: `size` bytes at `offset` of shard
/// `shard` (an index into `version_layout::shards`).
struct tensor_location {
  uint32_t shard = 0;
  uint64_t offset = 0;
  uint64_t size = 0;

  friend bool operator==(const tensor_location&, const tensor_location&) = default;
};

/// A stored version's physical layout, shared by every backend.
struct version_layout {
  std::vector<std::string> shards;
  std::vector<uint64_t> shard_sizes;
  std::map<std::string, tensor_location> tensors;

  friend bool operator==(const version_layout&, const version_layout&) = default;
};

/// Bytes a backend persists per piece: shards are cut at multiples of this.
inline constexpr size_t piece_size = size_t{8} << 20;

/// Receives shard `shard`'s bytes at `offset` (a multiple of `piece_size`),
/// at most `piece_size` at a time, in order.
using piece_writer =
  std::function<status(uint32_t shard, uint64_t offset, std::span<const std::byte> bytes)>;

/// Streams the shards of a version being published to `write`, checking them
/// against the manifest as they pass: each manifest shard exactly once, a
/// valid safetensors header, exactly the tensors the weight_map assigns to it,
/// no truncation or trailing bytes, `total_size` equal to the tensor bytes,
/// and — for a full anchor, whose stored bytes are the resulting bytes — every
/// tensor's checksum. Memory stays bounded by one piece plus one header.
result<version_layout> ingest_version(const manifest& m, std::span<const shard_upload> shards,
                                      const piece_writer& write);

/// Checks a pool name (the same alphabet as run ids).
status validate_pool(std::string_view pool);

/// msgpack encoding of a layout, for backends that persist it.
std::string encode_layout(const version_layout& layout);
result<version_layout> decode_layout(std::string_view bytes);

/// msgpack encoding of a pointer record; garbage decodes to `corrupt_data`.
std::string encode_pointer(const pointer_record& p);
result<pointer_record> decode_pointer(std::string_view bytes);

} // namespace stitch::store
