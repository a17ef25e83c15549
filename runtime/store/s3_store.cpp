#include "runtime/store/s3_store.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "runtime/store/version_layout.hpp"

namespace stitch::store {

using transport::s3_client;
using transport::s3_completed_part;
using transport::s3_write_condition;

namespace {

/// `latest` and `boot` hold one version identity; anything longer is garbage.
constexpr size_t max_record_bytes = 4096;
constexpr std::string_view index_name = "model.safetensors.index.json";
constexpr std::string_view layout_name = ".stitch-layout";
constexpr std::string_view published_name = ".stitch-published";
/// S3's limit on the parts of one multipart upload.
constexpr uint64_t max_parts = 10'000;

std::string_view trim(std::string_view text) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!text.empty() && space(text.front()))
    text.remove_prefix(1);
  while (!text.empty() && space(text.back()))
    text.remove_suffix(1);
  return text;
}

/// A pointer or boot record's text: a version identity naming a run.
result<version_ref> parse_record(std::string_view body, std::string_view what) {
  auto text = trim(body);
  auto ref = parse_version_ref(text);
  if (!ref || !*ref || (*ref)->run_id.empty())
    return make_error(errc::corrupt_data, std::string{what} + " holds " + quote_untrusted(text)
                                            + ", not a version like run/weight_v000007");
  return **ref;
}

} // namespace

struct s3_store::impl {
  std::unique_ptr<s3_client> client;
  transport::s3_location where;
  std::mutex cache_mutex;
  /// Versions are immutable once complete, so what was read of them stays true
  /// until this process deletes them.
  /// Publication marker key -> is_full.
  std::map<std::string, bool> published_cache;

  // -- keys ------------------------------------------------------------------

  std::string pool_prefix(std::string_view pool) const {
    return (where.prefix.empty() ? std::string{} : where.prefix + "/") + std::string{pool} + "/";
  }
  std::string latest_key(std::string_view pool) const { return pool_prefix(pool) + "latest"; }
  std::string run_prefix(std::string_view pool, std::string_view run) const {
    return pool_prefix(pool) + std::string{run} + "/";
  }
  std::string boot_key(std::string_view pool, std::string_view run) const {
    return run_prefix(pool, run) + "boot";
  }
  std::string version_prefix(std::string_view pool, const version_ref& ref) const {
    return run_prefix(pool, ref.run_id) + version_dir_name(ref.version) + "/";
  }
  std::string index_key(std::string_view pool, const version_ref& ref) const {
    return version_prefix(pool, ref) + std::string{index_name};
  }
  std::string layout_key(std::string_view pool, const version_ref& ref) const {
    return version_prefix(pool, ref) + std::string{layout_name};
  }
  std::string published_key(std::string_view pool, const version_ref& ref) const {
    return version_prefix(pool, ref) + std::string{published_name};
  }
  std::string url(std::string_view key) const {
    return "s3://" + where.bucket + "/" + std::string{key};
  }
  static std::string in_pool(std::string_view pool) {
    return " in pool '" + std::string{pool} + "'";
  }

  // -- records ---------------------------------------------------------------

  struct latest_record {
    version_ref ref;
    std::string etag;
  };

  /// A small text record, or nullopt when missing; oversized is `corrupt_data`.
  result<std::optional<transport::s3_object>> read_small(const std::string& key) {
    auto obj = client->get_object(where.bucket, key, max_record_bytes);
    if (!obj) {
      if (obj.error().code == errc::not_found)
        return std::optional<transport::s3_object>{};
      if (obj.error().code == errc::limit_exceeded)
        return make_error(errc::corrupt_data,
                          url(key) + " is over " + std::to_string(max_record_bytes) + " bytes");
      return std::move(obj).error();
    }
    return std::optional<transport::s3_object>{std::move(*obj)};
  }

  result<std::optional<latest_record>> read_latest(std::string_view pool) {
    const auto key = latest_key(pool);
    auto obj = read_small(key);
    if (!obj)
      return std::move(obj).error();
    if (!*obj)
      return std::optional<latest_record>{};
    auto ref = parse_record((*obj)->body, "the pointer " + url(key));
    if (!ref)
      return std::move(ref).error();
    return std::optional<latest_record>{latest_record{std::move(*ref), std::move((*obj)->etag)}};
  }

