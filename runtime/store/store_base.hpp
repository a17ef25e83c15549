#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/core/pointer_rules.hpp"
#include "runtime/core/retention.hpp"
#include "runtime/core/store_port.hpp"
#include "runtime/store/version_layout.hpp"

namespace stitch::store {

/// Where a backend puts the bytes of one attempt at storing a version. An
/// attempt is private until `finish`: a sink destroyed before it removes the
/// bytes it wrote, and concurrent attempts at the same version never share
/// bytes.
class shard_sink {
public:
  virtual ~shard_sink() = default;
  /// Starts shard `name` of exactly `size` bytes.
  virtual status open_shard(std::string_view name, uint64_t size) = 0;
  /// The current shard's next bytes.
  virtual status append(std::span<const std::byte> bytes) = 0;
  /// The current shard is complete: its bytes are durable when this returns.
  virtual status close_shard() = 0;
  /// Records the manifest and layout durably, replacing (and freeing) any
  /// earlier unpublished attempt at the same version. Called with the pool's
  /// lock held, so it must not wait on bulk I/O.
  virtual status finish(const manifest& m, version_layout layout) = 0;
};

/// A pointer move as the backend records it, in one atomic step.
struct pointer_commit {
  /// The pointer after the move.
  pointer_record next;
  /// The version it names, recorded as published (readable, immutable).
  version_ref target;
  bool target_is_full = false;
  /// The move claims `target.run_id` for the first time: record its boot.
  bool new_run = false;
};

/// The orchestration every store backend shares (DESIGN §1 pointer rules,
/// §4 retention): claims, compare-and-swap moves, version writers with their
/// checks, retention — over a few small primitives each backend provides.
/// Pointer moves and retention decisions are serialized per pool; writing a
/// version's bytes takes no lock, so a large publish never delays another
/// pool, or a pointer read, or a manifest read.
class store_base : public store_backend {
public:
  result<std::optional<pointer_record>> read_pointer(std::string_view pool) final;
  std::optional<pointer_record> pointer_without_io(std::string_view pool) final;
  result<pointer_record> claim(std::string_view pool, const version_ref& boot) final;
  result<pointer_record> compare_and_advance_pointer(std::string_view pool,
                                                     const std::optional<version_ref>& expected,
                                                     const version_ref& proposed) final;
  result<std::unique_ptr<version_writer>> begin_version(std::string_view pool,
                                                        const version_ref& ref) final;
  result<manifest> read_manifest(std::string_view pool, const version_ref& ref) final;
  /// Checks the names, finds the published version's layout (from a cache of
  /// recent ones), the tensor in it and the range inside the tensor, then
  /// reads through `read_shard`.
  status read_range(std::string_view pool, const version_ref& ref, std::string_view tensor,
                    uint64_t offset, std::span<std::byte> out) final;
  result<std::vector<version_ref>> list_versions(std::string_view pool,
                                                 std::string_view run_id) final;
  result<std::vector<std::string>> list_pools() final;
  result<retention_report> retain(std::string_view pool, const retention_request& request) final;
  uint64_t observe_pointers(pointer_observer observer) final;
  void unobserve_pointers(uint64_t id) final;

protected:
  /// Whether this process is the only writer of the backend's pointers (an
  /// embedded database it holds locked): then each pool's pointer, once read
  /// or moved here, is remembered and later reads are answered from memory.
  virtual bool sole_pointer_writer() const { return false; }

  /// A pool's pointer as read, with what the backend needs to notice a
  /// concurrent change when it commits a move (an S3 ETag; empty otherwise).
  struct pointer_snapshot {
    std::optional<pointer_record> record;
    std::string token;
  };

