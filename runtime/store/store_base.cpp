#include "runtime/store/store_base.hpp"

#include <algorithm>

#include "runtime/core/checksum.hpp"

namespace stitch::store {

namespace {

std::string in_pool(std::string_view pool) {
  return " in pool '" + std::string{pool} + "'";
}

status check_names(std::string_view pool, const version_ref& ref) {
  if (auto ok = validate_pool(pool); !ok)
    return ok;
  return validate_run_id(ref.run_id);
}

/// The key of a version in the layout cache.
std::string layout_cache_key(std::string_view pool, const version_ref& ref) {
  return std::string{pool} + '\n' + to_string(ref);
}

/// Published versions whose layouts stay cached (any beyond clear the cache).
constexpr size_t max_cached_layouts = 256;

} // namespace

void store_base::forget_layout(std::string_view pool, const version_ref& ref) {
  std::lock_guard guard{layouts_mutex_};
  layouts_.erase(layout_cache_key(pool, ref));
  ++layouts_forgotten_;
}

result<std::shared_ptr<const version_layout>> store_base::published_layout(std::string_view pool,
                                                                           const version_ref& ref) {
  const auto key = layout_cache_key(pool, ref);
  uint64_t forgotten = 0;
  {
    std::lock_guard guard{layouts_mutex_};
    if (auto it = layouts_.find(key); it != layouts_.end())
      return it->second;
    forgotten = layouts_forgotten_;
  }
  auto published = is_published(pool, ref);
  if (!published)
    return std::move(published).error();
  if (!*published)
    return make_error(errc::not_found, to_string(ref) + " is not published" + in_pool(pool));
  auto layout = load_layout(pool, ref);
  if (!layout)
    return layout.error().code == errc::not_found ? make_error(
             errc::corrupt_data, "the layout of published " + to_string(ref) + in_pool(pool)
                                   + " is missing: " + layout.error().message)
                                                  : std::move(layout).error();
  auto shared = std::make_shared<const version_layout>(std::move(*layout));
  std::lock_guard guard{layouts_mutex_};
  // A layout forgotten since this load began (a version deleted, another
  // attempt recorded) may be the one just loaded: it is used for this read
  // but not kept, or a later read would skip the published check.
  if (layouts_forgotten_ != forgotten)
    return shared;
  if (layouts_.size() >= max_cached_layouts)
    layouts_.clear();
  layouts_.emplace(key, shared);
  return shared;
}

status store_base::read_range(std::string_view pool, const version_ref& ref,
                              std::string_view tensor, uint64_t offset, std::span<std::byte> out) {
  if (auto ok = check_names(pool, ref); !ok)
    return ok;
  auto layout = published_layout(pool, ref);
  if (!layout)
    return std::move(layout).error();
  auto it = (*layout)->tensors.find(std::string{tensor});
  if (it == (*layout)->tensors.end())
    return make_error(errc::not_found,
                      "tensor " + quote_untrusted(tensor) + " is not stored in " + to_string(ref));
  const auto& loc = it->second;
  if (offset > loc.size || out.size() > loc.size - offset)
    return make_error(errc::invalid_argument, "range [" + std::to_string(offset) + ", +"
                                                + std::to_string(out.size())
                                                + ") is outside tensor " + quote_untrusted(tensor)
                                                + " of " + std::to_string(loc.size) + " bytes");
  if (out.empty())
    return {};
  auto read = read_shard(pool, ref, **layout, loc, offset, out);
  if (read || read.error().code == errc::not_found)
    return read;
  // A version deleted (retention) while it was being read loses its bytes
  // after its records: that is "not found", not damage to the store.
  auto published = is_published(pool, ref);
  if (published && !*published) {
    forget_layout(pool, ref);
    return make_error(errc::not_found,
                      to_string(ref) + " was deleted" + in_pool(pool) + " while it was being read");
  }
  return read;
}

std::mutex& store_base::pool_lock(std::string_view pool) {
  std::lock_guard guard{locks_mutex_};
  auto it = pool_locks_.find(pool);
  if (it == pool_locks_.end())
    it = pool_locks_.emplace(std::string{pool}, std::make_unique<std::mutex>()).first;
  return *it->second;
}

result<std::optional<pointer_record>> store_base::read_pointer(std::string_view pool) {
  if (auto ok = validate_pool(pool); !ok)
    return std::move(ok).error();
  if (auto known = pointer_without_io(pool))
    return std::optional<pointer_record>{std::move(*known)};
  // A load is remembered only when no move was under way from before it
  // began until after it ended: one that overlapped a move may have read the
  // pointer from before it, after another reader already saw the move.
  bool remember = false;
  uint64_t moves_seen = 0;
  if (sole_pointer_writer()) {
    std::lock_guard guard{pointers_mutex_};
    remember = moves_under_way_ == 0;
    moves_seen = pointer_moves_;
  }
  auto p = load_pointer(pool);
  if (!p)
    return std::move(p).error();
  if (remember && p->record) {
    std::lock_guard guard{pointers_mutex_};
    if (pointer_moves_ == moves_seen)
      pointers_.insert_or_assign(std::string{pool}, *p->record);
  }
  return std::move(p->record);
}

std::optional<pointer_record> store_base::pointer_without_io(std::string_view pool) {
  if (!sole_pointer_writer())
    return std::nullopt;
  std::lock_guard guard{pointers_mutex_};
  auto it = pointers_.find(pool);
  if (it == pointers_.end())
    return std::nullopt;
  return it->second;
}

status store_base::record_move(std::string_view pool, const pointer_snapshot& seen,
                               const pointer_commit& move) {
  if (!sole_pointer_writer())
    return commit_move(pool, seen, move);
  // Until the move is recorded, readers get the pointer from before it
  // (remembered) or whatever the backend holds (loaded, not remembered).
  {
    std::lock_guard guard{pointers_mutex_};
    ++pointer_moves_;
    ++moves_under_way_;
  }
  auto ok = commit_move(pool, seen, move);
  std::lock_guard guard{pointers_mutex_};
  ++pointer_moves_;
  --moves_under_way_;
  if (ok)
    pointers_.insert_or_assign(std::string{pool}, move.next);
  else
    pointers_.erase(std::string{pool}); // the backend's state is unknown: load it again
  return ok;
}

result<pointer_record> store_base::claim(std::string_view pool, const version_ref& boot) {
  bool changed = false;
  auto next = claim_locked(pool, boot, changed);
  if (next && changed)
    tell_observers(pool, *next);
  return next;
}

result<pointer_record> store_base::compare_and_advance_pointer(
  std::string_view pool, const std::optional<version_ref>& expected, const version_ref& proposed) {
  bool changed = false;
  auto next = advance_locked(pool, expected, proposed, changed);
  if (next && changed)
    tell_observers(pool, *next);
  return next;
}

uint64_t store_base::observe_pointers(pointer_observer observer) {
  std::lock_guard guard{observers_mutex_};
  const uint64_t id = next_observer_++;
  observers_.emplace(id, std::move(observer));
  return id;
}

void store_base::unobserve_pointers(uint64_t id) {
  std::lock_guard guard{observers_mutex_};
  observers_.erase(id);
}

void store_base::tell_observers(std::string_view pool, const pointer_record& now) {
  std::vector<pointer_observer> told;
  {
    std::lock_guard guard{observers_mutex_};
    for (const auto& [id, o] : observers_)
      told.push_back(o);
  }
  const std::string name{pool};
  for (const auto& o : told)
    o(name, now);
}

result<pointer_record> store_base::claim_locked(std::string_view pool, const version_ref& boot,
                                                bool& moved) {
  if (auto ok = check_names(pool, boot); !ok)
    return std::move(ok).error();
  std::lock_guard guard{pool_lock(pool)};
  auto current = load_pointer(pool);
  if (!current)
    return std::move(current).error();
  auto stored = load_manifest(pool, boot);
  if (!stored)
    return std::move(stored).error();
  auto known = load_boot(pool, boot.run_id);
  if (!known)
    return std::move(known).error();
  auto decision = decide_claim(current->record, boot, stored->is_full(), *known);
  if (!decision)
    return std::move(decision).error();
  if (decision->move != pointer_move::unchanged) {
    if (auto ok = record_move(pool, *current,
                              {decision->next, boot, stored->is_full(), !known->has_value()});
        !ok)
      return std::move(ok).error();
    moved = true;
  }
  return decision->next;
}

result<pointer_record> store_base::advance_locked(std::string_view pool,
                                                  const std::optional<version_ref>& expected,
                                                  const version_ref& proposed, bool& moved) {
  if (auto ok = check_names(pool, proposed); !ok)
    return std::move(ok).error();
  std::lock_guard guard{pool_lock(pool)};
  auto current = load_pointer(pool);
  if (!current)
    return std::move(current).error();
  std::optional<version_ref> actual;
  if (current->record)
    actual = current->record->latest;
  if (auto ok = check_compare_and_swap(expected, actual, proposed); !ok)
    return std::move(ok).error();
  auto stored = load_manifest(pool, proposed);
  if (!stored)
    return std::move(stored).error();
  auto known = load_boot(pool, proposed.run_id);
  if (!known)
    return std::move(known).error();
  if (!stored->is_full()) {
    // A delta is only publishable on top of its published base.
    const version_ref base{proposed.run_id, proposed.version - 1};
    auto published = is_published(pool, base);
    if (!published)
      return std::move(published).error();
    if (!*published)
      return make_error(errc::missing_link, "cannot publish " + to_string(proposed)
                                              + ": its base version " + to_string(base)
                                              + " is not published" + in_pool(pool));
  }
  // A stored version's content never changes once published, and a writer
  // refuses other content for it, so the current version proposed again is
  // identical by construction.
  pointer_proposal proposal{proposed, stored->is_full(), *known,
                            actual == proposed ? std::optional<bool>{true} : std::nullopt};
  auto decision = decide_pointer_move(current->record, proposal);
  if (!decision)
    return std::move(decision).error();
  if (decision->move != pointer_move::unchanged) {
    if (auto ok = record_move(pool, *current,
                              {decision->next, proposed, stored->is_full(), !known->has_value()});
        !ok)
      return std::move(ok).error();
    moved = true;
  }
  return decision->next;
}

result<manifest> store_base::read_manifest(std::string_view pool, const version_ref& ref) {
  if (auto ok = check_names(pool, ref); !ok)
    return std::move(ok).error();
  auto published = is_published(pool, ref);
  if (!published)
    return std::move(published).error();
  if (!*published)
    return make_error(errc::not_found, to_string(ref) + " is not published" + in_pool(pool));
  auto m = load_manifest(pool, ref);
  if (!m && m.error().code == errc::not_found)
    return make_error(errc::corrupt_data, to_string(ref) + " is published" + in_pool(pool)
                                            + " but its manifest is gone");
  return m;
}

result<std::vector<version_ref>> store_base::list_versions(std::string_view pool,
                                                           std::string_view run_id) {
  if (auto ok = check_names(pool, {std::string{run_id}, 0}); !ok)
    return std::move(ok).error();
  auto versions = published_versions(pool, run_id);
  if (!versions)
    return std::move(versions).error();
  std::sort(versions->begin(), versions->end(),
            [](const stored_version& a, const stored_version& b) { return a.version < b.version; });
  std::vector<version_ref> out;
  for (const auto& v : *versions)
    out.push_back({std::string{run_id}, v.version});
  return out;
}

result<std::vector<std::string>> store_base::list_pools() {
  auto all = pools();
  if (!all)
    return all;
  std::sort(all->begin(), all->end());
  all->erase(std::unique(all->begin(), all->end()), all->end());
  return all;
}

/// Checks and stores one attempt; see `version_writer`.
class store_base::writer final : public version_writer {
public:
  writer(store_base& store, std::string pool, version_ref ref, std::unique_ptr<shard_sink> sink)
      : store_(store), pool_(std::move(pool)), ref_(std::move(ref)), sink_(std::move(sink)) {}

