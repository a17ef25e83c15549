#include "runtime/store/rocksdb_store.hpp"

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "runtime/core/retention.hpp"
#include "runtime/store/version_layout.hpp"

namespace stitch::store {

namespace {

constexpr char sep = '\0';

std::string padded(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%020llu", static_cast<unsigned long long>(v));
  return buf;
}

std::string version_key(std::string_view pool, const version_ref& ref) {
  std::string k{pool};
  k += sep;
  k += ref.run_id;
  k += sep;
  k += padded(ref.version);
  return k;
}

std::string pointer_key(std::string_view pool) {
  return "ptr" + std::string(1, sep) + std::string{pool};
}

std::string boot_prefix(std::string_view pool) {
  return "boot" + std::string(1, sep) + std::string{pool} + sep;
}

std::string boot_key(std::string_view pool, std::string_view run) {
  return boot_prefix(pool) + std::string{run};
}

std::string done_prefix(std::string_view pool, std::string_view run) {
  return "done" + std::string(1, sep) + std::string{pool} + sep + std::string{run} + sep;
}

std::string done_key(std::string_view pool, const version_ref& ref) {
  return done_prefix(pool, ref.run_id) + padded(ref.version);
}

std::string manifest_key(std::string_view pool, const version_ref& ref) {
  return version_key(pool, ref) + sep + "m";
}

std::string layout_key(std::string_view pool, const version_ref& ref) {
  return version_key(pool, ref) + sep + "l";
}

void append_be(std::string& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string chunk_key(std::string_view pool, const version_ref& ref, uint32_t shard,
                      uint64_t offset) {
  auto k = version_key(pool, ref);
  k += sep;
  append_be(k, shard, 4);
  append_be(k, offset, 8);
  return k;
}

/// [begin, end) of every chunk key of a version.
std::pair<std::string, std::string> chunk_range(std::string_view pool, const version_ref& ref) {
  auto base = version_key(pool, ref);
  return {base + sep, base + '\x01'};
}

stitch::error backend(const rocksdb::Status& s, std::string_view what) {
  return make_error(errc::backend_failure, std::string{what} + ": " + s.ToString());
}

class rocksdb_store final : public store_backend {
public:
  rocksdb_store(std::unique_ptr<rocksdb::DB> db, std::vector<rocksdb::ColumnFamilyHandle*> cfs)
      : db_(std::move(db)), cfs_(std::move(cfs)) {
    sync_.sync = true;
  }

  ~rocksdb_store() override {
    for (auto* cf : cfs_)
      db_->DestroyColumnFamilyHandle(cf);
  }

  status check_schema() {
    std::string value;
    auto s = db_->Get({}, meta(), "schema", &value);
    if (s.ok()) {
      if (value != rocksdb_schema)
        return make_error(errc::corrupt_data, "store schema is '" + value + "', this build reads '"
                                                + std::string{rocksdb_schema} + "'");
      return {};
    }
    if (!s.IsNotFound())
      return backend(s, "reading the schema key");
    std::unique_ptr<rocksdb::Iterator> it{db_->NewIterator({}, meta())};
    it->SeekToFirst();
    if (it->Valid())
      return make_error(errc::corrupt_data, "store has data but no schema key");
    s = db_->Put(sync_, meta(), "schema", std::string{rocksdb_schema});
    if (!s.ok())
      return backend(s, "writing the schema key");
    return {};
  }

  result<std::optional<pointer_record>> read_pointer(std::string_view pool) override {
    if (auto ok = validate_pool(pool); !ok)
      return std::move(ok).error();
    return load_pointer(pool);
  }

  result<pointer_record> claim(std::string_view pool, const version_ref& boot) override {
    if (auto ok = validate_pool(pool); !ok)
      return std::move(ok).error();
    std::lock_guard guard{publish_mutex_};
    auto current = load_pointer(pool);
    if (!current)
      return std::move(current).error();
    auto stored = load_manifest(pool, boot, false);
    if (!stored)
      return std::move(stored).error();
    auto known = load_boot(pool, boot.run_id);
    if (!known)
      return std::move(known).error();
    auto decision = decide_claim(*current, boot, stored->is_full(), *known);
    if (!decision)
      return std::move(decision).error();
    if (auto ok = commit_pointer(pool, *decision, boot, stored->is_full(), !known->has_value());
        !ok)
      return std::move(ok).error();
    return decision->next;
  }

  result<pointer_record> compare_and_advance_pointer(std::string_view pool,
                                                     const std::optional<version_ref>& expected,
                                                     const version_ref& proposed) override {
    if (auto ok = validate_pool(pool); !ok)
      return std::move(ok).error();
    std::lock_guard guard{publish_mutex_};
    auto current = load_pointer(pool);
    if (!current)
      return std::move(current).error();
    std::optional<version_ref> actual;
    if (*current)
      actual = (*current)->latest;
    if (auto ok = check_compare_and_swap(expected, actual, proposed); !ok)
      return std::move(ok).error();
    auto stored = load_manifest(pool, proposed, false);
    if (!stored)
      return std::move(stored).error();
    auto known = load_boot(pool, proposed.run_id);
    if (!known)
      return std::move(known).error();
    if (!stored->is_full()) {
      // A delta is only publishable on top of its complete base.
      auto base = load_manifest(pool, {proposed.run_id, proposed.version - 1}, true);
      if (!base)
        return make_error(errc::missing_link, "cannot publish " + to_string(proposed)
                                                + ": its base version is not published ("
                                                + base.error().message + ")");
    }
    pointer_proposal proposal{proposed, stored->is_full(), *known,
                              actual == proposed ? std::optional<bool>{true} : std::nullopt};
    auto decision = decide_pointer_move(*current, proposal);
    if (!decision)
      return std::move(decision).error();
    if (auto ok = commit_pointer(pool, *decision, proposed, stored->is_full(), !known->has_value());
        !ok)
      return std::move(ok).error();
    return decision->next;
  }

  status put_version(std::string_view pool, const manifest& m,
                     std::span<const shard_upload> shards) override {
    if (auto ok = validate_pool(pool); !ok)
      return ok;
    if (auto ok = validate(m); !ok)
      return ok;
    std::lock_guard guard{publish_mutex_};
    const std::string json = to_json(m);
    std::string existing;
    auto s = db_->Get({}, manifests(), manifest_key(pool, m.ref), &existing);
    if (s.ok()) {
      if (existing == json)
        return {};
      if (is_done(pool, m.ref))
        return make_error(errc::version_exists,
                          to_string(m.ref) + " is already stored with different content");
    } else if (!s.IsNotFound()) {
      return backend(s, "reading manifest of " + to_string(m.ref));
    }
    // Nothing of an incomplete version was ever visible: start it over.
    auto [begin, end] = chunk_range(pool, m.ref);
    s = db_->DeleteRange({}, chunks(), begin, end);
    if (!s.ok())
      return backend(s, "clearing stale pieces of " + to_string(m.ref));
    rocksdb::WriteOptions unsynced;
    auto layout = ingest_version(
      m, shards, [&](uint32_t shard, uint64_t offset, std::span<const std::byte> bytes) -> status {
        auto ws =
          db_->Put(unsynced, chunks(), chunk_key(pool, m.ref, shard, offset),
                   rocksdb::Slice{reinterpret_cast<const char*>(bytes.data()), bytes.size()});
        if (!ws.ok())
          return backend(ws, "writing shard bytes of " + to_string(m.ref));
        return {};
      });
    if (!layout) {
      (void) db_->DeleteRange({}, chunks(), begin, end);
      return std::move(layout).error();
    }
    // The synced batch also makes every earlier write of this WAL durable.
    rocksdb::WriteBatch batch;
    batch.Put(manifests(), layout_key(pool, m.ref), encode_layout(*layout));
    batch.Put(manifests(), manifest_key(pool, m.ref), json);
    s = db_->Write(sync_, &batch);
    if (!s.ok())
      return backend(s, "writing manifest of " + to_string(m.ref));
    return {};
  }

  result<manifest> read_manifest(std::string_view pool, const version_ref& ref) override {
    if (auto ok = validate_pool(pool); !ok)
      return std::move(ok).error();
    return load_manifest(pool, ref, true);
  }

  status read_range(std::string_view pool, const version_ref& ref, std::string_view tensor,
                    uint64_t offset, std::span<std::byte> out) override {
    if (auto ok = validate_pool(pool); !ok)
      return ok;
    auto layout = load_layout(pool, ref);
    if (!layout)
      return std::move(layout).error();
    auto it = layout->tensors.find(std::string{tensor});
    if (it == layout->tensors.end())
      return make_error(errc::not_found,
                        "tensor '" + std::string{tensor} + "' is not stored in " + to_string(ref));
    const auto& loc = it->second;
    if (offset > loc.size || out.size() > loc.size - offset)
      return make_error(errc::invalid_argument, "range [" + std::to_string(offset) + ", +"
                                                  + std::to_string(out.size())
                                                  + ") is outside tensor '" + std::string{tensor}
                                                  + "' of " + std::to_string(loc.size) + " bytes");
    uint64_t pos = loc.offset + offset;
    size_t done = 0;
    rocksdb::PinnableSlice piece;
    while (done < out.size()) {
      uint64_t piece_start = pos / piece_size * piece_size;
      piece.Reset();
      auto s = db_->Get({}, chunks(), chunk_key(pool, ref, loc.shard, piece_start), &piece);
      if (!s.ok())
        return s.IsNotFound() ? make_error(errc::corrupt_data, "a piece of " + to_string(ref)
                                                                 + " is missing from the store")
                              : backend(s, "reading " + to_string(ref));
      uint64_t within = pos - piece_start;
      if (within >= piece.size())
        return make_error(errc::corrupt_data, "a piece of " + to_string(ref) + " is short");
      size_t take = std::min<uint64_t>(piece.size() - within, out.size() - done);
      std::memcpy(out.data() + done, piece.data() + within, take);
      done += take;
      pos += take;
    }
    return {};
  }

  result<std::vector<version_ref>> list_versions(std::string_view pool,
                                                 std::string_view run_id) override {
    if (auto ok = validate_pool(pool); !ok)
      return std::move(ok).error();
    if (auto ok = validate_run_id(run_id); !ok)
      return std::move(ok).error();
    std::vector<version_ref> out;
    for (auto& [v, full] : done_versions(pool, run_id))
      out.push_back({std::string{run_id}, v});
    return out;
  }

  result<retention_report> retain(std::string_view pool, size_t keep_last) override {
    if (auto ok = validate_pool(pool); !ok)
      return std::move(ok).error();
    std::lock_guard guard{publish_mutex_};
    auto pointer = load_pointer(pool);
    if (!pointer)
      return std::move(pointer).error();
    retention_report report;
    const auto prefix = boot_prefix(pool);
    std::vector<std::pair<std::string, uint64_t>> runs;
    {
      std::unique_ptr<rocksdb::Iterator> it{db_->NewIterator({}, meta())};
      for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
        auto boot = parse_number(it->value().ToString());
        if (!boot)
          return make_error(errc::corrupt_data,
                            "boot record of pool '" + std::string{pool} + "' is corrupt");
        runs.emplace_back(it->key().ToString().substr(prefix.size()), *boot);
      }
    }
    for (const auto& [run, boot] : runs) {
      std::vector<stored_version> versions;
      for (auto& [v, full] : done_versions(pool, run))
        versions.push_back({v, full});
      std::set<uint64_t> pinned;
      if (*pointer && (*pointer)->latest.run_id == run)
        pinned.insert((*pointer)->latest.version);
      auto doomed = select_deletions(versions, boot, keep_last, pinned);
      for (const auto& v : versions) {
        version_ref ref{run, v.version};
        if (!doomed.contains(v.version)) {
          report.kept.push_back(ref);
          continue;
        }
        // The completion record goes first, so a half-deleted version is never visible.
        rocksdb::WriteBatch batch;
        batch.Delete(meta(), done_key(pool, ref));
        batch.Delete(manifests(), manifest_key(pool, ref));
        batch.Delete(manifests(), layout_key(pool, ref));
        auto s = db_->Write(sync_, &batch);
        if (!s.ok())
          return backend(s, "deleting " + to_string(ref));
        auto [begin, end] = chunk_range(pool, ref);
        s = db_->DeleteRange({}, chunks(), begin, end);
        if (!s.ok())
          return backend(s, "deleting the pieces of " + to_string(ref));
        forget_layout(pool, ref);
        report.deleted.push_back(ref);
      }
    }
    return report;
  }

private:
  rocksdb::ColumnFamilyHandle* meta() const { return cfs_[0]; }
  rocksdb::ColumnFamilyHandle* manifests() const { return cfs_[1]; }
  rocksdb::ColumnFamilyHandle* chunks() const { return cfs_[2]; }

  static std::optional<uint64_t> parse_number(const std::string& text) {
    if (text.empty() || text.size() > 20)
      return std::nullopt;
    uint64_t v = 0;
    for (char c : text) {
      if (c < '0' || c > '9')
        return std::nullopt;
      v = v * 10 + static_cast<uint64_t>(c - '0');
    }
    return v;
  }

  result<std::optional<pointer_record>> load_pointer(std::string_view pool) {
    std::string value;
    auto s = db_->Get({}, meta(), pointer_key(pool), &value);
    if (s.IsNotFound())
      return std::optional<pointer_record>{};
    if (!s.ok())
      return backend(s, "reading the pointer of pool '" + std::string{pool} + "'");
    auto p = decode_pointer(value);
    if (!p)
      return make_error(errc::corrupt_data,
                        "pointer of pool '" + std::string{pool} + "': " + p.error().message);
    return std::optional<pointer_record>{*p};
  }

  result<std::optional<uint64_t>> load_boot(std::string_view pool, std::string_view run) {
    std::string value;
    auto s = db_->Get({}, meta(), boot_key(pool, run), &value);
    if (s.IsNotFound())
      return std::optional<uint64_t>{};
    if (!s.ok())
      return backend(s, "reading the boot of run '" + std::string{run} + "'");
    auto v = parse_number(value);
    if (!v)
      return make_error(errc::corrupt_data,
                        "boot record of run '" + std::string{run} + "' is corrupt");
    return std::optional<uint64_t>{*v};
  }

  bool is_done(std::string_view pool, const version_ref& ref) {
    std::string value;
    return db_->Get({}, meta(), done_key(pool, ref), &value).ok();
  }

  /// (version, is_full) of a run's complete versions, ascending.
  std::vector<std::pair<uint64_t, bool>> done_versions(std::string_view pool,
                                                       std::string_view run) {
    std::vector<std::pair<uint64_t, bool>> out;
    const auto prefix = done_prefix(pool, run);
    std::unique_ptr<rocksdb::Iterator> it{db_->NewIterator({}, meta())};
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      auto v = parse_number(it->key().ToString().substr(prefix.size()));
      if (v)
        out.emplace_back(*v, it->value() == "F");
    }
    return out;
  }