  virtual result<pointer_snapshot> load_pointer(std::string_view pool) = 0;
  /// The boot of `run` in `pool`, when the run was ever claimed there.
  virtual result<std::optional<uint64_t>> load_boot(std::string_view pool,
                                                    std::string_view run) = 0;
  /// A stored manifest, published or not; `not_found` when none is stored.
  virtual result<manifest> load_manifest(std::string_view pool, const version_ref& ref) = 0;
  /// Whether a pointer move named `ref`.
  virtual result<bool> is_published(std::string_view pool, const version_ref& ref) = 0;
  /// The layout recorded for `ref`, published or not; `not_found` when none.
  virtual result<version_layout> load_layout(std::string_view pool, const version_ref& ref) = 0;
  /// Reads `out.size()` (at least 1) bytes at `offset` of the tensor stored
  /// at `where` of the published version `ref` laid out as `layout` (the
  /// range checked to lie inside the tensor).
  virtual status read_shard(std::string_view pool, const version_ref& ref,
                            const version_layout& layout, const tensor_location& where,
                            uint64_t offset, std::span<std::byte> out) = 0;
  /// Records `move` atomically, or fails with `conflict` when the pointer is
  /// no longer what `seen` read (backends shared between processes).
  virtual status commit_move(std::string_view pool, const pointer_snapshot& seen,
                             const pointer_commit& move) = 0;
  /// A private place for one attempt at storing `ref`.
  virtual result<std::unique_ptr<shard_sink>> open_sink(std::string_view pool,
                                                        const version_ref& ref) = 0;
  /// The runs of `pool` with a boot record.
  virtual result<std::vector<std::string>> claimed_runs(std::string_view pool) = 0;
  /// The pools with a pointer.
  virtual result<std::vector<std::string>> pools() = 0;
  /// The published versions of a run, any order.
  virtual result<std::vector<stored_version>> published_versions(std::string_view pool,
                                                                 std::string_view run) = 0;
  /// Makes a published version unreadable, then frees its bytes; a crash in
  /// between leaves it unreadable (its bytes are garbage for the backend).
  virtual status delete_version(std::string_view pool, const version_ref& ref) = 0;

  /// Serializes pointer moves, version commits and retention of one pool.
  std::mutex& pool_lock(std::string_view pool);
  /// Drops `ref`'s layout from the cache `read_range` keeps (a backend
  /// deleting the version, or recording another attempt at it).
  void forget_layout(std::string_view pool, const version_ref& ref);

private:
  class writer;

  /// The layout of a published version: cached, else loaded once a pointer
  /// move is known to have named it.
  result<std::shared_ptr<const version_layout>> published_layout(std::string_view pool,
                                                                 const version_ref& ref);
  /// `commit_move`, keeping the remembered pointers in step with it.
  status record_move(std::string_view pool, const pointer_snapshot& seen,
                     const pointer_commit& move);
  /// The moves themselves, under the pool's lock; `moved` says whether the
  /// pointer changed.
  result<pointer_record> claim_locked(std::string_view pool, const version_ref& boot, bool& moved);
  result<pointer_record> advance_locked(std::string_view pool,
                                        const std::optional<version_ref>& expected,
                                        const version_ref& proposed, bool& moved);
  /// Tells the observers of a move (outside every lock of the backend).
  void tell_observers(std::string_view pool, const pointer_record& now);

  std::mutex observers_mutex_;
  std::map<uint64_t, pointer_observer> observers_;
  uint64_t next_observer_ = 1;

  std::mutex locks_mutex_;
  std::map<std::string, std::unique_ptr<std::mutex>, std::less<>> pool_locks_;
  std::mutex layouts_mutex_;
  std::map<std::string, std::shared_ptr<const version_layout>, std::less<>> layouts_;
  /// `forget_layout` calls so far: a load that saw another count keeps
  /// nothing.
  uint64_t layouts_forgotten_ = 0;
  /// The pointers remembered (`sole_pointer_writer` backends only), each
  /// replaced once a move of its pool is recorded.
  std::mutex pointers_mutex_;
  std::map<std::string, pointer_record, std::less<>> pointers_;
  /// Bumped as every move starts and ends, and the moves between the two:
  /// a load that overlapped one is not remembered.
  uint64_t pointer_moves_ = 0;
  uint64_t moves_under_way_ = 0;
};

} // namespace stitch::store
