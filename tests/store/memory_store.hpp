#pragma once

// A store backend in memory for tests of the store's users: the shared
// orchestration of every backend (`store::store_base`: pointer rules, version
// writers and their checks, retention) over maps, `read_range` through the
// same layout as the real backends, and the same visibility: a stored version
// is readable only once a pointer move (claim or advance) named it, so a
// publish that never moved the pointer may be redone with other content.
// Plus hooks to corrupt bytes and count calls.

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/store/store_base.hpp"
#include "runtime/store/version_layout.hpp"

namespace stitch::testing {

class memory_store final : public store::store_base {
public:
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

  /// Deletes `ref` (as retention does) the next time a layout is loaded,
  /// after the load: a collection racing a read.
  void delete_after_next_layout_load(std::string pool, version_ref ref) {
    std::lock_guard guard{mutex_};
    delete_after_load_ = std::pair{std::move(pool), std::move(ref)};
  }

  /// The next pointer move fails (a backend error) without moving.
  void fail_next_move() { fail_next_move_ = true; }

  /// A slow backend: each pointer load takes up to `load` (at random) after
  /// it read the pointer, so what it returns may be stale by then; each
  /// pointer move, visible at once, takes `move` before it returns.
  void delay_pointers(std::chrono::microseconds load, std::chrono::microseconds move) {
    pointer_load_delay_ = load;
    pointer_move_delay_ = move;
  }

  /// Where `on_pointer` calls its hook.
  enum class pointer_step { loaded, move_landing, move_landed };
  /// Calls `hook` in a pointer load after it read the pointer, and in a
  /// pointer move just before and just after it lands (no lock held).
  void on_pointer(std::function<void(pointer_step)> hook) {
    std::lock_guard guard{mutex_};
    pointer_hook_ = std::move(hook);
  }

  /// Pointer loads so far.
  size_t pointer_loads() const { return pointer_loads_; }

  /// Port calls so far (test hooks excluded).
  size_t calls() const { return calls_; }
  size_t range_reads() const { return range_reads_; }

protected:
  /// Its pointers live in this object: nothing else moves them.
  bool sole_pointer_writer() const override { return true; }

  result<pointer_snapshot> load_pointer(std::string_view pool) override {
    ++calls_;
    ++pointer_loads_;
    pointer_snapshot out;
    {
      std::lock_guard guard{mutex_};
      auto it = pointers_.find(std::string{pool});
      if (it != pointers_.end())
        out.record = it->second;
    }
    call_hook(pointer_step::loaded);
    if (auto d = pointer_load_delay_.load(); d.count() > 0) {
      thread_local std::minstd_rand random{std::random_device{}()};
      std::this_thread::sleep_for(std::chrono::microseconds{random() % d.count()});
    }
    return out;
  }

  result<std::optional<uint64_t>> load_boot(std::string_view pool, std::string_view run) override {
    ++calls_;
    std::lock_guard guard{mutex_};
    auto it = boots_.find({std::string{pool}, std::string{run}});
    if (it == boots_.end())
      return std::optional<uint64_t>{};
    return std::optional<uint64_t>{it->second};
  }

  result<manifest> load_manifest(std::string_view pool, const version_ref& ref) override {
    ++calls_;
    std::lock_guard guard{mutex_};
    auto* v = find(pool, ref);
    if (!v)
      return missing(ref);
    return v->m;
  }

  result<bool> is_published(std::string_view pool, const version_ref& ref) override {
    ++calls_;
    std::lock_guard guard{mutex_};
    return find_done(pool, ref) != nullptr;
  }

  result<store::version_layout> load_layout(std::string_view pool,
                                            const version_ref& ref) override {
    ++calls_;
    std::optional<std::pair<std::string, version_ref>> doomed;
    store::version_layout layout;
    {
      std::lock_guard guard{mutex_};
      auto* v = find(pool, ref);
      if (!v)
        return missing(ref);
      layout = v->layout;
      doomed = std::exchange(delete_after_load_, std::nullopt);
    }
    if (doomed)
      (void) delete_version(doomed->first, doomed->second);
    return layout;
  }

  status read_shard(std::string_view pool, const version_ref& ref, const store::version_layout&,
                    const store::tensor_location& loc, uint64_t offset,
                    std::span<std::byte> out) override {
    ++calls_;
    ++range_reads_;
    std::lock_guard guard{mutex_};
    // Deleted since the layout was cached: as a backend whose bytes are gone.
    auto* v = find_done(pool, ref);
    if (!v)
      return missing(ref);
    if (loc.shard >= v->shards.size() || loc.offset + offset > v->shards[loc.shard].size()
        || out.size() > v->shards[loc.shard].size() - loc.offset - offset)
      return make_error(errc::corrupt_data, "a stale layout of " + to_string(ref));
    std::memcpy(out.data(), v->shards[loc.shard].data() + loc.offset + offset, out.size());
    return {};
  }

