#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "runtime/core/checksum.hpp"
#include "runtime/core/delta_codec.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/core/safetensors.hpp"
#include "runtime/core/shard_plan.hpp"
#include "runtime/core/store_port.hpp"
#include "runtime/core/version_ref.hpp"
#include "runtime/pipeline/host_tensors.hpp"

/// Rebuilding a stored version's full weights, and the readers of the stored
/// format `publisher.hpp` describes (the anchors' tensor specs, the delta
/// frames), usable over any source of stored bytes, in bounded memory.
namespace stitch::pipeline {

/// Reads `out.size()` stored bytes of `tensor` of version `ref` at `offset`
/// (`store_backend::read_range`, a peer, an engine's `tensor_source`).
using range_reader = std::function<status(const version_ref& ref, std::string_view tensor,
                                          uint64_t offset, std::span<std::byte> out)>;

/// Reads a version's manifest (`not_found` when it is not there).
using manifest_reader = std::function<result<manifest>(const version_ref& ref)>;

/// The weight tensors of a full anchor as its manifest's `tensor_specs` list
/// them (dtype, shape, and byte size as `data_end - data_begin`), in name
/// order; `corrupt_data` for an anchor without specs.
result<std::vector<safetensors::tensor_info>> read_tensor_specs(const manifest& anchor);

/// Told of each decoded piece of a delta as it is applied: `offset` into the
/// tensor, the decoded bytes (valid only during the call), and whether they
/// are XORed (`xor_bytes`) or copied over (`overwrite`). An `xor-sparse`
/// delta's pieces are handed over as plain XOR bytes (zeros included).
struct decoded_sink {
  std::function<status(uint64_t offset, std::span<const std::byte> decoded,
                       delta_encoding encoding)>
    piece;
};

/// One tensor's delta frame in a stored delta, applied piece by piece: the
/// payload is read and decompressed as it is needed, so a tensor of any
/// size takes zstd's window and a scratch buffer, never its whole payload.
class delta_cursor {
public:
  /// The frame of `tensor` in `delta`, for a tensor of `tensor_size` bytes;
  /// a length prefix claiming more than the version stores is `corrupt_data`.
  static result<delta_cursor> open(range_reader read, const manifest& delta,
                                   std::string_view tensor, uint64_t tensor_size);

  /// Turns the next `base.size()` bytes of the tensor from their base-version
  /// bytes into the delta's version (XORed with the decoded bytes, or
  /// overwritten by them); `scratch` (at least as large) holds decoded bytes.
  /// Errors are `decode_failure` naming the tensor and version. With
  /// `sink`, every decoded piece is also handed to it (a device applying the
  /// same delta to its own copy) before the next is decoded.
  status apply(std::span<std::byte> base, std::span<std::byte> scratch,
               const decoded_sink* sink = nullptr);
  /// Checks that the frame held exactly the tensor's bytes.
  status finish();

private:
  struct source;
  delta_cursor() = default;
  status failed(const stitch::error& e) const;

  std::string tensor_;
  version_ref ref_;
  delta_encoding encoding_ = delta_encoding::none;
  std::shared_ptr<source> src_;
  std::optional<delta::stream_decompressor> zstd_;
  /// `xor-sparse` deltas: the run list (through its own decompressor).
  std::optional<delta::sparse_applier> sparse_;
};

/// Applies tensor `name`'s delta in `delta` to `bytes` (its bytes at the
/// delta's base version) in place, in pieces of `scratch.size()` bytes.
status apply_delta(const range_reader& read, const manifest& delta, std::string_view name,
                   std::span<std::byte> bytes, std::span<std::byte> scratch,
                   const decoded_sink* sink = nullptr);

/// Reads a stored version's full tensors: the chain from the nearest full
/// anchor (at or above the run's boot) to the version, each delta applied as
/// the bytes stream past, and every tensor's checksum verified against the
/// version's manifest before it counts as read (`checksum_mismatch` naming
/// the tensor). Memory stays at the caller's buffers plus zstd windows.
class version_reader {
public:
  /// `not_found` when the version is not stored, `missing_link` for a hole in
  /// its chain.
  static result<version_reader> open(const manifest_reader& manifests, range_reader read,
                                     const version_ref& target, uint64_t boot_version);
  /// The same over a store's pool (the run's boot from the pool's pointer).
  static result<version_reader> open(store_backend& store, std::string_view pool,
                                     const version_ref& target);

  const manifest& target() const noexcept { return target_; }
  /// The version's tensors in name order (`data_begin` 0, `data_end` the size).
  const std::vector<safetensors::tensor_info>& tensors() const noexcept { return tensors_; }

  /// Reads tensor `t` into `out` (exactly its size): the anchor's bytes
  /// straight in, each delta applied in place in pieces of `scratch.size()`,
  /// the checksum computed through `runner` (the shared pool when null).
  status read_into(const safetensors::tensor_info& t, std::span<std::byte> out,
                   std::span<std::byte> scratch, parallel_for* runner = nullptr) const;

  /// Where `stream` decodes: `next` gives the buffer for the next piece (its
  /// size is the piece's most), `done(n)` hands its first `n` bytes over.
  struct piece_sink {
    std::function<result<std::span<std::byte>>()> next;
    std::function<status(size_t n)> done;
  };

  /// Hands tensor `t` over piece by piece (deltas decoded through `scratch`,
  /// at least as large as a piece); the checksum is verified after the last
  /// piece, so a sink must not trust a tensor before `stream` returned
  /// success. With `unverified`, the caller hashes what it was handed
  /// instead (on another thread, say) and calls `verify` itself.
  status stream(const safetensors::tensor_info& t, std::span<std::byte> scratch,
                const piece_sink& out, bool unverified = false) const;
  /// Checks tensor `t`'s checksum (`checksum_mismatch` naming it).
  status verify(const safetensors::tensor_info& t, uint64_t got) const;
  /// The same through one buffer, `piece`.
  status stream(const safetensors::tensor_info& t, std::span<std::byte> piece,
                std::span<std::byte> scratch,
                const std::function<status(std::span<const std::byte>)>& sink) const;

private:
  version_reader() = default;

  range_reader read_;
  manifest target_;
  manifest anchor_;
  std::vector<manifest> deltas_;
  std::vector<safetensors::tensor_info> tensors_;
};

/// Rebuilds the full weights of `ref` stored in `pool` into memory (through
/// `version_reader`). `not_found` when the version is not stored.
result<tensor_set> materialize(store_backend& store, std::string_view pool, const version_ref& ref,
                               parallel_for* runner = nullptr);

struct export_options {
  uint64_t max_shard_bytes = default_max_shard_bytes;
  /// Bytes buffered while streaming (`io.buffer_bytes`); memory stays within
  /// a small multiple of this whatever the model size.
  uint64_t buffer_bytes = uint64_t{64} << 20;
  /// fsync every file before the directory appears (`stitch export --sync`).
  bool sync = false;
};

/// Streams version `ref` of `pool` into a Hugging Face directory at
/// `out_dir` (see `write_hf_directory`): byte-identical to what was
/// published, every tensor verified, memory bounded by `buffer_bytes`.
status export_version(store_backend& store, std::string_view pool, const version_ref& ref,
                      const std::filesystem::path& out_dir, const export_options& options = {});
/// The same from any source: `reader` over `read` (an engine's
/// `tensor_source`, say), the version's files read through `read` too.
status export_version(const version_reader& reader, const range_reader& read,
                      const std::filesystem::path& out_dir, const export_options& options = {});

} // namespace stitch::pipeline
