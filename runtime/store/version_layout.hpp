#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
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
  /// Where the backend keeps the shards (a directory name, a key prefix);
  /// the backend's own business.
  std::string location;
  std::vector<std::string> shards;
  std::vector<uint64_t> shard_sizes;
  std::map<std::string, tensor_location> tensors;

  friend bool operator==(const version_layout&, const version_layout&) = default;
};

/// Bytes a backend moves per piece: S3 parts and ranged reads, the store
/// actor's chunks.
inline constexpr size_t piece_size = size_t{8} << 20;

/// Checks the shards of a version as they stream into a store, in bounded
/// memory (one header): each shard a valid safetensors file of its declared
/// size, no shard twice. `finish` then checks them against the manifest:
/// exactly the manifest's shards, each holding exactly the tensors the
/// weight_map assigns to it, `total_size` equal to the tensor bytes, and —
/// for a full anchor, whose stored bytes are the resulting bytes — every
/// tensor's checksum, computed here as the bytes passed.
class shard_stream_check {
public:
  shard_stream_check();
  ~shard_stream_check();
  shard_stream_check(shard_stream_check&&) noexcept;
  shard_stream_check& operator=(shard_stream_check&&) noexcept;

  /// The next shard, of exactly `size` bytes; the previous one must be complete.
  status begin_shard(std::string_view name, uint64_t size);
  /// The current shard's next bytes.
  status feed(std::span<const std::byte> bytes);
  /// Bytes still expected for the current shard.
  uint64_t remaining() const noexcept;
  /// The layout of what streamed past, checked against `m`.
  result<version_layout> finish(const manifest& m);

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// msgpack encoding of a layout, for backends that persist it.
std::string encode_layout(const version_layout& layout);
result<version_layout> decode_layout(std::string_view bytes);

/// msgpack encoding of a pointer record; garbage decodes to `corrupt_data`.
std::string encode_pointer(const pointer_record& p);
result<pointer_record> decode_pointer(std::string_view bytes);

} // namespace stitch::store