  result<std::optional<uint64_t>> read_boot(std::string_view pool, std::string_view run) {
    const auto key = boot_key(pool, run);
    auto obj = read_small(key);
    if (!obj)
      return std::move(obj).error();
    if (!*obj)
      return std::optional<uint64_t>{};
    auto ref = parse_record((*obj)->body, "the boot record " + url(key));
    if (!ref)
      return std::move(ref).error();
    if (ref->run_id != run)
      return make_error(errc::corrupt_data,
                        "the boot record " + url(key) + " names run '" + ref->run_id + "'");
    return std::optional<uint64_t>{ref->version};
  }

  /// The pool's pointer with the run's boot, and the `latest` object's ETag.
  result<std::pair<std::optional<pointer_record>, std::string>>
  read_pointer_record(std::string_view pool) {
    using out_type = std::pair<std::optional<pointer_record>, std::string>;
    auto latest = read_latest(pool);
    if (!latest)
      return std::move(latest).error();
    if (!*latest)
      return out_type{};
    const auto& ref = (*latest)->ref;
    auto boot = read_boot(pool, ref.run_id);
    if (!boot)
      return std::move(boot).error();
    if (!*boot)
      return make_error(errc::corrupt_data, "the pointer" + in_pool(pool) + " names "
                                              + to_string(ref) + " but run '" + ref.run_id
                                              + "' has no boot record");
    if (**boot > ref.version)
      return make_error(errc::corrupt_data, "the pointer" + in_pool(pool) + " names "
                                              + to_string(ref) + ", below its run's boot version "
                                              + std::to_string(**boot));
    return out_type{pointer_record{ref, **boot}, (*latest)->etag};
  }

  // -- versions --------------------------------------------------------------

  /// Whether `ref` is published (its marker exists) and then whether it is a
  /// full anchor; nullopt when it is not published.
  result<std::optional<bool>> published(std::string_view pool, const version_ref& ref) {
    const auto key = published_key(pool, ref);
    {
      std::lock_guard lock{cache_mutex};
      if (auto it = published_cache.find(key); it != published_cache.end())
        return std::optional<bool>{it->second};
    }
    auto obj = read_small(key);
    if (!obj)
      return std::move(obj).error();
    if (!*obj)
      return std::optional<bool>{};
    auto text = trim((*obj)->body);
    if (text != "full" && text != "delta")
      return make_error(errc::corrupt_data, "the marker " + url(key) + " holds "
                                              + quote_untrusted(text) + ", not full or delta");
    remember_published(key, text == "full");
    return std::optional<bool>{text == "full"};
  }

  void remember_published(const std::string& key, bool is_full) {
    std::lock_guard lock{cache_mutex};
    if (published_cache.size() >= 65536)
      published_cache.clear();
    published_cache[key] = is_full;
  }

  /// A stored manifest; with `published_only`, only once the pointer passed it.
  result<manifest> load_manifest(std::string_view pool, const version_ref& ref,
                                 bool published_only) {
    if (auto ok = validate_run_id(ref.run_id); !ok)
      return std::move(ok).error();
    if (published_only) {
      auto pub = published(pool, ref);
      if (!pub)
        return std::move(pub).error();
      if (!*pub)
        return make_error(errc::not_found, to_string(ref) + " is not published" + in_pool(pool));
    }
    const auto key = index_key(pool, ref);
    auto obj = client->get_object(where.bucket, key, max_manifest_bytes);
    if (!obj) {
      if (obj.error().code == errc::not_found)
        return make_error(errc::not_found, to_string(ref) + " is not stored" + in_pool(pool));
      if (obj.error().code == errc::limit_exceeded)
        return make_error(errc::corrupt_data, url(key) + " is over the manifest size limit");
      return std::move(obj).error();
    }
    auto m = parse_manifest(obj->body);
    if (!m)
      return make_error(errc::corrupt_data, url(key) + ": " + m.error().message);
    if (m->ref != ref)
      return make_error(errc::corrupt_data, url(key) + " names " + to_string(m->ref));
    return m;
  }

