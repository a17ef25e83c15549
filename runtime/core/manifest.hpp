#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/version_ref.hpp"

namespace stitch {

enum class version_kind : uint8_t { full, delta };
/// `xor_sparse`: the XOR as a run list (runtime/core/delta_codec.hpp).
enum class delta_encoding : uint8_t { none, xor_bytes, overwrite, xor_sparse };
enum class compression : uint8_t { none, zstd };

/// The checksum algorithm every manifest names (DESIGN §1).
inline constexpr std::string_view checksum_algorithm_name = "xxh3-64-tree-1MiB";

std::string_view to_string(version_kind kind) noexcept;
/// "none", "xor", "overwrite", "xor-sparse".
std::string_view to_string(delta_encoding encoding) noexcept;
/// "none", "zstd".
std::string_view to_string(compression comp) noexcept;

/// A stored tensor's element type (the safetensors dtype name) and shape.
struct tensor_spec_entry {
  std::string dtype;
  std::vector<uint64_t> shape;

  friend bool operator==(const tensor_spec_entry&, const tensor_spec_entry&) = default;
};

/// One small non-tensor file kept with a version (`config.json`, tokenizer
/// files): its size and checksum (the tensors' algorithm over its bytes).
struct file_entry {
  uint64_t size = 0;
  uint64_t checksum = 0;

  friend bool operator==(const file_entry&, const file_entry&) = default;
};

/// Most non-tensor files one version keeps, the most bytes each may have,
/// and the most bytes all of them together may have.
inline constexpr size_t max_version_files = 64;
inline constexpr uint64_t max_version_file_bytes = uint64_t{64} << 20;
inline constexpr uint64_t max_version_files_total = uint64_t{128} << 20;

/// A version's manifest: the Hugging Face `model.safetensors.index.json`
/// (`metadata` + `weight_map`) with Stitch's keys in `metadata`.
///
/// JSON shape (metadata values are JSON scalars/arrays/objects):
/// ```
/// {"metadata": {"total_size": N, "version": 7, "run_id": "r1", "kind": "delta",
///               "base_version": 6, "delta_encoding": "xor", "compression": "zstd",
///               "checksum": "xxh3-64-tree-1MiB", "touched": ["a", ...],
///               "shards": ["model-00001-of-00001.safetensors"],
///               "checksums": {"a": "0123456789abcdef", ...},
///               "tensor_specs": {"a": {"dtype": "BF16", "shape": [4096, 4096]}, ...},
///               "files": {"config.json": {"size": 612, "checksum": "0123456789abcdef"}},
///               "frames": {"a": {"size": 5120, "checksum": "0123456789abcdef"}}},
///  "weight_map": {"a": "model-00001-of-00001.safetensors", ...}}
/// ```
/// `weight_map` names the tensors whose (encoded) bytes this version stores:
/// every tensor for a full anchor, the touched tensors for a delta.
/// `checksums` covers every tensor of the *resulting* weights (untouched ones
/// included), so any version's state can be verified on its own.
struct manifest {
  version_ref ref;
  version_kind kind = version_kind::full;
  /// Set exactly for deltas: `ref.version - 1`.
  std::optional<uint64_t> base_version;
  delta_encoding encoding = delta_encoding::none;
  compression comp = compression::none;
  std::string checksum_algorithm{checksum_algorithm_name};
  /// Names of the tensors a delta changes (sorted); empty = empty delta. For
  /// a full anchor: every tensor.
  std::vector<std::string> touched;
  /// Bytes of tensor data stored by this version (HF `total_size`).
  uint64_t total_size = 0;
  /// Shard file names, in order.
  std::vector<std::string> shards;
  /// Tensor name -> shard file name.
  std::map<std::string, std::string> weight_map;
  /// Tensor name -> checksum of the resulting bytes.
  std::map<std::string, uint64_t> checksums;
  /// Full anchors written by Stitch: every tensor's dtype and shape
  /// (`metadata.tensor_specs`), so readers size the weights without parsing
  /// shard headers. Empty for deltas (a chain never changes them: a change of
  /// names, dtypes or shapes forces a new anchor).
  std::map<std::string, tensor_spec_entry> tensor_specs;
  /// The small non-tensor files of the checkpoint kept with this version
  /// (`metadata.files`, absent when none), byte-identical: `config.json`,
  /// `generation_config.json`, tokenizer files. Each version lists all of its
  /// own; deltas included (they are small).
  std::map<std::string, file_entry> files;
  /// Deltas written by Stitch: each touched tensor's stored frame (the
  /// length prefix and payload `publisher.hpp` describes), its size and
  /// checksum (the tensors' algorithm over the stored bytes), as
  /// `metadata.frames`. Peers lend the frames themselves and receivers check
  /// what they fetch against these before decoding it (DESIGN §4, deltas
  /// over peers). Empty for anchors and for deltas written before frames
  /// were listed (their frames then come from the store only).
  std::map<std::string, file_entry> frames;