  result<manifest> load_manifest(std::string_view pool, const version_ref& ref,
                                 bool complete_only) {
    if (auto ok = validate_run_id(ref.run_id); !ok)
      return std::move(ok).error();
    if (complete_only && !is_done(pool, ref))
      return make_error(errc::not_found,
                        to_string(ref) + " is not published in pool '" + std::string{pool} + "'");
    std::string json;
    auto s = db_->Get({}, manifests(), manifest_key(pool, ref), &json);
    if (s.IsNotFound())
      return make_error(errc::not_found,
                        to_string(ref) + " is not stored in pool '" + std::string{pool} + "'");
    if (!s.ok())
      return backend(s, "reading manifest of " + to_string(ref));
    auto m = parse_manifest(json);
    if (!m)
      return make_error(errc::corrupt_data,
                        "stored manifest of " + to_string(ref) + ": " + m.error().message);
    if (m->ref != ref)
      return make_error(errc::corrupt_data,
                        "stored manifest of " + to_string(ref) + " names " + to_string(m->ref));
    return m;
  }

  result<version_layout> load_layout(std::string_view pool, const version_ref& ref) {
    const auto key = layout_key(pool, ref);
    {
      std::lock_guard guard{cache_mutex_};
      if (auto it = layouts_.find(key); it != layouts_.end())
        return it->second;
    }
    if (!is_done(pool, ref))
      return make_error(errc::not_found,
                        to_string(ref) + " is not published in pool '" + std::string{pool} + "'");
    std::string bytes;
    auto s = db_->Get({}, manifests(), key, &bytes);
    if (!s.ok())
      return s.IsNotFound()
               ? make_error(errc::corrupt_data, "layout of " + to_string(ref) + " is missing")
               : backend(s, "reading layout of " + to_string(ref));
    auto layout = decode_layout(bytes);
    if (!layout)
      return make_error(errc::corrupt_data, to_string(ref) + ": " + layout.error().message);
    std::lock_guard guard{cache_mutex_};
    if (layouts_.size() > 256)
      layouts_.clear();
    layouts_.emplace(key, *layout);
    return layout;
  }