  /// The layout object of a version, published or not.
  result<version_layout> load_layout(std::string_view pool, const version_ref& ref) {
    const auto key = layout_key(pool, ref);
    auto obj = client->get_object(where.bucket, key, max_manifest_bytes);
    if (!obj) {
      if (obj.error().code == errc::not_found)
        return make_error(errc::not_found, "the layout " + url(key) + " is missing");
      return std::move(obj).error();
    }
    auto layout = decode_layout(obj->body);
    if (!layout)
      return make_error(errc::corrupt_data, url(key) + ": " + layout.error().message);
    return layout;
  }

  void forget(std::string_view pool, const version_ref& ref) {
    std::lock_guard lock{cache_mutex};
    published_cache.erase(published_key(pool, ref));
  }

  /// Every page of a listing.
  template <class Visit>
  status list_all(const std::string& prefix, std::string_view delimiter, Visit&& visit) {
    std::string token;
    for (;;) {
      auto page = client->list_objects_v2(where.bucket, prefix, delimiter, token);
      if (!page)
        return std::move(page).error();
      visit(*page);
      if (!page->truncated)
        return {};
      if (page->next_continuation_token == token)
        return make_error(errc::backend_failure,
                          "listing " + url(prefix) + " returned the same continuation token twice");
      token = page->next_continuation_token;
    }
  }

  /// The run's versions that hold a publication marker, ascending.
  result<std::vector<version_ref>> published_versions(std::string_view pool, std::string_view run) {
    const auto prefix = run_prefix(pool, run);
    std::set<uint64_t> found;
    auto ok = list_all(prefix, {}, [&](const transport::s3_list_page& page) {
      for (const auto& obj : page.objects) {
        std::string_view rest{obj.key};
        if (!rest.starts_with(prefix))
          continue;
        rest.remove_prefix(prefix.size());
        auto slash = rest.find('/');
        if (slash == rest.npos || rest.substr(slash + 1) != published_name)
          continue;
        auto dir = rest.substr(0, slash);
        auto ref = parse_version_ref(std::string{run} + "/" + std::string{dir});
        if (ref && *ref && version_dir_name((*ref)->version) == dir)
          found.insert((*ref)->version);
      }
    });
    if (!ok)
      return std::move(ok).error();
    std::vector<version_ref> out;
    for (auto v : found)
      out.push_back({std::string{run}, v});
    return out;
  }

  /// Deletes every object of a version: the marker first, then the index, so
  /// a half-deleted version is visible neither to Stitch nor as a complete
  /// HF directory.
  status delete_version(std::string_view pool, const version_ref& ref) {
    forget(pool, ref);
    for (const auto& key : {published_key(pool, ref), index_key(pool, ref)})
      if (auto ok = client->delete_object(where.bucket, key); !ok)
        return ok;
    std::vector<std::string> keys;
    auto found = list_all(version_prefix(pool, ref), {}, [&](const transport::s3_list_page& page) {
      for (const auto& obj : page.objects)
        keys.push_back(obj.key);
    });
    if (!found)
      return found;
    for (const auto& key : keys)
      if (auto ok = client->delete_object(where.bucket, key); !ok)
        return ok;
    return {};
  }

  // -- writes ----------------------------------------------------------------

  /// Publishes `target`: its marker, the boot record when the run is new
  /// (create-only), then the pointer (conditional on what was read) — the
  /// pointer last, so whoever sees it can read everything it names.
  status commit(std::string_view pool, const pointer_record& next, const version_ref& target,
                bool is_full, bool new_run, const std::optional<version_ref>& read_latest_ref,
                const std::string& etag) {
    const auto marker = published_key(pool, target);
    if (auto put = client->put_object(where.bucket, marker, is_full ? "full\n" : "delta\n"); !put)
      return std::move(put).error();
    remember_published(marker, is_full);
    if (new_run) {
      const auto key = boot_key(pool, next.latest.run_id);
      const version_ref boot{next.latest.run_id, next.boot_version};
      auto put =
        client->put_object(where.bucket, key, to_string(boot) + "\n", s3_write_condition::absent());
      if (!put && put.error().code == errc::conflict) {
        // Another publisher claimed the run first: fine only if it chose the same boot.
        auto now = read_boot(pool, next.latest.run_id);
        if (!now)
          return std::move(now).error();
        if (*now != next.boot_version)
          return make_error(errc::conflict, "run '" + next.latest.run_id
                                              + "' was claimed concurrently at boot "
                                              + (*now ? std::to_string(**now) : "(none)"));
      } else if (!put) {
        return std::move(put).error();
      }
    }
    // A server that sends no ETag cannot do If-Match either: plain write then.
    s3_write_condition condition = s3_write_condition::absent();
    if (read_latest_ref)
      condition = etag.empty() ? s3_write_condition{} : s3_write_condition::matching(etag);
    auto put =
      client->put_object(where.bucket, latest_key(pool), to_string(next.latest) + "\n", condition);
    if (put)
      return {};
    if (put.error().code != errc::conflict)
      return std::move(put).error();
    std::optional<version_ref> actual;
    if (auto now = read_latest(pool); now && *now)
      actual = (*now)->ref;
    return make_error(errc::conflict, describe(cas_conflict{read_latest_ref, actual, next.latest}));
  }