  bool is_full() const noexcept { return kind == version_kind::full; }
  bool is_empty_delta() const noexcept { return kind == version_kind::delta && touched.empty(); }

  friend bool operator==(const manifest&, const manifest&) = default;
};

/// Largest index JSON `parse_manifest` / `parse_hf_index` accept.
inline constexpr size_t max_manifest_bytes = size_t{64} << 20;
/// Most tensors (`weight_map`, `checksums`, `touched` entries) a manifest may name.
inline constexpr size_t max_manifest_tensors = 1'000'000;

/// Checks the manifest's internal consistency; the error names the first
/// problem (missing version, delta without base, unknown encoding, weight_map
/// naming a file not in `shards`, hostile tensor or shard names, ...).
status validate(const manifest& m);

/// Checks a version's `files`: names (`validate_file_name`), count and sizes
/// within the limits above.
status validate_files(const std::map<std::string, file_entry>& files);

/// Parses and validates an index JSON. Never throws; malformed input is an
/// `invalid_manifest` error naming the offending key (duplicate keys anywhere
/// in the document included); input over the size or count limits above is
/// `limit_exceeded`.
result<manifest> parse_manifest(std::string_view json);

/// A plain Hugging Face index as trainers write it, without Stitch's keys.
struct hf_index {
  /// `metadata.total_size`.
  uint64_t total_size = 0;
  /// Tensor name -> shard file name.
  std::map<std::string, std::string> weight_map;
  /// The distinct `weight_map` values, in the order the JSON first names them.
  std::vector<std::string> shards;

  friend bool operator==(const hf_index&, const hf_index&) = default;
};

/// Parses `{"metadata": {"total_size": N, ...}, "weight_map": {...}}`; other
/// keys are ignored (a Stitch manifest parses too). Tensor and shard names
/// are checked as in `validate`; errors as in `parse_manifest`.
result<hf_index> parse_hf_index(std::string_view json);

/// Serializes to the index JSON (stable key order, so equal manifests render
/// byte-identical; compact, so large manifests stay under the size limit).
std::string to_json(const manifest& m);

/// Checks a tensor name: non-empty, at most 1024 bytes of valid UTF-8, no
/// NUL or control bytes, not absolute, no empty, `.` or `..` path component,
/// no backslash. Errors are `invalid_argument`.
status validate_tensor_name(std::string_view name);

/// Checks the name of a non-tensor file kept with a version: a plain file
/// name of `[A-Za-z0-9._-]`, at most 255 bytes, not starting with `.`, neither
/// a `.safetensors` shard nor the checkpoint's index
/// (`model.safetensors.index.json`), which Stitch writes itself.
status validate_file_name(std::string_view name);

/// Where a version's file `name` is stored among its tensors' locations (a
/// key no tensor name can take: tensor names are never absolute).
std::string file_location_key(std::string_view name);

/// Checks a shard file name: a plain file name ending in `.safetensors`
/// (no directories, no `..`, no control bytes). Only `[A-Za-z0-9._-]`, at
/// most 255 bytes, not starting with `.`, since shard names become file
/// names and object keys on every store. Errors are `invalid_argument`.
status validate_shard_name(std::string_view name);

} // namespace stitch
