#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "runtime/core/error.hpp"
#include "runtime/core/store_port.hpp"

namespace rocksdb {
class Env;
} // namespace rocksdb

namespace stitch::store {

struct rocksdb_options {
  /// Environment override (tests inject a file system that drops unsynced
  /// data); shard files go through its file system too.
  std::shared_ptr<rocksdb::Env> env;
  /// Create the database when it does not exist.
  bool create_if_missing = true;
};

/// The schema this build reads and writes; stored under the key `schema`.
inline constexpr std::string_view rocksdb_schema = "stitch-rocksdb-2";

/// Opens the embedded store at `path` (`store.uri = rocksdb:PATH`).
///
/// Records live in RocksDB: column families `default` (schema, pointers, run
/// boots, publication records) and `manifests` (index JSON and layouts).
/// Shard bytes live in plain safetensors files, DESIGN §4's logical layout:
/// `PATH/versions/<pool>/<run>/weight_v000007-<attempt>/model-0000i-of-0000N.safetensors`,
/// so a full anchor's directory is a Hugging Face checkpoint any loader reads.
/// Each attempt at storing a version writes its own directory with large
/// sequential writes (writeback started as it goes) and syncs each file once;
/// only then does one synced batch record the manifest and layout that name
/// the directory. The pointer and the version's publication record move in
/// another synced batch. A version is visible (`read_manifest`,
/// `list_versions`) only once published, so a publish that dies half way
/// leaves nothing readable and may simply be redone; directories no record
/// names are removed when the store opens.
result<std::unique_ptr<store_backend>> open_rocksdb_store(const std::string& path,
                                                          rocksdb_options opts = {});

/// Flushes to the device that large direct-I/O shards have made in this
/// process while they were written (every 64 MiB of a shard of 128 MiB or
/// more, on a thread of the shard's own), for tests and diagnostics.
uint64_t background_shard_flushes() noexcept;

} // namespace stitch::store
