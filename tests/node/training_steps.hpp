#pragma once

// Trainer steps for end-to-end tests of deltas: checkpoints that differ from
// the one before as a full-parameter RL step's do (every tensor touched, few
// bits changed), and what a replica's `last_fetch` says it moved.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "runtime/pipeline/hf_directory.hpp"

namespace stitch::testing {

/// `from` with the low bit of every 50th byte of every tensor flipped,
/// starting at byte `shift % 50` (2 % of its bytes change, by one bit),
/// written to `to` with the same non-tensor files (config.json).
inline void flip_step(const std::filesystem::path& from, const std::filesystem::path& to,
                      size_t shift) {
  auto tensors = pipeline::load_hf_directory(from);
  ASSERT_TRUE(tensors) << to_string(tensors.error());
  for (auto& [name, t] : *tensors)
    for (size_t i = shift % 50; i < t.bytes.size(); i += 50)
      t.bytes[i] ^= std::byte{1};
  auto files = pipeline::read_checkpoint_files(from);
  ASSERT_TRUE(files) << to_string(files.error());
  ASSERT_TRUE(pipeline::write_hf_directory(to, *tensors, stitch::default_max_shard_bytes, *files));
}

/// Verified bytes from peers in a `last_fetch`, every holder together.
inline uint64_t peer_bytes(const nlohmann::json& fetch) {
  uint64_t n = 0;
  for (const auto& [source, bytes] : fetch["from_peers"].items())
    n += bytes.get<uint64_t>();
  return n;
}

} // namespace stitch::testing