  status commit_move(std::string_view pool, const pointer_snapshot&,
                     const store::pointer_commit& move) override {
    ++calls_;
    if (fail_next_move_.exchange(false))
      return make_error(errc::backend_failure, "the test failed this pointer move");
    call_hook(pointer_step::move_landing);
    {
      std::lock_guard guard{mutex_};
      auto* target = find(pool, move.target);
      if (!target)
        return missing(move.target);
      target->done = true;
      pointers_[std::string{pool}] = move.next;
      if (move.new_run)
        boots_[{std::string{pool}, move.target.run_id}] = move.next.boot_version;
    }
    call_hook(pointer_step::move_landed);
    if (auto d = pointer_move_delay_.load(); d.count() > 0)
      std::this_thread::sleep_for(d);
    return {};
  }

  result<std::unique_ptr<store::shard_sink>> open_sink(std::string_view pool,
                                                       const version_ref& ref) override {
    ++calls_;
    return std::unique_ptr<store::shard_sink>{
      std::make_unique<sink>(*this, std::string{pool}, ref)};
  }

  result<std::vector<std::string>> claimed_runs(std::string_view pool) override {
    ++calls_;
    std::lock_guard guard{mutex_};
    std::vector<std::string> runs;
    for (const auto& [k, boot] : boots_)
      if (k.first == pool)
        runs.push_back(k.second);
    return runs;
  }

  result<std::vector<std::string>> pools() override {
    ++calls_;
    std::lock_guard guard{mutex_};
    std::vector<std::string> out;
    for (const auto& [pool, p] : pointers_)
      out.push_back(pool);
    return out;
  }

  result<std::vector<stitch::stored_version>> published_versions(std::string_view pool,
                                                                 std::string_view run) override {
    ++calls_;
    std::lock_guard guard{mutex_};
    std::vector<stitch::stored_version> out;
    for (const auto& [k, v] : versions_)
      if (std::get<0>(k) == pool && std::get<1>(k) == run && v.done)
        out.push_back({std::get<2>(k), v.m.is_full()});
    return out;
  }

  status delete_version(std::string_view pool, const version_ref& ref) override {
    ++calls_;
    {
      std::lock_guard guard{mutex_};
      versions_.erase(key(pool, ref));
    }
    // As the real backends: forgotten once unreadable.
    forget_layout(pool, ref);
    return {};
  }

private:
  struct stored {
    manifest m;
    store::version_layout layout;
    std::vector<std::vector<std::byte>> shards;
    /// Named by a pointer move: visible to readers.
    bool done = false;
  };
  using version_key = std::tuple<std::string, std::string, uint64_t>;

  /// Shards in memory; recorded only by `finish`.
  class sink final : public store::shard_sink {
  public:
    sink(memory_store& store, std::string pool, version_ref ref)
        : store_(store), pool_(std::move(pool)), ref_(std::move(ref)) {}
    status open_shard(std::string_view, uint64_t size) override {
      shards_.emplace_back();
      shards_.back().reserve(size);
      return {};
    }
    status append(std::span<const std::byte> bytes) override {
      shards_.back().insert(shards_.back().end(), bytes.begin(), bytes.end());
      return {};
    }
    status close_shard() override { return {}; }
    status finish(const manifest& m, store::version_layout layout) override {
      std::lock_guard guard{store_.mutex_};
      store_.versions_[key(pool_, ref_)] = stored{m, std::move(layout), std::move(shards_), false};
      return {};
    }

  private:
    memory_store& store_;
    std::string pool_;
    version_ref ref_;
    std::vector<std::vector<std::byte>> shards_;
  };

  static version_key key(std::string_view pool, const version_ref& ref) {
    return {std::string{pool}, ref.run_id, ref.version};
  }

  static stitch::error missing(const version_ref& ref) {
    return make_error(errc::not_found, to_string(ref) + " is not stored");
  }

  stored* find(std::string_view pool, const version_ref& ref) {
    auto it = versions_.find(key(pool, ref));
    return it == versions_.end() ? nullptr : &it->second;
  }

  void call_hook(pointer_step step) {
    std::function<void(pointer_step)> hook;
    {
      std::lock_guard guard{mutex_};
      hook = pointer_hook_;
    }
    if (hook)
      hook(step);
  }

  stored* find_done(std::string_view pool, const version_ref& ref) {
    auto* v = find(pool, ref);
    return v && v->done ? v : nullptr;
  }

  std::mutex mutex_;
  std::map<version_key, stored> versions_;
  std::map<std::string, pointer_record> pointers_;
  std::map<std::pair<std::string, std::string>, uint64_t> boots_;
  std::atomic<size_t> calls_{0};
  std::atomic<size_t> range_reads_{0};
  std::atomic<size_t> pointer_loads_{0};
  std::atomic<bool> fail_next_move_{false};
  std::atomic<std::chrono::microseconds> pointer_load_delay_{std::chrono::microseconds{0}};
  std::atomic<std::chrono::microseconds> pointer_move_delay_{std::chrono::microseconds{0}};
  std::optional<std::pair<std::string, version_ref>> delete_after_load_;
  std::function<void(pointer_step)> pointer_hook_;
};

} // namespace stitch::testing
