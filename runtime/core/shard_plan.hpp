#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"

namespace stitch {

/// Hugging Face's default `max_shard_size` ("5GB", decimal as in transformers).
inline constexpr uint64_t default_max_shard_bytes = 5'000'000'000;

/// The five-digit shard counter allows at most this many shards.
inline constexpr size_t max_shard_count = 99'999;

/// A tensor to place: its name and the bytes it occupies in a shard.
struct shard_input {
  std::string name;
  uint64_t byte_size = 0;
};

/// The Hugging Face sharded layout of a set of tensors.
struct shard_plan {
  /// `model-00001-of-0000N.safetensors`, in order.
  std::vector<std::string> shards;
  /// The tensors of each shard, in the order given (parallel to `shards`).
  std::vector<std::vector<std::string>> shard_tensors;
  /// Tensor bytes of each shard (parallel to `shards`).
  std::vector<uint64_t> shard_bytes;
  /// Tensor name -> shard name.
  std::map<std::string, std::string> weight_map;
  /// Sum of all tensor bytes (HF `total_size`).
  uint64_t total_size = 0;

  friend bool operator==(const shard_plan&, const shard_plan&) = default;
};

/// `model-<index+1>-of-<count>.safetensors`, both numbers five digits.
std::string shard_name(size_t index, size_t count);

/// Fills shards in order, starting a new one when the next tensor would push
/// the current one past `max_shard_bytes`; a tensor larger than the maximum
/// gets a shard of its own. No tensors give no shards. Duplicate or empty
/// names, a zero maximum, more than `max_shard_count` shards and a total that
/// overflows are `invalid_argument`.
result<shard_plan> plan_shards(std::span<const shard_input> tensors,
                               uint64_t max_shard_bytes = default_max_shard_bytes);

} // namespace stitch