  status begin_shard(std::string_view name, uint64_t size) override {
    if (auto ok = usable(); !ok)
      return ok;
    if (auto ok = close_current(); !ok)
      return fail(std::move(ok));
    if (auto ok = check_.begin_shard(name, size); !ok)
      return fail(std::move(ok));
    if (sink_)
      if (auto ok = sink_->open_shard(name, size); !ok)
        return fail(std::move(ok));
    open_ = true;
    return {};
  }

  status write(std::span<const std::byte> bytes) override {
    if (auto ok = usable(); !ok)
      return ok;
    if (auto ok = check_.feed(bytes); !ok)
      return fail(std::move(ok));
    if (sink_)
      if (auto ok = sink_->append(bytes); !ok)
        return fail(std::move(ok));
    return {};
  }

  status add_file(std::string_view name, std::span<const std::byte> bytes) override {
    if (auto ok = usable(); !ok)
      return ok;
    if (auto ok = close_current(); !ok)
      return fail(std::move(ok));
    if (auto ok = validate_file_name(name); !ok)
      return fail(std::move(ok));
    if (files_.contains(std::string{name}))
      return fail(make_error(errc::invalid_argument, "file " + quote_untrusted(name) + " of "
                                                       + to_string(ref_) + " was given twice"));
    std::map<std::string, file_entry> after = files_;
    after.emplace(std::string{name}, file_entry{bytes.size(), 0});
    if (auto ok = validate_files(after); !ok)
      return fail(std::move(ok));
    if (sink_) {
      if (auto ok = sink_->open_shard(name, bytes.size()); !ok)
        return fail(std::move(ok));
      if (auto ok = sink_->append(bytes); !ok)
        return fail(std::move(ok));
      if (auto ok = sink_->close_shard(); !ok)
        return fail(std::move(ok));
    }
    files_.emplace(std::string{name}, file_entry{bytes.size(), checksum::tree_checksum(bytes)});
    return {};
  }

