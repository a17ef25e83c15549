#include "actors/store.hpp"

#include <caf/all.hpp>

#include <cstdio>
#include <fstream>

#include "runtime/core/manifest.hpp"
#include "runtime/core/safetensors.hpp"

namespace stitch {

namespace {

/// A shard spooled to a file, read back for `put_version`.
class file_source final : public byte_source {
public:
  explicit file_source(const std::filesystem::path& path)
      : in_(path, std::ios::binary), size_(std::filesystem::file_size(path)) {}
  uint64_t size() const override { return size_; }
  result<size_t> read(std::span<std::byte> out) override {
    in_.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
    if (in_.bad())
      return make_error(errc::backend_failure, "reading a spooled shard failed");
    return static_cast<size_t>(in_.gcount());
  }

private:
  std::ifstream in_;
  uint64_t size_;
};

void drop_upload(store_state::upload& u) {
  std::error_code ec;
  for (const auto& [name, path] : u.shard_files)
    std::filesystem::remove(path, ec);
}

/// Tells every subscriber of `pool` its current pointer.
void broadcast(store_actor::stateful_pointer<store_state> self, const std::string& pool) {
  auto it = self->state.subscribers.find(pool);
  if (it == self->state.subscribers.end() || it->second.empty())
    return;
  auto pointer = self->state.backend->read_pointer(pool);
  if (!pointer || !pointer->has_value())
    return;
  for (const auto& sub : it->second)
    caf::anon_send(sub, atom::pointer_moved_v, pool, **pointer);
}

} // namespace

store_actor::behavior_type store_service(store_actor::stateful_pointer<store_state> self,
                                         std::shared_ptr<store_backend> backend,
                                         std::filesystem::path spool_dir) {
  self->state.backend = std::move(backend);
  self->state.spool_dir = std::move(spool_dir);
  std::error_code ec;
  std::filesystem::create_directories(self->state.spool_dir, ec);
  self->set_down_handler([self](const caf::down_msg& down) {
    for (auto& [pool, subs] : self->state.subscribers)
      std::erase_if(subs, [&](const caf::actor& a) { return a.address() == down.source; });
  });
  self->attach_functor([self] {
    for (auto& [id, u] : self->state.uploads)
      drop_upload(u);
  });
  auto& db = *self->state.backend;
  return {
    [self, &db](atom::read_pointer, const std::string& pool) -> caf::result<pointer_reply> {
      auto p = db.read_pointer(pool);
      if (!p)
        return to_caf_error(p.error());
      if (!*p)
        return pointer_reply{};
      return pointer_reply{true, **p};
    },
    [self, &db](atom::claim, const std::string& pool,
                const version_ref& boot) -> caf::result<pointer_record> {
      auto p = db.claim(pool, boot);
      if (!p)
        return to_caf_error(p.error());
      broadcast(self, pool);
      return *p;
    },
    [self, &db](atom::advance, const std::string& pool, const pointer_reply& expected,
                const version_ref& proposed) -> caf::result<pointer_record> {
      std::optional<version_ref> exp;
      if (expected.present)
        exp = expected.record.latest;
      auto p = db.compare_and_advance_pointer(pool, exp, proposed);
      if (!p)
        return to_caf_error(p.error());
      broadcast(self, pool);
      return *p;
    },
    [&db](atom::read_manifest, const std::string& pool,
          const version_ref& ref) -> caf::result<std::string> {
      auto m = db.read_manifest(pool, ref);
      if (!m)
        return to_caf_error(m.error());
      return to_json(*m);
    },
    [&db](atom::read_range, const std::string& pool, const version_ref& ref,
          const std::string& tensor, uint64_t offset,
          uint64_t len) -> caf::result<std::vector<char>> {
      if (len > max_chunk_bytes)
        return to_caf_error({errc::limit_exceeded, "a range read is limited to "
                                                     + std::to_string(max_chunk_bytes) + " bytes"});
      std::vector<char> out(len);
      auto ok = db.read_range(pool, ref, tensor, offset,
                              {reinterpret_cast<std::byte*>(out.data()), out.size()});
      if (!ok)
        return to_caf_error(ok.error());
      return out;
    },
    [&db](atom::list, const std::string& pool,
          const std::string& run) -> caf::result<std::vector<version_ref>> {
      auto v = db.list_versions(pool, run);
      if (!v)
        return to_caf_error(v.error());
      return *v;
    },
    [&db](atom::retain, const std::string& pool,
          uint64_t keep_last) -> caf::result<std::vector<version_ref>, std::vector<version_ref>> {
      auto r = db.retain(pool, keep_last);
      if (!r)
        return to_caf_error(r.error());
      return {std::move(r->deleted), std::move(r->kept)};
    },
    [self](atom::put_begin, const std::string& pool,
           const std::string& manifest_json) -> caf::result<uint64_t> {
      auto m = parse_manifest(manifest_json);
      if (!m)
        return to_caf_error(m.error());
      auto id = self->state.next_upload++;
      self->state.uploads.emplace(id, store_state::upload{pool, std::move(*m), {}, 0});
      return id;
    },
    [self](atom::put_chunk, uint64_t id, const std::string& shard,
           const std::vector<char>& bytes) -> caf::result<uint64_t> {
      auto it = self->state.uploads.find(id);
      if (it == self->state.uploads.end())
        return to_caf_error({errc::not_found, "no upload " + std::to_string(id)});
      auto& u = it->second;
      if (std::find(u.m.shards.begin(), u.m.shards.end(), shard) == u.m.shards.end()) {
        drop_upload(u);
        self->state.uploads.erase(it);
        return to_caf_error(
          {errc::invalid_argument,
           "shard '" + shard + "' is not in the manifest of " + to_string(u.m.ref)});
      }
      const uint64_t limit =
        u.m.total_size + u.m.shards.size() * (safetensors::max_header_size + 8);
      u.bytes += bytes.size();
      if (bytes.size() > max_chunk_bytes || u.bytes > limit) {
        drop_upload(u);
        self->state.uploads.erase(it);
        return to_caf_error(
          {errc::limit_exceeded,
           "upload of " + to_string(u.m.ref) + " sends more bytes than its manifest allows"});
      }
      auto [file, fresh] = u.shard_files.try_emplace(
        shard, self->state.spool_dir
                 / ("upload-" + std::to_string(id) + "-" + std::to_string(u.shard_files.size())));
      std::ofstream out(file->second, fresh ? std::ios::binary | std::ios::trunc
                                            : std::ios::binary | std::ios::app);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      if (!out) {
        drop_upload(u);
        self->state.uploads.erase(it);
        return to_caf_error({errc::backend_failure, "spooling a shard failed"});
      }
      return u.bytes;
    },
    [self, &db](atom::put_end, uint64_t id) -> caf::result<bool> {
      auto it = self->state.uploads.find(id);
      if (it == self->state.uploads.end())
        return to_caf_error({errc::not_found, "no upload " + std::to_string(id)});
      auto u = std::move(it->second);
      self->state.uploads.erase(it);
      std::vector<std::unique_ptr<file_source>> sources;
      std::vector<shard_upload> uploads;
      for (const auto& [name, path] : u.shard_files) {
        sources.push_back(std::make_unique<file_source>(path));
        uploads.push_back({name, sources.back().get()});
      }
      auto ok = db.put_version(u.pool, u.m, uploads);
      sources.clear();
      drop_upload(u);
      if (!ok)
        return to_caf_error(ok.error());
      return true;
    },
    [self](atom::subscribe, const std::string& pool, const caf::actor& subscriber) {
      self->monitor(subscriber);
      self->state.subscribers[pool].push_back(subscriber);
    },
    [self](atom::notify, const std::string& pool) { broadcast(self, pool); },
  };
}

} // namespace stitch
