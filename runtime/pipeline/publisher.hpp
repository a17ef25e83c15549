#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/core/checksum.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/core/pointer_rules.hpp"
#include "runtime/core/safetensors.hpp"
#include "runtime/core/shard_plan.hpp"
#include "runtime/core/store_port.hpp"
#include "runtime/core/transfer_port.hpp"
#include "runtime/pipeline/host_tensors.hpp"
#include "runtime/pipeline/publish_types.hpp"
#include "runtime/pipeline/tensor_stream.hpp"

/// The trainer side of publishing (DESIGN §2, §7 `stitch publish`).
///
/// ## How Stitch stores tensors
///
/// The store port reads a stored tensor's bytes (`read_range`) but neither its
/// size nor its dtype and shape, so every stored version describes itself:
///
/// - A **full anchor** stores every tensor's bytes as they are (dtype and
///   shape in the shard headers), so its directory is a plain HF checkpoint
///   any loader reads. Its manifest lists every tensor's dtype and shape in
///   `metadata.tensor_specs` (HF loaders ignore index metadata), which is how
///   readers size the weights.
/// - A **delta** stores each touched tensor as a U8 tensor holding a *delta
///   frame*: the payload's length as 8 little-endian bytes, then the payload
///   (the XOR of old and new bytes as a run list, `xor-sparse`, or as
///   itself, `xor`; zstd-compressed: one zstd frame per publisher chunk,
///   back to back, which zstd's decoders read as one stream). A reader
///   fetches the 8 bytes, then the payload.
namespace stitch::pipeline {

/// Bytes of a delta frame's length prefix.
inline constexpr size_t delta_frame_prefix = 8;

/// A delta frame: `payload.size()` as 8 little-endian bytes, then `payload`.
std::vector<std::byte> encode_delta_frame(std::span<const std::byte> payload);

struct publisher_options {
  /// A full anchor at least every this many versions of a run; 0 turns the
  /// cadence off (anchors then come only from the other reasons).
  uint32_t anchor_every = 10;
  /// zstd level of delta payloads.
  int zstd_level = 1;
  /// How deltas store their XOR (`publisher.delta_encoding`): `xor_sparse`
  /// (run lists: cheap to apply when few bytes change) or `xor_bytes` (the
  /// XOR bytes themselves, which readers before `xor-sparse` understand).
  delta_encoding delta_format = delta_encoding::xor_sparse;
  /// Most tensor bytes per stored shard (a larger tensor gets its own).
  uint64_t max_shard_bytes = default_max_shard_bytes;
  /// Host memory the remembered last versions of all runs may take
  /// (`publisher.memory_limit`). A run whose copy does not fit keeps it in a
  /// scratch file instead and reads it back chunk by chunk.
  uint64_t memory_limit = uint64_t{4} << 30;
  /// Bytes a publish streams per step; its buffers stay within a small
  /// multiple of this whatever the model size.
  uint64_t chunk_bytes = uint64_t{8} << 20;
  /// Where scratch files go (empty: the system's temporary directory).
  std::filesystem::path scratch_dir;
};

/// Told when a run's remembered version changes, so that the publisher can
/// offer it to peers (DESIGN §2: the publisher exposes the bytes for direct
/// transfer). Called on the publishing thread.
class remembered_watcher {
public:
  virtual ~remembered_watcher() = default;
  /// The remembered copy of `pool`'s run holds `weights.version` now;
  /// `weights.keep` keeps its bytes alive and unchanged.
  virtual void remembered(const std::string& pool, host_weights weights) = 0;
  /// The remembered copy of (`pool`, `run_id`) is about to be rewritten or
  /// dropped: stop offering it. May wait, bounded, for readers to finish.
  virtual void rewriting(const std::string& pool, const std::string& run_id) = 0;
  /// `frames.version` of `pool` was stored as a delta: `frames.tensors` are
  /// its stored frames (`manifest::frames`), byte for byte, which peers at
  /// the version before fetch instead of the touched tensors. Called after
  /// `remembered` for the same version; a watcher that lends no frames
  /// ignores it.
  virtual void delta_stored(const std::string& pool, host_weights frames) {
    (void) pool;
    (void) frames;
  }
};

/// Turns a trainer's full weights into versions in a store: remembers the
/// last version of each (pool, run) it published, stores the next one as a
/// delta against it when that pays off and a full anchor otherwise, then
/// moves the pool's pointer (claiming the run on its first version).
///
/// Each publish is one pass over its tensors' bytes, in bounded memory: every
/// chunk is hashed, compared with the remembered version, XORed and
/// compressed (a delta) or written to the store (an anchor) as it streams
/// past, and the remembered copy is updated in place. Only a delta that does
/// not pay off reads the bytes a second time, from the remembered copy.
///
/// Thread-safety: publishes to different pools may run concurrently; those
/// to one pool must come one at a time (the publisher actor serializes them).
class publisher {
public:
  publisher(store_backend& store, publisher_options options = {});
  ~publisher();

  /// Publishes the tensors of `source` as `request.version` of
  /// `request.run_id`. Errors: `invalid_argument` for a bad request or
  /// malformed tensors, `version_exists` when the version is stored with
  /// other content, `rewind`, `conflict` and the store's and the source's
  /// errors as they come.
  result<publish_report> publish(const publish_request& request, tensor_stream& source);
  /// The same for weights in memory.
  result<publish_report> publish(const publish_request& request, const tensor_set& full_weights);

  /// The version remembered for (pool, run), if any.
  std::optional<uint64_t> last_version(std::string_view pool, std::string_view run_id) const;
  /// Host memory the remembered versions take now.
  uint64_t memory_in_use() const;
  /// Tells `w` of every remembered version kept in memory from now on.
  void watch(std::shared_ptr<remembered_watcher> w);

  struct run_state;

private:
  struct pass;
  struct work_buffers;

  result<std::unique_ptr<work_buffers>> take_work_buffers();
  void give_back(std::unique_ptr<work_buffers> w);

  std::shared_ptr<run_state> find(const std::pair<std::string, std::string>& key) const;
  void forget(const std::pair<std::string, std::string>& key);

  store_backend& store_;
  publisher_options options_;
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, std::string>, std::shared_ptr<run_state>> runs_;
  uint64_t memory_in_use_ = 0;
  std::vector<std::unique_ptr<work_buffers>> idle_buffers_;
  std::shared_ptr<remembered_watcher> watcher_;
};

} // namespace stitch::pipeline