  status commit(const manifest& m) override {
    if (auto ok = usable(); !ok)
      return ok;
    if (m.ref != ref_)
      return fail(make_error(errc::invalid_argument, "the manifest names " + to_string(m.ref)
                                                       + ", but " + to_string(ref_)
                                                       + " is being stored"));
    if (auto ok = close_current(); !ok)
      return fail(std::move(ok));
    auto layout = check_.finish(m);
    if (!layout)
      return fail(std::move(layout).error());
    if (files_ != m.files)
      return fail(make_error(errc::invalid_manifest,
                             "metadata.files of " + to_string(ref_)
                               + " does not describe the files stored with it ("
                               + std::to_string(m.files.size()) + " listed, "
                               + std::to_string(files_.size()) + " stored, or other sizes)"));
    // Each file is a shard of its own name, found by its location key.
    for (const auto& [name, entry] : files_) {
      layout->tensors[file_location_key(name)] =
        tensor_location{static_cast<uint32_t>(layout->shards.size()), 0, entry.size};
      layout->shards.push_back(name);
      layout->shard_sizes.push_back(entry.size);
    }
    std::lock_guard guard{store_.pool_lock(pool_)};
    auto published = store_.is_published(pool_, ref_);
    if (!published)
      return fail(std::move(published).error());
    if (*published) {
      // Its bytes are immutable: only the same content is a success.
      auto existing = store_.load_manifest(pool_, ref_);
      if (!existing)
        return fail(std::move(existing).error());
      failed_ = true;
      if (*existing == m)
        return {};
      return make_error(errc::version_exists, to_string(ref_) + " is already published"
                                                + in_pool(pool_) + " with different content");
    }
    if (!sink_)
      return fail(make_error(errc::conflict, to_string(ref_) + " was published" + in_pool(pool_)
                                               + ", then deleted, while it was being stored"));
    auto done = sink_->finish(m, std::move(*layout));
    failed_ = true; // one commit per writer
    return done;
  }

private:
  status usable() const {
    if (failed_)
      return make_error(errc::invalid_argument,
                        "this writer of " + to_string(ref_) + " already failed or committed");
    return {};
  }

