#pragma once

// The deterministic workload of the store crash test: version v's weights are a
// pure function of v, so a checker can rebuild what any version must hold.

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <set>
#include <string>

#include "runtime/core/checksum.hpp"
#include "runtime/store/rocksdb_store.hpp"
#include "store_fixtures.hpp"

namespace stitch::testing {

inline constexpr const char* crash_run = "crash";
inline constexpr const char* crash_pool = "default";
/// Every fifth version is a full anchor.
inline constexpr uint64_t crash_anchor_every = 5;

inline weights crash_weights(uint64_t v) {
  weights w{{"embed", random_bytes(48 * 1024, 11)},
            {"layer.0", random_bytes(160 * 1024, 12)},
            {"head", random_bytes(8 * 1024, 13)}};
  // Each version flips a few bytes, cumulatively.
  for (uint64_t i = 1; i <= v; ++i) {
    auto& t = w[i % 3 == 0 ? "embed" : (i % 3 == 1 ? "layer.0" : "head")];
    t[(i * 7919) % t.size()] ^= static_cast<std::byte>(i & 0xff ? i & 0xff : 1);
  }
  return w;
}

inline built_version crash_version(uint64_t v) {
  if (v % crash_anchor_every == 0)
    return full_version(crash_run, v, crash_weights(v));
  return delta_version(crash_run, v, crash_weights(v - 1), crash_weights(v));
}

/// Rebuilds version `v` from its nearest anchor through the store.
inline result<weights> rebuild(store_backend& db, uint64_t v) {
  uint64_t anchor = v - v % crash_anchor_every;
  auto m = db.read_manifest(crash_pool, {crash_run, anchor});
  if (!m)
    return std::move(m).error();
  weights w;
  for (const auto& [name, bytes] : crash_weights(0)) {
    auto got = read_tensor(db, crash_pool, {crash_run, anchor}, name, bytes.size());
    if (!got)
      return std::move(got).error();
    w[name] = std::move(*got);
  }
  for (uint64_t d = anchor + 1; d <= v; ++d) {
    auto dm = db.read_manifest(crash_pool, {crash_run, d});
    if (!dm)
      return std::move(dm).error();
    for (const auto& name : dm->touched) {
      auto x = read_tensor(db, crash_pool, {crash_run, d}, name, w[name].size());
      if (!x)
        return std::move(x).error();
      if (auto ok = delta::xor_apply(w[name], *x); !ok)
        return std::move(ok).error();
    }
  }
  return w;
}

/// Reopens the store after a crash: none of the acknowledged versions may be
/// lost. Answers the pointer's version (none when nothing was published).
inline void reopen_after_crash(const std::string& path, const std::set<uint64_t>& acked,
                               std::unique_ptr<store_backend>& db,
                               std::optional<uint64_t>& latest) {
  auto opened = store::open_rocksdb_store(path);
  ASSERT_TRUE(opened) << to_string(opened.error());
  db = std::move(*opened);
  auto pointer = db->read_pointer(crash_pool);
  ASSERT_TRUE(pointer) << to_string(pointer.error());
  if (acked.empty() && !pointer->has_value())
    return;
  ASSERT_TRUE(pointer->has_value()) << "acknowledged versions but no pointer";
  latest = (*pointer)->latest.version;
  if (!acked.empty()) {
    ASSERT_GE(*latest, *acked.rbegin()) << "an acknowledged version was lost";
  }
}

/// The invariants after a crash.
inline void check_store(const std::string& path, const std::set<uint64_t>& acked) {
  std::unique_ptr<store_backend> opened;
  std::optional<uint64_t> pointed;
  reopen_after_crash(path, acked, opened, pointed);
  if (::testing::Test::HasFatalFailure() || !pointed)
    return;
  auto& db = *opened;
  const uint64_t latest = *pointed;
  // Every visible version is complete: contiguous from the boot to the pointer.
  auto listed = db.list_versions(crash_pool, crash_run);
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->size(), latest + 1);
  for (uint64_t v = 0; v <= latest; ++v) {
    ASSERT_EQ((*listed)[v].version, v);
  }
  // The pointer's version rebuilds exactly, and its checksums verify.
  auto w = rebuild(db, latest);
  ASSERT_TRUE(w) << to_string(w.error());
  auto m = db.read_manifest(crash_pool, {crash_run, latest});
  ASSERT_TRUE(m);
  for (const auto& [name, bytes] : *w) {
    ASSERT_EQ(checksum::tree_checksum(bytes), m->checksums.at(name)) << name << " @" << latest;
  }
  ASSERT_EQ(*w, crash_weights(latest));
}

/// The invariants after a crash of a publisher that collects, keeping the
/// newest `keep`: the acknowledged versions' newest `keep` (up to the
/// pointer), the boot and every anchor their chains need are listed; every
/// listed version rebuilds exactly (nothing half deleted is visible).
inline void check_collected_store(const std::string& path, const std::set<uint64_t>& acked,
                                  size_t keep) {
  std::unique_ptr<store_backend> opened;
  std::optional<uint64_t> pointed;
  reopen_after_crash(path, acked, opened, pointed);
  if (::testing::Test::HasFatalFailure() || !pointed)
    return;
  auto& db = *opened;
  const uint64_t latest = *pointed;
  auto listed = db.list_versions(crash_pool, crash_run);
  ASSERT_TRUE(listed) << to_string(listed.error());
  std::set<uint64_t> present;
  for (const auto& r : *listed)
    present.insert(r.version);
  // What a finished collection keeps can never be missing.
  std::set<uint64_t> must{0};
  for (uint64_t v = latest + 1 > keep ? latest + 1 - keep : 0; v <= latest; ++v)
    for (uint64_t c = v - v % crash_anchor_every; c <= v; ++c)
      must.insert(c);
  for (auto v : must)
    ASSERT_TRUE(present.contains(v))
      << "retained version " << v << " is gone (pointer " << latest << ")";
  for (auto v : present) {
    auto w = rebuild(db, v);
    ASSERT_TRUE(w) << "listed version " << v << ": " << to_string(w.error());
    ASSERT_EQ(*w, crash_weights(v)) << "version " << v;
    auto m = db.read_manifest(crash_pool, {crash_run, v});
    ASSERT_TRUE(m);
    for (const auto& [name, bytes] : *w)
      ASSERT_EQ(checksum::tree_checksum(bytes), m->checksums.at(name)) << name << " @" << v;
  }
}

} // namespace stitch::testing
