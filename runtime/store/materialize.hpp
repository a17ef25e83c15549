#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "runtime/core/checksum.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/core/safetensors.hpp"
#include "runtime/core/shard_plan.hpp"
#include "runtime/core/store_port.hpp"
#include "runtime/core/version_ref.hpp"
#include "runtime/store/host_tensors.hpp"

/// Rebuilding a stored version's full weights, and the readers of the stored
/// format `publisher.hpp` describes (the anchors' tensor specs, the delta
/// frames), usable over any source of stored bytes.
namespace stitch::store {

/// Reads `out.size()` stored bytes of `tensor` of version `ref` at `offset`
/// (`store_backend::read_range`, a peer, an engine's `tensor_source`).
using range_reader = std::function<status(const version_ref& ref, std::string_view tensor,
                                          uint64_t offset, std::span<std::byte> out)>;

/// The weight tensors of a full anchor as its manifest's `tensor_specs` list
/// them (dtype, shape, and byte size as `data_end - data_begin`), in name
/// order; `corrupt_data` for an anchor without specs.
result<std::vector<safetensors::tensor_info>> read_tensor_specs(const manifest& anchor);

/// The payload of `tensor`'s delta frame in `delta` (still compressed when the
/// manifest says so); its length is bounded by the version's `total_size`.
result<std::vector<std::byte>> read_delta_payload(const range_reader& read, const manifest& delta,
                                                  std::string_view tensor);

/// Turns `base` (the tensor's bytes at the delta's base version) into its
/// bytes at the delta's version: decompresses `payload` to exactly
/// `base.size()` bytes, then XORs or overwrites. Errors are `decode_failure`
/// naming the tensor and version.
status apply_delta_payload(const manifest& delta, std::string_view tensor,
                           std::span<const std::byte> payload, std::span<std::byte> base);

/// Rebuilds the full weights of `ref` stored in `pool`: walks its manifests
/// back to the nearest full anchor at or above the run's boot, loads the
/// anchor, applies each delta in order, and verifies every tensor's checksum
/// against `ref`'s manifest (`checksum_mismatch` naming the tensor). Chunks of
/// large tensors are hashed through `runner` (the shared thread pool when
/// null). `not_found` when the version is not stored, `missing_link` for a
/// hole in its chain.
result<tensor_set> materialize(store_backend& store, std::string_view pool, const version_ref& ref,
                               parallel_for* runner = nullptr);

/// `materialize` and then `write_hf_directory(out_dir, ...)`: the directory
/// holds exactly the tensors that were published.
status export_version(store_backend& store, std::string_view pool, const version_ref& ref,
                      const std::filesystem::path& out_dir,
                      uint64_t max_shard_bytes = default_max_shard_bytes);

} // namespace stitch::store
