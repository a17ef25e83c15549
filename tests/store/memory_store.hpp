#pragma once

// A store backend in memory for tests of the store's users: the same pointer
// rules (`decide_pointer_move`, `decide_claim`, `check_compare_and_swap`),
// the same ingest checks (`ingest_version`) and `read_range` through the same
// layout as the real backends, and the same visibility: a stored version is
// readable only once a pointer move (claim or advance) named it, so a publish
// that never moved the pointer may be redone with other content. Plus hooks
// to corrupt bytes and count calls.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/core/pointer_rules.hpp"
#include "runtime/core/retention.hpp"
#include "runtime/core/store_port.hpp"
#include "runtime/store/version_layout.hpp"

namespace stitch::testing {

class memory_store final : public store_backend {
public:
  result<std::optional<pointer_record>> read_pointer(std::string_view pool) override {
    ++calls_;
    if (auto ok = store::validate_pool(pool); !ok)
      return std::move(ok).error();
    std::lock_guard guard{mutex_};
    auto it = pointers_.find(std::string{pool});
    if (it == pointers_.end())
      return std::optional<pointer_record>{};
    return std::optional<pointer_record>{it->second};
  }

  result<pointer_record> claim(std::string_view pool, const version_ref& boot) override {
    ++calls_;
    if (auto ok = store::validate_pool(pool); !ok)
      return std::move(ok).error();
    std::lock_guard guard{mutex_};
    auto stored = find(pool, boot);
    if (!stored)
      return missing(boot);
    auto decision = decide_claim(current(pool), boot, stored->m.is_full(), known_boot(pool, boot));
    if (!decision)
      return std::move(decision).error();
    commit(pool, *decision, *stored);
    return decision->next;
  }

  result<pointer_record> compare_and_advance_pointer(std::string_view pool,
                                                     const std::optional<version_ref>& expected,
                                                     const version_ref& proposed) override {
    ++calls_;
    if (auto ok = store::validate_pool(pool); !ok)
      return std::move(ok).error();
    std::lock_guard guard{mutex_};
    auto now = current(pool);
    std::optional<version_ref> actual;
    if (now)
      actual = now->latest;
    if (auto ok = check_compare_and_swap(expected, actual, proposed); !ok)
      return std::move(ok).error();
    auto stored = find(pool, proposed);
    if (!stored)
      return missing(proposed);
    if (!stored->m.is_full() && !find_done(pool, {proposed.run_id, proposed.version - 1}))
      return make_error(errc::missing_link, "cannot publish " + to_string(proposed)
                                              + ": its base version is not stored");
    pointer_proposal proposal{proposed, stored->m.is_full(), known_boot(pool, proposed),
                              actual == proposed ? std::optional<bool>{true} : std::nullopt};
    auto decision = decide_pointer_move(now, proposal);
    if (!decision)
      return std::move(decision).error();
    commit(pool, *decision, *stored);
    return decision->next;
  }

  status put_version(std::string_view pool, const manifest& m,
                     std::span<const shard_upload> shards) override {
    ++calls_;
    if (auto ok = store::validate_pool(pool); !ok)
      return ok;
    if (auto ok = validate(m); !ok)
      return ok;
    std::lock_guard guard{mutex_};
    if (auto* existing = find(pool, m.ref)) {
      if (existing->m == m)
        return {};
      if (existing->done)
        return make_error(errc::version_exists,
                          to_string(m.ref) + " is already stored with different content");
    }
    stored_version v{m, {}, {}, false};
    auto layout = store::ingest_version(
      m, shards, [&](uint32_t shard, uint64_t offset, std::span<const std::byte> bytes) -> status {
        if (v.shards.size() <= shard)
          v.shards.resize(shard + 1);
        auto& dst = v.shards[shard];
        if (dst.size() != offset)
          return make_error(errc::backend_failure, "pieces arrived out of order");
        dst.insert(dst.end(), bytes.begin(), bytes.end());
        return {};
      });
    if (!layout)
      return std::move(layout).error();
    v.layout = std::move(*layout);
    v.shards.resize(v.layout.shards.size());
    versions_[key(pool, m.ref)] = std::move(v);
    return {};
  }

  result<manifest> read_manifest(std::string_view pool, const version_ref& ref) override {
    ++calls_;
    if (auto ok = store::validate_pool(pool); !ok)
      return std::move(ok).error();
    std::lock_guard guard{mutex_};
    auto* v = find_done(pool, ref);
    if (!v)
      return missing(ref);
    return v->m;
  }

  status read_range(std::string_view pool, const version_ref& ref, std::string_view tensor,
                    uint64_t offset, std::span<std::byte> out) override {
    ++calls_;
    ++range_reads_;
    if (auto ok = store::validate_pool(pool); !ok)
      return ok;
    std::lock_guard guard{mutex_};
    auto* v = find_done(pool, ref);
    if (!v)
      return missing(ref);
    auto it = v->layout.tensors.find(std::string{tensor});
    if (it == v->layout.tensors.end())
      return make_error(errc::not_found,
                        "tensor '" + std::string{tensor} + "' is not stored in " + to_string(ref));
    const auto& loc = it->second;
    if (offset > loc.size || out.size() > loc.size - offset)
      return make_error(errc::invalid_argument, "range [" + std::to_string(offset) + ", +"
                                                  + std::to_string(out.size())
                                                  + ") is outside tensor '" + std::string{tensor}
                                                  + "' of " + std::to_string(loc.size) + " bytes");
    if (!out.empty())
      std::memcpy(out.data(), v->shards[loc.shard].data() + loc.offset + offset, out.size());
    return {};
  }

