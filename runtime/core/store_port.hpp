#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/core/pointer_rules.hpp"
#include "runtime/core/retention.hpp"
#include "runtime/core/version_ref.hpp"

namespace stitch {

/// A stream of bytes of known length (a shard being published). `read` fills
/// up to `out.size()` bytes and returns how many; 0 means the end.
class byte_source {
public:
  virtual ~byte_source() = default;
  virtual uint64_t size() const = 0;
  virtual result<size_t> read(std::span<std::byte> out) = 0;
};

/// One shard of a version being published.
struct shard_upload {
  std::string name;
  byte_source* bytes;
};

/// What retention is asked to do for one pool (DESIGN §4).
struct retention_request {
  /// The newest versions of each run kept (at least 1).
  size_t keep_last = 20;
  /// Versions in use beyond the pointer: staged or served by a replica.
  std::set<version_ref> in_use;
  /// Decide and report only; delete nothing.
  bool dry_run = false;
  /// Runs given up entirely (`stitch profile`'s scratch runs): every version
  /// of theirs goes, the boot included, unless the pointer or a replica uses
  /// one (then the run is kept as retention would keep it).
  std::set<std::string> drop_runs;
};

/// One version and retention's verdict on it.
struct retention_entry {
  version_ref ref;
  keep_reason why = keep_reason::none;
  /// For `keep_reason::chain`: the kept version that needs it.
  uint64_t needed_by = 0;

  friend bool operator==(const retention_entry&, const retention_entry&) = default;
};

/// What retention removed (or, for a dry run, would remove) and kept.
struct retention_report {
  std::vector<retention_entry> deleted;
  std::vector<retention_entry> kept;
};

/// Writes the shards of one version into a store as they stream in: each
/// shard in turn (`begin_shard`, then its bytes with `write`), then `commit`
/// with the manifest. The store checks what streams past (safetensors
/// headers, the weight map, every full anchor's checksums) and `commit` makes
/// the version durable — not yet visible: a pointer move names it. A writer
/// dropped before `commit` leaves nothing behind. One writer is used by one
/// thread at a time.
class version_writer {
public:
  virtual ~version_writer() = default;
  /// Starts the next shard: exactly `size` bytes, a safetensors file.
  virtual status begin_shard(std::string_view name, uint64_t size) = 0;
  /// The next bytes of the current shard.
  virtual status write(std::span<const std::byte> bytes) = 0;
  /// Stores one small non-tensor file of the version (`config.json`, ...)
  /// whole; any time before `commit`, after a shard's last bytes. `commit`
  /// checks the files given against the manifest's `files`.
  virtual status add_file(std::string_view name, std::span<const std::byte> bytes) = 0;
  /// Checks the streamed shards against `m` (whose ref is the writer's) and
  /// stores the version durably. Idempotent for identical content;
  /// `version_exists` when a published version has other content.
  virtual status commit(const manifest& m) = 0;
};

/// The store backend port (DESIGN §4): the durable source of truth. Every
/// method is blocking and thread-safe; hosts call it from worker threads.
/// Implementations: `runtime/store/` (RocksDB embedded, S3).
class store_backend {
public:
  virtual ~store_backend() = default;

  /// Told of every pointer move the backend itself makes (a claim or an
  /// advance that changed the pointer), with the pointer after it: on the
  /// thread that moved it, outside the backend's locks. The one place a
  /// host learns that a pool's pointer moved, whoever asked for the move.
  using pointer_observer = std::function<void(const std::string& pool, const pointer_record& now)>;
  /// Adds `observer`; the id given back removes it (`unobserve_pointers`).
  /// A backend that moves no pointer itself (one that asks another process
  /// to) never calls it.
  virtual uint64_t observe_pointers(pointer_observer observer) {
    (void) observer;
    return 0;
  }
  virtual void unobserve_pointers(uint64_t id) { (void) id; }

  /// The pool's pointer; nullopt when no run was ever claimed.
  virtual result<std::optional<pointer_record>> read_pointer(std::string_view pool) = 0;
  /// The pool's pointer when the backend knows it without I/O (it is the
  /// only writer of its pointers and read or moved this one before); nullopt
  /// when it does not, then `read_pointer` answers. Never waits on I/O or on
  /// a pointer move, so a host may call it on its own thread.
  virtual std::optional<pointer_record> pointer_without_io(std::string_view pool) {
    (void) pool;
    return std::nullopt;
  }
  /// Claims `boot.run_id` at `boot` (a stored full anchor), per `decide_claim`.
  virtual result<pointer_record> claim(std::string_view pool, const version_ref& boot) = 0;
  /// Moves the pointer to `proposed` if it still names `expected`, per
  /// `decide_pointer_move`; a lost race is `errc::conflict`.
  virtual result<pointer_record>
  compare_and_advance_pointer(std::string_view pool, const std::optional<version_ref>& expected,
                              const version_ref& proposed) = 0;
  /// Starts storing version `ref` of `pool` (see `version_writer`).
  virtual result<std::unique_ptr<version_writer>> begin_version(std::string_view pool,
                                                                const version_ref& ref) = 0;
  /// A published manifest; `not_found` when the version does not exist.
  virtual result<manifest> read_manifest(std::string_view pool, const version_ref& ref) = 0;
  /// Reads `out.size()` bytes of a tensor's stored (possibly encoded) bytes
  /// starting at `offset`.
  virtual status read_range(std::string_view pool, const version_ref& ref, std::string_view tensor,
                            uint64_t offset, std::span<std::byte> out) = 0;
  /// The published versions of a run, ascending.
  virtual result<std::vector<version_ref>> list_versions(std::string_view pool,
                                                         std::string_view run_id) = 0;
  /// Every pool that ever had a run claimed, ascending.
  virtual result<std::vector<std::string>> list_pools() = 0;
  /// Applies retention to every claimed run of `pool`: keeps the newest
  /// `keep_last` versions of each run, the boot, the pointer, `in_use` and
  /// every version their chains need; deletes the rest (unless `dry_run`). A
  /// version is made unreadable before its bytes go, so a collection that
  /// dies half way never leaves a kept version unreadable.
  virtual result<retention_report> retain(std::string_view pool,
                                          const retention_request& request) = 0;
};

/// Reads file `name` that version `m` keeps (`m.files`) through `read` (a
/// stored tensor range reader: the file is found by `file_location_key`),
/// checked against its size and checksum: `not_found` when the version keeps
/// no such file, `corrupt_data` when the stored bytes differ.
result<std::string> read_version_file(
  const manifest& m, std::string_view name,
  const std::function<status(const version_ref&, std::string_view, uint64_t, std::span<std::byte>)>&
    read);

/// `read_version_file` from a store.
result<std::string> read_version_file(store_backend& store, std::string_view pool,
                                      const manifest& m, std::string_view name);

/// Stores a version from whole shards: `begin_version`, each shard in the
/// manifest's order (every shard the manifest names, once), the `files`
/// (`add_file`; the manifest's `files` must describe them), `commit`.
status put_version(store_backend& store, std::string_view pool, const manifest& m,
                   std::span<const shard_upload> shards,
                   const std::map<std::string, std::string>& files = {});

} // namespace stitch