  /// Removes what a failed publish wrote, best effort: nothing of it is
  /// visible anyway (its index was never written).
  void discard(const std::vector<std::string>& keys, const std::string& upload_key,
               const std::string& upload_id) {
    if (!upload_id.empty())
      (void) client->abort_multipart_upload(where.bucket, upload_key, upload_id);
    for (const auto& key : keys)
      (void) client->delete_object(where.bucket, key);
  }
};

namespace {

/// One attempt's shards, written straight under the version's prefix: a part
/// of a multipart upload per `piece_size` bytes, or one PutObject for a
/// shard of one piece. Nothing of it is visible until `finish` writes the
/// index; a sink dropped before that deletes what it wrote.
class s3_sink final : public shard_sink {
public:
  s3_sink(s3_store::impl& s, std::string pool, version_ref ref)
      : s_(s), pool_(std::move(pool)), ref_(std::move(ref)) {}

  ~s3_sink() override {
    if (!finished_)
      s_.discard(written_, key_, upload_id_);
  }

  status open_shard(std::string_view name, uint64_t size) override {
    if ((size + piece_size - 1) / piece_size > max_parts)
      return make_error(errc::limit_exceeded, "shard '" + std::string{name} + "' of "
                                                + to_string(ref_) + " needs more than "
                                                + std::to_string(max_parts) + " parts of "
                                                + std::to_string(piece_size) + " bytes");
    key_ = s_.version_prefix(pool_, ref_) + std::string{name};
    sent_ = 0;
    parts_.clear();
    buffer_.clear();
    if (size > piece_size) {
      auto id = s_.client->create_multipart_upload(s_.where.bucket, key_);
      if (!id)
        return std::move(id).error();
      upload_id_ = std::move(*id);
    }
    return {};
  }

  status append(std::span<const std::byte> bytes) override {
    while (!bytes.empty()) {
      const size_t take = std::min(bytes.size(), piece_size - buffer_.size());
      buffer_.insert(buffer_.end(), bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(take));
      bytes = bytes.subspan(take);
      if (buffer_.size() == piece_size && !upload_id_.empty())
        if (auto ok = send_part(); !ok)
          return ok;
    }
    return {};
  }

  status close_shard() override {
    if (upload_id_.empty()) {
      auto put = s_.client->put_object(s_.where.bucket, key_, buffer_);
      if (!put)
        return std::move(put).error();
      buffer_.clear();
      written_.push_back(key_);
      return {};
    }
    if (!buffer_.empty())
      if (auto ok = send_part(); !ok)
        return ok;
    auto done = s_.client->complete_multipart_upload(s_.where.bucket, key_, upload_id_, parts_);
    if (!done)
      return std::move(done).error();
    upload_id_.clear();
    written_.push_back(key_);
    return {};
  }

