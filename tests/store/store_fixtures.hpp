#pragma once

// Builders of stored versions for store tests: manifests with their shards,
// made with the core's own codecs.

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/checksum.hpp"
#include "runtime/core/delta_codec.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/core/safetensors.hpp"
#include "runtime/core/store_port.hpp"
#include "runtime/pipeline/host_tensors.hpp"

namespace stitch::testing {

/// A byte_source over bytes held in memory.
class span_source final : public byte_source {
public:
  explicit span_source(std::vector<std::byte> bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_.size(); }
  result<size_t> read(std::span<std::byte> out) override {
    size_t n = std::min(out.size(), bytes_.size() - pos_);
    std::memcpy(out.data(), bytes_.data() + pos_, n);
    pos_ += n;
    return n;
  }

private:
  std::vector<std::byte> bytes_;
  size_t pos_ = 0;
};

using weights = std::map<std::string, std::vector<std::byte>>;

inline std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng{seed};
  std::vector<std::byte> out(n);
  for (auto& b : out)
    b = static_cast<std::byte>(rng() & 0xff);
  return out;
}

/// A tensor of `type` and `shape` filled with bytes from `rng`.
inline pipeline::host_tensor make_tensor(std::string name, safetensors::dtype type,
                                         std::vector<uint64_t> shape, std::mt19937_64& rng) {
  pipeline::host_tensor t{std::move(name), type, std::move(shape), {}};
  t.bytes.resize(safetensors::byte_length(t.type, t.shape).value());
  for (auto& b : t.bytes)
    b = static_cast<std::byte>(rng() & 0xff);
  return t;
}

/// A version ready to put: its manifest and its shard bytes.
struct built_version {
  manifest m;
  std::vector<std::pair<std::string, std::vector<std::byte>>> shards;
  /// Non-tensor files kept with it (`m.files` describes them).
  std::map<std::string, std::string> files = {};
};

/// Holds the sources of one put (each put consumes its sources).
struct upload_set {
  explicit upload_set(const built_version& v) {
    for (const auto& [name, bytes] : v.shards) {
      sources.push_back(std::make_unique<span_source>(bytes));
      uploads.push_back({name, sources.back().get()});
    }
  }
  std::vector<std::unique_ptr<span_source>> sources;
  std::vector<shard_upload> uploads;
};

inline status put(store_backend& store, std::string_view pool, const built_version& v) {
  upload_set set{v};
  return put_version(store, pool, v.m, set.uploads, v.files);
}

inline std::vector<version_ref> refs_of(const std::vector<retention_entry>& entries) {
  std::vector<version_ref> out;
  for (const auto& e : entries)
    out.push_back(e.ref);
  return out;
}

inline std::vector<std::byte> shard_of(const weights& stored) {
  std::vector<safetensors::tensor_to_write> tensors;
  for (const auto& [name, bytes] : stored)
    tensors.push_back({name, safetensors::dtype::u8, {bytes.size()}, bytes});
  return safetensors::serialize(tensors).value();
}

/// A full anchor holding `w` spread over `shard_count` shards.
inline built_version full_version(const std::string& run, uint64_t v, const weights& w,
                                  size_t shard_count = 1) {
  built_version out;
  out.m.ref = {run, v};
  out.m.kind = version_kind::full;
  std::vector<weights> parts(shard_count);
  size_t i = 0;
  for (const auto& [name, bytes] : w) {
    parts[i++ % shard_count][name] = bytes;
    out.m.checksums[name] = checksum::tree_checksum(bytes);
    out.m.touched.push_back(name);
    out.m.total_size += bytes.size();
  }
  for (size_t s = 0; s < shard_count; ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shard_count);
    out.m.shards.push_back(name);
    for (const auto& [tensor, bytes] : parts[s])
      out.m.weight_map[tensor] = name;
    out.shards.emplace_back(name, shard_of(parts[s]));
  }
  return out;
}

/// An xor delta from `before` to `after` (same tensor names and sizes).
inline built_version delta_version(const std::string& run, uint64_t v, const weights& before,
                                   const weights& after) {
  built_version out;
  out.m.ref = {run, v};
  out.m.kind = version_kind::delta;
  out.m.base_version = v - 1;
  out.m.encoding = delta_encoding::xor_bytes;
  weights encoded;
  for (const auto& [name, bytes] : after) {
    out.m.checksums[name] = checksum::tree_checksum(bytes);
    if (before.at(name) == bytes)
      continue;
    std::vector<std::byte> x(bytes.size());
    (void) delta::xor_encode(before.at(name), bytes, x);
    encoded[name] = std::move(x);
    out.m.touched.push_back(name);
  }
  if (!encoded.empty()) {
    out.m.shards = {"model-00001-of-00001.safetensors"};
    for (const auto& [name, bytes] : encoded) {
      out.m.weight_map[name] = out.m.shards.front();
      out.m.total_size += bytes.size();
    }
    out.shards.emplace_back(out.m.shards.front(), shard_of(encoded));
  }
  return out;
}

/// Reads a whole stored tensor.
inline result<std::vector<std::byte>> read_tensor(store_backend& store, std::string_view pool,
                                                  const version_ref& ref, const std::string& name,
                                                  size_t size) {
  std::vector<std::byte> out(size);
  if (auto ok = store.read_range(pool, ref, name, 0, out); !ok)
    return std::move(ok).error();
  return out;
}

/// A scratch directory removed at the end of its scope.
class temp_dir {
public:
  temp_dir() {
    auto base = std::filesystem::temp_directory_path();
    std::mt19937_64 rng{std::random_device{}()};
    path_ = base / ("stitch-test-" + std::to_string(rng()));
    std::filesystem::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  const std::filesystem::path& path() const { return path_; }

private:
  std::filesystem::path path_;
};

} // namespace stitch::testing