  void forget_layout(std::string_view pool, const version_ref& ref) {
    std::lock_guard guard{cache_mutex_};
    layouts_.erase(layout_key(pool, ref));
  }

  /// The pointer and the completion record (and a new run's boot) move in one
  /// synced batch.
  status commit_pointer(std::string_view pool, const pointer_decision& decision,
                        const version_ref& target, bool is_full, bool new_run) {
    if (decision.move == pointer_move::unchanged)
      return {};
    rocksdb::WriteBatch batch;
    batch.Put(meta(), pointer_key(pool), encode_pointer(decision.next));
    batch.Put(meta(), done_key(pool, target), is_full ? "F" : "D");
    if (new_run)
      batch.Put(meta(), boot_key(pool, target.run_id), std::to_string(decision.next.boot_version));
    auto s = db_->Write(sync_, &batch);
    if (!s.ok())
      return backend(s, "moving the pointer of pool '" + std::string{pool} + "'");
    return {};
  }

  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> cfs_;
  rocksdb::WriteOptions sync_;
  std::mutex publish_mutex_;
  std::mutex cache_mutex_;
  std::map<std::string, version_layout> layouts_;
};

} // namespace

result<std::unique_ptr<store_backend>> open_rocksdb_store(const std::string& path,
                                                          rocksdb_options opts) {
  rocksdb::DBOptions db_opts;
  db_opts.create_if_missing = opts.create_if_missing;
  db_opts.create_missing_column_families = true;
  if (opts.env)
    db_opts.env = opts.env.get();
  rocksdb::ColumnFamilyOptions small;
  rocksdb::ColumnFamilyOptions blobs;
  // Shard pieces are large: keep them in blob files instead of rewriting them
  // through every compaction.
  blobs.enable_blob_files = true;
  blobs.min_blob_size = 4096;
  blobs.blob_file_size = uint64_t{256} << 20;
  blobs.write_buffer_size = uint64_t{128} << 20;
  blobs.compression = rocksdb::kNoCompression;
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors{
    {rocksdb::kDefaultColumnFamilyName, small}, {"manifests", small}, {"chunks", blobs}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  auto s = rocksdb::DB::Open(db_opts, path, descriptors, &handles, &raw);
  if (!s.ok())
    return make_error(errc::backend_failure, "opening store at '" + path + "': " + s.ToString());
  auto store = std::make_unique<rocksdb_store>(std::unique_ptr<rocksdb::DB>{raw}, handles);
  if (auto ok = store->check_schema(); !ok)
    return std::move(ok).error();
  return std::unique_ptr<store_backend>{std::move(store)};
}

} // namespace stitch::store