  status finish(const manifest& m, version_layout layout) override {
    if (auto put = s_.client->put_object(s_.where.bucket, s_.layout_key(pool_, m.ref),
                                         encode_layout(layout));
        !put)
      return std::move(put).error();
    written_.push_back(s_.layout_key(pool_, m.ref));
    // The index last: its presence says every byte above is in place.
    const auto index_key = s_.index_key(pool_, m.ref);
    const std::string json = to_json(m);
    auto put =
      s_.client->put_object(s_.where.bucket, index_key, json, s3_write_condition::absent());
    if (!put && put.error().code == errc::conflict) {
      // A concurrent attempt wrote the index first.
      auto now = s_.client->get_object(s_.where.bucket, index_key, max_manifest_bytes);
      if (!now)
        return std::move(now).error();
      auto parsed = parse_manifest(now->body);
      if (!(now->body == json || (parsed && *parsed == m)))
        return make_error(errc::version_exists, to_string(m.ref) + " was stored concurrently"
                                                  + s_.in_pool(pool_) + " with different content");
    } else if (!put) {
      return std::move(put).error();
    }
    finished_ = true;
    return {};
  }

private:
  status send_part() {
    const auto number = static_cast<uint32_t>(sent_ / piece_size + 1);
    auto etag = s_.client->upload_part(s_.where.bucket, key_, upload_id_, number, buffer_);
    if (!etag)
      return std::move(etag).error();
    parts_.push_back({number, std::move(*etag)});
    sent_ += buffer_.size();
    buffer_.clear();
    return {};
  }

  s3_store::impl& s_;
  std::string pool_;
  version_ref ref_;
  std::string key_;
  uint64_t sent_ = 0;
  std::string upload_id_;
  std::vector<s3_completed_part> parts_;
  std::vector<std::byte> buffer_;
  std::vector<std::string> written_;
  bool finished_ = false;
};

} // namespace

s3_store::s3_store(std::unique_ptr<transport::s3_client> client, transport::s3_location where)
    : impl_(std::make_unique<impl>()) {
  impl_->client = std::move(client);
  impl_->where = std::move(where);
}

s3_store::~s3_store() = default;

result<store_base::pointer_snapshot> s3_store::load_pointer(std::string_view pool) {
  auto record = impl_->read_pointer_record(pool);
  if (!record)
    return std::move(record).error();
  return pointer_snapshot{std::move(record->first), std::move(record->second)};
}

result<std::optional<uint64_t>> s3_store::load_boot(std::string_view pool, std::string_view run) {
  return impl_->read_boot(pool, run);
}

result<manifest> s3_store::load_manifest(std::string_view pool, const version_ref& ref) {
  return impl_->load_manifest(pool, ref, false);
}

result<bool> s3_store::is_published(std::string_view pool, const version_ref& ref) {
  auto pub = impl_->published(pool, ref);
  if (!pub)
    return std::move(pub).error();
  return pub->has_value();
}

// The compare-and-swap is a conditional write of `latest` (If-Match on the
// ETag read, If-None-Match: * when there was none). On a server that ignores
// conditional writes (s3rver, some S3 clones) it degrades to check-then-write:
// safe with one publisher per pool, which the pool's lock guarantees within a
// process, but two nodes publishing to one pool could then lose an update.
// runtime/store/README.md.
status s3_store::commit_move(std::string_view pool, const pointer_snapshot& seen,
                             const pointer_commit& move) {
  std::optional<version_ref> read_ref;
  if (seen.record)
    read_ref = seen.record->latest;
  return impl_->commit(pool, move.next, move.target, move.target_is_full, move.new_run, read_ref,
                       seen.token);
}

result<std::unique_ptr<shard_sink>> s3_store::open_sink(std::string_view pool,
                                                        const version_ref& ref) {
  // An earlier unpublished attempt used the same keys: it goes first.
  auto existing = impl_->client->head_object(impl_->where.bucket, impl_->index_key(pool, ref));
  if (existing) {
    auto deleted = impl_->delete_version(pool, ref);
    forget_layout(pool, ref);
    if (!deleted)
      return std::move(deleted).error();
  } else if (existing.error().code != errc::not_found) {
    return std::move(existing).error();
  }
  return std::unique_ptr<shard_sink>{std::make_unique<s3_sink>(*impl_, std::string{pool}, ref)};
}

