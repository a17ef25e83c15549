#pragma once

#include <memory>
#include <string_view>

#include "runtime/core/error.hpp"
#include "runtime/core/store_port.hpp"
#include "runtime/store/store_base.hpp"
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
class s3_store final : public store_base {
public:
  struct impl;

  s3_store(std::unique_ptr<transport::s3_client> client, transport::s3_location where);
  ~s3_store() override;

protected:
  result<pointer_snapshot> load_pointer(std::string_view pool) override;
  result<std::optional<uint64_t>> load_boot(std::string_view pool, std::string_view run) override;
  result<manifest> load_manifest(std::string_view pool, const version_ref& ref) override;
  result<bool> is_published(std::string_view pool, const version_ref& ref) override;
  result<version_layout> load_layout(std::string_view pool, const version_ref& ref) override;
  status read_shard(std::string_view pool, const version_ref& ref, const version_layout& layout,
                    const tensor_location& where, uint64_t offset,
                    std::span<std::byte> out) override;
  status commit_move(std::string_view pool, const pointer_snapshot& seen,
                     const pointer_commit& move) override;
  result<std::unique_ptr<shard_sink>> open_sink(std::string_view pool,
                                                const version_ref& ref) override;
  result<std::vector<std::string>> claimed_runs(std::string_view pool) override;
  result<std::vector<std::string>> pools() override;
  result<std::vector<stored_version>> published_versions(std::string_view pool,
                                                         std::string_view run) override;
  status delete_version(std::string_view pool, const version_ref& ref) override;

private:
  std::unique_ptr<impl> impl_;
};

/// Opens the S3 store at `uri` (`s3://bucket[/prefix]`); the bucket must exist
/// (`not_found` otherwise).
result<std::unique_ptr<store_backend>> open_s3_store(std::string_view uri, s3_options options);

} // namespace stitch::store
