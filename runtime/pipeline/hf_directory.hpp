#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/safetensors.hpp"
#include "runtime/core/shard_plan.hpp"
#include "runtime/pipeline/host_tensors.hpp"

/// Hugging Face checkpoint directories as trainers write them: a single
/// `model.safetensors`, or `model.safetensors.index.json` naming its shards.
/// Reading trusts nothing in the directory: every size is checked against the
/// file it comes from before anything is allocated, and files that resolve
/// outside the directory (through `..` or symlinks) are refused.
namespace stitch::pipeline {

/// The single-file checkpoint's name.
inline constexpr std::string_view hf_single_file = "model.safetensors";
/// The sharded checkpoint's index.
inline constexpr std::string_view hf_index_file = "model.safetensors.index.json";

/// Where one tensor of a checkpoint lives.
struct hf_tensor {
  std::string name;
  safetensors::dtype type = safetensors::dtype::u8;
  std::vector<uint64_t> shape;
  /// The file holding it, relative to the checkpoint directory.
  std::string file;
  /// Absolute byte offset of its data within `file`.
  uint64_t offset = 0;
  uint64_t size = 0;

  friend bool operator==(const hf_tensor&, const hf_tensor&) = default;
};

/// An opened checkpoint: its tensors, not their bytes.
struct hf_checkpoint {
  /// The directory, with symlinks resolved.
  std::filesystem::path directory;
  /// The safetensors files, in the order the index first names them.
  std::vector<std::string> files;
  /// Size of each file when it was opened; a file that changes size
  /// afterwards is refused by `read_tensor`.
  std::map<std::string, uint64_t> file_sizes;
  /// By name.
  std::map<std::string, hf_tensor> tensors;
  /// Sum of the tensors' byte sizes.
  uint64_t total_size = 0;
};

/// Opens the checkpoint in `directory`: reads the index (if any) and each
/// shard's header, and checks that the index and the shards agree (every
/// indexed tensor in its shard, no tensor in two shards or missing from the
/// index). Errors name the file and tensor: `not_found` for a missing
/// directory or file, `invalid_format` for malformed shards, `invalid_manifest`
/// for a bad or inconsistent index, `invalid_argument` for a file outside the
/// directory, `limit_exceeded` for an oversized index.
result<hf_checkpoint> open_hf_directory(const std::filesystem::path& directory);

/// Opens one of the checkpoint's files for reading, refusing one that now
/// resolves outside the directory or changed size since it was opened; the
/// caller closes the descriptor.
result<int> open_checkpoint_file(const hf_checkpoint& checkpoint, const std::string& file);

/// Reads exactly `out.size()` bytes of `fd` at `offset`; a file that ends
/// first is `invalid_format` naming `shown`.
status read_file_range(int fd, uint64_t offset, std::span<std::byte> out, std::string_view shown);

/// Writes all of `bytes` to `fd` at `offset`; an error names `shown`.
status write_file_range(int fd, uint64_t offset, std::span<const std::byte> bytes,
                        std::string_view shown);
/// Reads tensor `name`'s bytes into `out`, which must be exactly its size.
status read_tensor(const hf_checkpoint& checkpoint, std::string_view name,
                   std::span<std::byte> out);

/// Passes tensor `name`'s bytes to `sink`, `piece.size()` bytes at a time
/// (read into `piece`), so a tensor of any size takes no more memory.
status stream_tensor(const hf_checkpoint& checkpoint, std::string_view name,
                     std::span<std::byte> piece, const safetensors::byte_sink& sink);

/// Opens the checkpoint and reads every tensor into memory.
result<tensor_set> load_hf_directory(const std::filesystem::path& directory);

/// Writes `tensors` as a Hugging Face sharded checkpoint:
/// `model-0000i-of-0000N.safetensors` shards (at most `max_shard_bytes` of
/// tensor data each, a larger tensor alone in its shard; tensors in name
/// order) and `model.safetensors.index.json` (`metadata.total_size` and
/// `weight_map`). The files are written and fsynced in a temporary sibling
/// directory that then replaces `directory` by rename, so a reader sees the
/// old checkpoint or the new one, never a mix. An existing `directory` must be
/// empty or hold only what an earlier export wrote (the index and shard
/// names above, or the `files` about to be written); anything else is
/// refused with `invalid_argument`. `files` (non-tensor files such as
/// `config.json`, by name) are written next to the shards, byte for byte.
status write_hf_directory(const std::filesystem::path& directory, const tensor_set& tensors,
                          uint64_t max_shard_bytes = default_max_shard_bytes,
                          const std::map<std::string, std::string>& files = {});

/// The checkpoint's small non-tensor files (`config.json`, tokenizer files,
/// ...): every regular file of `directory` (not its subdirectories) except
/// the shards, the index, hidden files and weights in other formats
/// (`*.bin`, `*.pt`, `*.pth`, `*.ckpt`, `*.h5`, `*.msgpack`, `*.gguf`,
/// `*.onnx`, `*.npz`, `*.pkl`), by name, read whole. A file whose
/// name cannot be kept (`validate_file_name`), more than `max_version_files`
/// files, or one over the size limits is an error naming it.
result<std::map<std::string, std::string>>
read_checkpoint_files(const std::filesystem::path& directory);

/// Writes tensor `name`'s bytes through `sink` when the checkpoint writer
/// comes to it.
using tensor_filler =
  std::function<status(const std::string& name, const safetensors::byte_sink& sink)>;

/// `write_hf_directory` for tensors whose bytes stream in: `fill` writes each
/// one (in name order) when its turn comes, so a checkpoint of any size
/// takes no more memory than `fill` uses. Same layout, same checks on the
/// target, same atomic replacement; `sync` fsyncs every file and the
/// directories before the checkpoint appears (the in-memory form always
/// does).
/// A shard file already on disk with exactly the bytes a shard of the
/// directory being written would get (its name and tensors given), to be
/// hard-linked instead of written; nullopt writes it.
using shard_reuse = std::function<std::optional<std::filesystem::path>(
  const std::string& shard, const std::vector<std::string>& tensors)>;

status write_hf_directory(const std::filesystem::path& directory,
                          std::span<const safetensors::tensor_spec> tensors,
                          const tensor_filler& fill, uint64_t max_shard_bytes, bool sync,
                          const std::map<std::string, std::string>& files = {},
                          const shard_reuse& reuse = {});

} // namespace stitch::pipeline