  result<std::vector<version_ref>> list_versions(std::string_view pool,
                                                 std::string_view run_id) override {
    ++calls_;
    if (auto ok = store::validate_pool(pool); !ok)
      return std::move(ok).error();
    std::lock_guard guard{mutex_};
    std::vector<version_ref> out;
    for (const auto& [k, v] : versions_)
      if (std::get<0>(k) == pool && std::get<1>(k) == run_id && v.done)
        out.push_back({std::get<1>(k), std::get<2>(k)});
    return out;
  }

  result<retention_report> retain(std::string_view pool, size_t keep_last) override {
    ++calls_;
    if (auto ok = store::validate_pool(pool); !ok)
      return std::move(ok).error();
    std::lock_guard guard{mutex_};
    retention_report report;
    auto now = current(pool);
    for (const auto& [run_key, boot] : boots_) {
      if (run_key.first != pool)
        continue;
      std::vector<stitch::stored_version> list;
      for (const auto& [k, v] : versions_)
        if (std::get<0>(k) == pool && std::get<1>(k) == run_key.second && v.done)
          list.push_back({std::get<2>(k), v.m.is_full()});
      std::set<uint64_t> pinned;
      if (now && now->latest.run_id == run_key.second)
        pinned.insert(now->latest.version);
      auto doomed = select_deletions(list, boot, keep_last, pinned);
      for (const auto& sv : list) {
        version_ref ref{run_key.second, sv.version};
        if (doomed.contains(sv.version)) {
          versions_.erase(key(pool, ref));
          report.deleted.push_back(ref);
        } else {
          report.kept.push_back(ref);
        }
      }
    }
    return report;
  }

  /// Flips the bits of one stored byte of `tensor` at `offset`; false when
  /// there is no such byte.
  bool corrupt(std::string_view pool, const version_ref& ref, std::string_view tensor,
               uint64_t offset) {
    std::lock_guard guard{mutex_};
    auto* v = find(pool, ref);
    if (!v)
      return false;
    auto it = v->layout.tensors.find(std::string{tensor});
    if (it == v->layout.tensors.end() || offset >= it->second.size)
      return false;
    auto& byte = v->shards[it->second.shard][it->second.offset + offset];
    byte = ~byte;
    return true;
  }

  /// Forgets a stored version (a hole in a chain).
  bool erase(std::string_view pool, const version_ref& ref) {
    std::lock_guard guard{mutex_};
    return versions_.erase(key(pool, ref)) > 0;
  }

  /// The stored bytes of one shard of a version.
  std::vector<std::byte> shard_bytes(std::string_view pool, const version_ref& ref, size_t index) {
    std::lock_guard guard{mutex_};
    auto* v = find(pool, ref);
    return v && index < v->shards.size() ? v->shards[index] : std::vector<std::byte>{};
  }

  /// Port calls so far (test hooks excluded).
  size_t calls() const { return calls_; }
  size_t range_reads() const { return range_reads_; }

private:
  struct stored_version {
    manifest m;
    store::version_layout layout;
    std::vector<std::vector<std::byte>> shards;
    /// Named by a pointer move: visible to readers.
    bool done = false;
  };
  using version_key = std::tuple<std::string, std::string, uint64_t>;

  static version_key key(std::string_view pool, const version_ref& ref) {
    return {std::string{pool}, ref.run_id, ref.version};
  }

  static stitch::error missing(const version_ref& ref) {
    return make_error(errc::not_found, to_string(ref) + " is not stored");
  }

  stored_version* find(std::string_view pool, const version_ref& ref) {
    auto it = versions_.find(key(pool, ref));
    return it == versions_.end() ? nullptr : &it->second;
  }

  stored_version* find_done(std::string_view pool, const version_ref& ref) {
    auto* v = find(pool, ref);
    return v && v->done ? v : nullptr;
  }

  std::optional<pointer_record> current(std::string_view pool) const {
    auto it = pointers_.find(std::string{pool});
    if (it == pointers_.end())
      return std::nullopt;
    return it->second;
  }

  std::optional<uint64_t> known_boot(std::string_view pool, const version_ref& ref) const {
    auto it = boots_.find({std::string{pool}, ref.run_id});
    if (it == boots_.end())
      return std::nullopt;
    return it->second;
  }

  void commit(std::string_view pool, const pointer_decision& decision, stored_version& target) {
    target.done = true;
    pointers_[std::string{pool}] = decision.next;
    boots_.emplace(std::make_pair(std::string{pool}, decision.next.latest.run_id),
                   decision.next.boot_version);
  }

  std::mutex mutex_;
  std::map<version_key, stored_version> versions_;
  std::map<std::string, pointer_record> pointers_;
  std::map<std::pair<std::string, std::string>, uint64_t> boots_;
  std::atomic<size_t> calls_{0};
  std::atomic<size_t> range_reads_{0};
};

} // namespace stitch::testing