result<std::vector<std::string>> s3_store::claimed_runs(std::string_view pool) {
  auto& s = *impl_;
  // Runs are the "directories" under the pool; claimed ones hold a boot record.
  std::vector<std::string> candidates;
  const auto prefix = s.pool_prefix(pool);
  auto listed = s.list_all(prefix, "/", [&](const transport::s3_list_page& page) {
    for (const auto& p : page.common_prefixes) {
      if (!p.starts_with(prefix) || !p.ends_with('/'))
        continue;
      auto run = p.substr(prefix.size(), p.size() - prefix.size() - 1);
      if (validate_run_id(run))
        candidates.push_back(std::move(run));
    }
  });
  if (!listed)
    return std::move(listed).error();
  std::vector<std::string> runs;
  for (auto& run : candidates) {
    auto boot = s.read_boot(pool, run);
    if (!boot)
      return std::move(boot).error();
    if (*boot)
      runs.push_back(std::move(run));
  }
  return runs;
}

result<std::vector<std::string>> s3_store::pools() {
  auto& s = *impl_;
  // Pools are the "directories" under the prefix; those with a pointer count.
  std::vector<std::string> candidates;
  const auto prefix = s.where.prefix.empty() ? std::string{} : s.where.prefix + "/";
  auto listed = s.list_all(prefix, "/", [&](const transport::s3_list_page& page) {
    for (const auto& p : page.common_prefixes) {
      if (!p.starts_with(prefix) || !p.ends_with('/'))
        continue;
      auto pool = p.substr(prefix.size(), p.size() - prefix.size() - 1);
      if (validate_pool(pool))
        candidates.push_back(std::move(pool));
    }
  });
  if (!listed)
    return std::move(listed).error();
  std::vector<std::string> out;
  for (auto& pool : candidates) {
    auto latest = s.read_latest(pool);
    if (!latest)
      return std::move(latest).error();
    if (*latest)
      out.push_back(std::move(pool));
  }
  return out;
}

result<std::vector<stored_version>> s3_store::published_versions(std::string_view pool,
                                                                 std::string_view run) {
  auto refs = impl_->published_versions(pool, run);
  if (!refs)
    return std::move(refs).error();
  std::vector<stored_version> out;
  for (const auto& ref : *refs) {
    auto full = impl_->published(pool, ref);
    if (!full)
      return std::move(full).error();
    out.push_back({ref.version, full->value_or(false)});
  }
  return out;
}

status s3_store::delete_version(std::string_view pool, const version_ref& ref) {
  // Forgotten once the marker is gone: a read that loads the layout before
  // then keeps it for itself only.
  auto deleted = impl_->delete_version(pool, ref);
  forget_layout(pool, ref);
  return deleted;
}

result<version_layout> s3_store::load_layout(std::string_view pool, const version_ref& ref) {
  return impl_->load_layout(pool, ref);
}

status s3_store::read_shard(std::string_view pool, const version_ref& ref,
                            const version_layout& layout, const tensor_location& loc,
                            uint64_t offset, std::span<std::byte> out) {
  const auto key = impl_->version_prefix(pool, ref) + layout.shards[loc.shard];
  // Ranged GETs of at most one piece keep memory bounded whatever `out` is.
  size_t done = 0;
  while (done < out.size()) {
    const size_t take = std::min<size_t>(out.size() - done, piece_size);
    auto bytes =
      impl_->client->get_object_range(impl_->where.bucket, key, loc.offset + offset + done, take);
    if (!bytes) {
      if (bytes.error().code == errc::not_found)
        return make_error(errc::not_found,
                          "shard " + impl_->url(key) + " of " + to_string(ref) + " is gone");
      return std::move(bytes).error();
    }
    std::memcpy(out.data() + done, bytes->data(), take);
    done += take;
  }
  return {};
}

result<std::unique_ptr<store_backend>> open_s3_store(std::string_view uri, s3_options options) {
  auto where = transport::parse_s3_uri(uri);
  if (!where)
    return std::move(where).error();
  auto client = s3_client::open(std::move(options.client));
  if (!client)
    return std::move(client).error();
  if (auto ok = (*client)->head_bucket(where->bucket); !ok)
    return make_error(ok.error().code,
                      "opening the S3 store " + quote_untrusted(uri) + ": " + ok.error().message);
  return std::unique_ptr<store_backend>{
    std::make_unique<s3_store>(std::move(*client), std::move(*where))};
}

} // namespace stitch::store