  status close_current() {
    if (!open_)
      return {};
    open_ = false;
    if (check_.remaining() != 0)
      return make_error(errc::invalid_format, "a shard of " + to_string(ref_) + " is truncated: "
                                                + std::to_string(check_.remaining())
                                                + " bytes are missing");
    return sink_ ? sink_->close_shard() : status{};
  }

  /// Any failure ends the attempt; its bytes go with the sink.
  status fail(status outcome) {
    failed_ = true;
    sink_.reset();
    return outcome;
  }

  store_base& store_;
  std::string pool_;
  version_ref ref_;
  std::unique_ptr<shard_sink> sink_;
  shard_stream_check check_;
  /// The files added so far (`add_file`).
  std::map<std::string, file_entry> files_;
  bool open_ = false;
  bool failed_ = false;
};

result<std::unique_ptr<version_writer>> store_base::begin_version(std::string_view pool,
                                                                  const version_ref& ref) {
  if (auto ok = check_names(pool, ref); !ok)
    return std::move(ok).error();
  auto published = is_published(pool, ref);
  if (!published)
    return std::move(published).error();
  std::unique_ptr<shard_sink> sink;
  if (!*published) {
    auto opened = open_sink(pool, ref);
    if (!opened)
      return std::move(opened).error();
    sink = std::move(*opened);
  }
  // A published version's bytes are checked but not stored again.
  return std::unique_ptr<version_writer>{
    std::make_unique<writer>(*this, std::string{pool}, ref, std::move(sink))};
}

result<retention_report> store_base::retain(std::string_view pool,
                                            const retention_request& request) {
  if (auto ok = validate_pool(pool); !ok)
    return std::move(ok).error();
  retention_report report;
  {
    // Decide under the lock; deleting (slow) needs none: a deleted version
    // is neither the pointer nor anything a version published later needs.
    std::lock_guard guard{pool_lock(pool)};
    auto pointer = load_pointer(pool);
    if (!pointer)
      return std::move(pointer).error();
    auto runs = claimed_runs(pool);
    if (!runs)
      return std::move(runs).error();
    for (const auto& run : *runs) {
      auto boot = load_boot(pool, run);
      if (!boot)
        return std::move(boot).error();
      if (!*boot)
        continue;
      auto versions = published_versions(pool, run);
      if (!versions)
        return std::move(versions).error();
      std::set<uint64_t> pinned;
      if (pointer->record && pointer->record->latest.run_id == run)
        pinned.insert(pointer->record->latest.version);
      for (const auto& ref : request.in_use)
        if (ref.run_id == run)
          pinned.insert(ref.version);
      if (request.drop_runs.contains(run) && pinned.empty()) {
        // Ascending, as retention's verdicts are: deleted newest first below.
        std::vector<uint64_t> all;
        for (const auto& v : *versions)
          all.push_back(v.version);
        std::sort(all.begin(), all.end());
        for (auto v : all)
          report.deleted.push_back(retention_entry{{run, v}, keep_reason::none, 0});
        continue;
      }
      for (const auto& v : plan_retention(*versions, **boot, request.keep_last, pinned)) {
        retention_entry e{{run, v.version}, v.why, v.needed_by};
        (v.kept() ? report.kept : report.deleted).push_back(std::move(e));
      }
    }
  }
  // Newest first: a collection that dies half way leaves every version still
  // listed with its chain back to its anchor (deltas go before their anchor).
  if (!request.dry_run)
    for (auto it = report.deleted.rbegin(); it != report.deleted.rend(); ++it)
      if (auto ok = delete_version(pool, it->ref); !ok)
        return std::move(ok).error();
  return report;
}

} // namespace stitch::store
