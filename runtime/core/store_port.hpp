#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/core/pointer_rules.hpp"
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

/// What retention removed and kept.
struct retention_report {
  std::vector<version_ref> deleted;
  std::vector<version_ref> kept;
};

/// The store backend port (DESIGN §4): the durable source of truth. Every
/// method is blocking and thread-safe; hosts call it from worker threads.
/// Implementations: `runtime/store/` (RocksDB embedded, S3).
class store_backend {
public:
  virtual ~store_backend() = default;

  /// The pool's pointer; nullopt when no run was ever claimed.
  virtual result<std::optional<pointer_record>> read_pointer(std::string_view pool) = 0;
  /// Claims `boot.run_id` at `boot` (a stored full anchor), per `decide_claim`.
  virtual result<pointer_record> claim(std::string_view pool, const version_ref& boot) = 0;
  /// Moves the pointer to `proposed` if it still names `expected`, per
  /// `decide_pointer_move`; a lost race is `errc::conflict`.
  virtual result<pointer_record>
  compare_and_advance_pointer(std::string_view pool, const std::optional<version_ref>& expected,
                              const version_ref& proposed) = 0;
  /// Stores a version's shards and manifest durably (not yet visible through
  /// the pointer). Idempotent for identical content; `version_exists` otherwise.
  virtual status put_version(std::string_view pool, const manifest& m,
                             std::span<const shard_upload> shards) = 0;
  /// A stored manifest; `not_found` when the version does not exist.
  virtual result<manifest> read_manifest(std::string_view pool, const version_ref& ref) = 0;
  /// Reads `out.size()` bytes of a tensor's stored (possibly encoded) bytes
  /// starting at `offset`.
  virtual status read_range(std::string_view pool, const version_ref& ref, std::string_view tensor,
                            uint64_t offset, std::span<std::byte> out) = 0;
  /// The stored versions of a run, ascending.
  virtual result<std::vector<version_ref>> list_versions(std::string_view pool,
                                                         std::string_view run_id) = 0;
  /// Keeps the newest `keep_last` versions of the pool's runs plus whatever
  /// they need to be rebuilt (their anchor, the run's boot) and deletes the rest.
  virtual result<retention_report> retain(std::string_view pool, size_t keep_last) = 0;
};

} // namespace stitch
