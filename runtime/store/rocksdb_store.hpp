#pragma once

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
  /// Environment override (tests inject a file system that drops unsynced data).
  std::shared_ptr<rocksdb::Env> env;
  /// Create the database when it does not exist.
  bool create_if_missing = true;
};

/// The schema this build reads and writes; stored under the key `schema`.
inline constexpr std::string_view rocksdb_schema = "stitch-rocksdb-1";

/// Opens the embedded store at `path` (`store.uri = rocksdb:PATH`).
///
/// Column families: `default` (schema, pointers, run boots, completion
/// records), `manifests` (index JSON and layouts), `chunks` (shard bytes in
/// pieces of `piece_size`, kept in blob files). A version's pieces, manifest
/// and layout are synced before `put_version` returns; the pointer and the
/// version's completion record move in one synced WriteBatch. A version is
/// visible (`read_manifest`, `list_versions`) only once complete, so a publish
/// that dies half way leaves nothing readable and may simply be redone.
result<std::unique_ptr<store_backend>> open_rocksdb_store(const std::string& path,
                                                          rocksdb_options opts = {});

} // namespace stitch::store
