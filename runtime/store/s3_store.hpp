#pragma once

#include <memory>
#include <string_view>

#include "runtime/core/error.hpp"
#include "runtime/core/store_port.hpp"
#include "transport/s3_client.hpp"

namespace stitch::store {

struct s3_options {
  /// Endpoint, region, credentials; `transport::s3_config::from_environment()`
  /// reads them the way AWS tools do.
  transport::s3_config client;
};

/// The S3 store (`store.uri = s3://bucket/prefix`), DESIGN §4's layout:
///
/// ```
/// <prefix>/<pool>/latest                            "run/weight_v000007" (the pointer)
/// <prefix>/<pool>/<run>/boot                        "run/weight_v000000" (the run's claim)
/// <prefix>/<pool>/<run>/weight_v000007/
///     model.safetensors.index.json                  the manifest (written last by put_version)
///     model-00001-of-00002.safetensors ...          the shards, byte for byte
///     .stitch-layout                                where each tensor's bytes are (msgpack)
///     .stitch-published                             "full" or "delta": the pointer passed here
/// ```
///
/// A version directory is a plain Hugging Face directory; its index is written
/// after every other byte, so a directory with an index is complete for any
/// S3 tool or HF loader. As in the RocksDB store, Stitch itself sees a version
/// (`read_manifest`, `read_range`, `list_versions`) only once it is published:
/// the publication marker is written when the pointer first moves to it, just
/// before the pointer. A publish that dies half way leaves nothing visible and
/// may simply be redone. The pointer and boot records are written with S3
/// conditional writes (`If-Match` / `If-None-Match: *`); see
/// `runtime/store/README.md` for servers that ignore them. Thread-safe.
class s3_store : public store_backend {
public:
  s3_store(std::unique_ptr<transport::s3_client> client, transport::s3_location where);
  ~s3_store() override;

  result<std::optional<pointer_record>> read_pointer(std::string_view pool) override;
  result<pointer_record> claim(std::string_view pool, const version_ref& boot) override;
  result<pointer_record> compare_and_advance_pointer(std::string_view pool,
                                                     const std::optional<version_ref>& expected,
                                                     const version_ref& proposed) override;
  status put_version(std::string_view pool, const manifest& m,
                     std::span<const shard_upload> shards) override;
  result<manifest> read_manifest(std::string_view pool, const version_ref& ref) override;
  status read_range(std::string_view pool, const version_ref& ref, std::string_view tensor,
                    uint64_t offset, std::span<std::byte> out) override;
  result<std::vector<version_ref>> list_versions(std::string_view pool,
                                                 std::string_view run_id) override;
  result<retention_report> retain(std::string_view pool, size_t keep_last) override;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Opens the S3 store at `uri` (`s3://bucket[/prefix]`); the bucket must exist
/// (`not_found` otherwise).
result<std::unique_ptr<store_backend>> open_s3_store(std::string_view uri, s3_options options);

} // namespace stitch::store
