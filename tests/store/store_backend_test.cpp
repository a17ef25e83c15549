// The store backend conformance suite: every backend passes the same tests.

#include <gtest/gtest.h>

#include <rocksdb/db.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include <caf/actor_system.hpp>
#include <caf/spawn_options.hpp>

#include "actors/store.hpp"
#include "actors/store_client.hpp"
#include "actors/workers.hpp"
#include "memory_store.hpp"
#include "node/system_config.hpp"
#include "runtime/store/rocksdb_store.hpp"
#include "runtime/store/s3_store.hpp"
#include "runtime/store/version_layout.hpp"
#include "store_fixtures.hpp"

namespace stitch {
namespace {

using namespace stitch::testing;

/// Makes a fresh, empty backend rooted in a scratch directory.
struct backend_factory {
  std::string name;
  std::function<result<std::unique_ptr<store_backend>>(const std::filesystem::path&)> open;
};

/// RocksDB behind a store actor, reached through `remote_store`: the whole
/// actor path (chunked reads, spooled uploads, error mapping) under the suite.
class actor_backed_store final : public store_backend {
public:
  explicit actor_backed_store(std::unique_ptr<store_backend> db, std::filesystem::path spool)
      : sys_(cfg_) {
    std::shared_ptr<store_backend> shared{std::move(db)};
    (void) spool;
    hosted_ = shared;
    actor_ = sys_.spawn(store_service, shared, store_lanes::make(), store_options{});
    client_ = std::make_unique<remote_store>(sys_, actor_);
  }
  ~actor_backed_store() override {
    client_.reset();
    caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
  }
  // Moves made through the actor are the hosted backend's own moves.
  uint64_t observe_pointers(pointer_observer observer) override {
    return hosted_->observe_pointers(std::move(observer));
  }
  void unobserve_pointers(uint64_t id) override { hosted_->unobserve_pointers(id); }
  result<std::optional<pointer_record>> read_pointer(std::string_view pool) override {
    return client_->read_pointer(pool);
  }
  result<pointer_record> claim(std::string_view pool, const version_ref& boot) override {
    return client_->claim(pool, boot);
  }
  result<pointer_record> compare_and_advance_pointer(std::string_view pool,
                                                     const std::optional<version_ref>& expected,
                                                     const version_ref& proposed) override {
    return client_->compare_and_advance_pointer(pool, expected, proposed);
  }
  result<std::unique_ptr<version_writer>> begin_version(std::string_view pool,
                                                        const version_ref& ref) override {
    return client_->begin_version(pool, ref);
  }
  result<manifest> read_manifest(std::string_view pool, const version_ref& ref) override {
    return client_->read_manifest(pool, ref);
  }
  status read_range(std::string_view pool, const version_ref& ref, std::string_view tensor,
                    uint64_t offset, std::span<std::byte> out) override {
    return client_->read_range(pool, ref, tensor, offset, out);
  }
  result<std::vector<version_ref>> list_versions(std::string_view pool,
                                                 std::string_view run_id) override {
    return client_->list_versions(pool, run_id);
  }
  result<std::vector<std::string>> list_pools() override { return client_->list_pools(); }
  result<retention_report> retain(std::string_view pool,
                                  const retention_request& request) override {
    return client_->retain(pool, request);
  }

private:
  system_config cfg_;
  caf::actor_system sys_;
  store_actor actor_;
  std::unique_ptr<remote_store> client_;
  std::shared_ptr<store_backend> hosted_;
};

std::vector<backend_factory> backends() {
  std::vector<backend_factory> out;
  out.push_back({"rocksdb", [](const std::filesystem::path& dir) {
                   return store::open_rocksdb_store((dir / "db").string());
                 }});
  out.push_back(
    {"store_actor", [](const std::filesystem::path& dir) -> result<std::unique_ptr<store_backend>> {
       auto db = store::open_rocksdb_store((dir / "db").string());
       if (!db)
         return std::move(db).error();
       return std::unique_ptr<store_backend>{
         std::make_unique<actor_backed_store>(std::move(*db), dir / "spool")};
     }});
  // A real S3-protocol server (scripts/s3-test-server.sh), one prefix per test.
  out.push_back(
    {"s3", [](const std::filesystem::path& dir) -> result<std::unique_ptr<store_backend>> {
       const char* endpoint = std::getenv("STITCH_S3_ENDPOINT");
       if (!endpoint || !*endpoint)
         return make_error(errc::engine_unavailable, "STITCH_S3_ENDPOINT is not set");
       transport::s3_config config;
       config.endpoint = endpoint;
       config.region = "us-east-1";
       config.credentials = {"S3RVER", "S3RVER", ""};
       auto client = transport::s3_client::open(config);
       if (!client)
         return std::move(client).error();
       if (auto made = (*client)->create_bucket("stitch-suite"); !made)
         return std::move(made).error();
       return store::open_s3_store("s3://stitch-suite/" + dir.filename().string(),
                                   store::s3_options{config});
     }});
  return out;
}

/// Files under `dir` that are deleted but still open in this process.
std::vector<std::string> deleted_files_held_open(const std::filesystem::path& dir) {
  std::vector<std::string> held;
  const auto prefix = std::filesystem::weakly_canonical(dir).string() + "/";
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator{"/proc/self/fd", ec}) {
    auto target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (!ec && target.starts_with(prefix) && target.ends_with(" (deleted)"))
      held.push_back(target);
  }
  return held;
}

class store_backend_test : public ::testing::TestWithParam<backend_factory> {
protected:
  void SetUp() override {
    auto opened = GetParam().open(dir.path());
    if (!opened && opened.error().code == errc::engine_unavailable)
      GTEST_SKIP() << GetParam().name << ": " << opened.error().message
                   << " (export STITCH_S3_ENDPOINT=$(scripts/s3-test-server.sh start))";
    ASSERT_TRUE(opened) << to_string(opened.error());
    store = std::move(*opened);
  }

  weights base_weights() {
    return {{"a", random_bytes(1000, 1)}, {"b", random_bytes(5000, 2)}, {"c", random_bytes(64, 3)}};
  }

  /// Publishes a full anchor at `v` and claims `run` with it.
  void publish_anchor(const std::string& run, uint64_t v, const weights& w) {
    auto version = full_version(run, v, w);
    ASSERT_TRUE(put(*store, pool, version));
    auto claimed = store->claim(pool, version.m.ref);
    ASSERT_TRUE(claimed) << to_string(claimed.error());
  }

  /// Publishes the delta `before -> after` at `v` on top of the pointer.
  status publish_delta(const std::string& run, uint64_t v, const weights& before,
                       const weights& after) {
    auto version = delta_version(run, v, before, after);
    if (auto ok = put(*store, pool, version); !ok)
      return ok;
    auto current = store->read_pointer(pool);
    if (!current)
      return std::move(current).error();
    std::optional<version_ref> expected;
    if (*current)
      expected = (*current)->latest;
    auto moved = store->compare_and_advance_pointer(pool, expected, version.m.ref);
    if (!moved)
      return std::move(moved).error();
    return {};
  }

  temp_dir dir;
  std::unique_ptr<store_backend> store;
  const std::string pool = "default";
};

TEST_P(store_backend_test, empty_store_has_no_pointer_and_no_versions) {
  auto p = store->read_pointer(pool);
  ASSERT_TRUE(p);
  EXPECT_FALSE(p->has_value());
  auto m = store->read_manifest(pool, {"r", 0});
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code, errc::not_found);
  auto listed = store->list_versions(pool, "r");
  ASSERT_TRUE(listed);
  EXPECT_TRUE(listed->empty());
}

TEST_P(store_backend_test, anchor_round_trips_bytes_across_shards_and_pieces) {
  weights w{{"big", random_bytes(store::piece_size * 2 + 12345, 7)},
            {"small", random_bytes(17, 8)},
            {"empty", {}},
            {"model.layers.0.mlp.up_proj.weight", random_bytes(4096, 9)}};
  auto version = full_version("r", 0, w, 2);
  auto stored = put(*store, pool, version);
  ASSERT_TRUE(stored) << to_string(stored.error());
  ASSERT_TRUE(store->claim(pool, version.m.ref));
  auto m = store->read_manifest(pool, {"r", 0});
  ASSERT_TRUE(m) << to_string(m.error());
  EXPECT_EQ(*m, version.m);
  for (const auto& [name, bytes] : w) {
    auto got = read_tensor(*store, pool, {"r", 0}, name, bytes.size());
    ASSERT_TRUE(got) << name << ": " << to_string(got.error());
    EXPECT_EQ(*got, bytes) << name;
  }
  // A range straddling a piece boundary.
  std::vector<std::byte> part(1000);
  ASSERT_TRUE(store->read_range(pool, {"r", 0}, "big", store::piece_size - 500, part));
  EXPECT_TRUE(std::equal(part.begin(), part.end(), w["big"].begin() + store::piece_size - 500));
}

// Shard bytes handed over in pieces of any size read back as written (a
// direct-I/O shard file gathers them in its 8 MiB buffer: here an odd piece,
// a run that fills the buffer exactly, a piece larger than it, a tail).
TEST_P(store_backend_test, shard_pieces_of_any_size_round_trip) {
  weights w{{"big", random_bytes((size_t{20} << 20) + 777, 21)}};
  auto version = full_version("r", 0, w);
  const auto& [name, shard] = version.shards.front();
  const size_t mib = size_t{1} << 20;
  const std::vector<size_t> cuts = {1000, 8 * mib, 17 * mib + 5, shard.size()};
  auto writer = store->begin_version(pool, version.m.ref);
  ASSERT_TRUE(writer) << to_string(writer.error());
  ASSERT_TRUE((*writer)->begin_shard(name, shard.size()));
  size_t at = 0;
  for (size_t cut : cuts) {
    auto ok = (*writer)->write(std::span{shard}.subspan(at, cut - at));
    ASSERT_TRUE(ok) << to_string(ok.error());
    at = cut;
  }
  auto committed = (*writer)->commit(version.m);
  ASSERT_TRUE(committed) << to_string(committed.error());
  ASSERT_TRUE(store->claim(pool, version.m.ref));
  auto got = read_tensor(*store, pool, {"r", 0}, "big", w["big"].size());
  ASSERT_TRUE(got) << to_string(got.error());
  EXPECT_TRUE(*got == w["big"]);
}

// A shard of 128 MiB or more is flushed to the device while it is written
// (its final sync then waits for the last 64 MiB at most), and reads back as
// written.
// A store whose lanes hold one job each answers most of a burst `busy`
// (nothing of those requests ran); `remote_store` asks again, paced, so
// every read completes with the right bytes. (Without that, a chunked read
// with eight chunks in flight failed on the third.)
TEST(remote_store, a_busy_store_is_asked_again_until_it_answers) {
  temp_dir dir;
  auto db = store::open_rocksdb_store((dir.path() / "db").string());
  ASSERT_TRUE(db) << to_string(db.error());
  std::shared_ptr<store_backend> backend{std::move(*db)};
  const weights w{{"w", random_bytes(size_t{20} << 20, 3)}};
  auto version = full_version("r", 0, w);
  ASSERT_TRUE(put(*backend, "p", version));
  ASSERT_TRUE(backend->claim("p", version.m.ref));
  system_config cfg;
  caf::actor_system sys{cfg};
  auto narrow = [](const char* name) { return std::make_shared<worker_pool>(1, name, 1); };
  auto actor =
    sys.spawn(store_service, backend, store_lanes{narrow("fast"), narrow("bulk"), narrow("reads")},
              store_options{});
  remote_store client{sys, actor};
  std::atomic<int> failures{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t)
    readers.emplace_back([&] {
      for (int i = 0; i < 3; ++i) {
        auto got = read_tensor(client, "p", {"r", 0}, "w", w.at("w").size());
        if (!got || *got != w.at("w")) {
          ADD_FAILURE() << (got ? "wrong bytes" : to_string(got.error()));
          ++failures;
        }
        for (int k = 0; k < 20; ++k) {
          auto p = client.read_pointer("p");
          if (!p || !*p || (*p)->latest != version_ref{"r", 0}) {
            ADD_FAILURE() << (p ? "wrong pointer" : to_string(p.error()));
            ++failures;
          }
        }
      }
    });
  for (auto& r : readers)
    r.join();
  EXPECT_EQ(failures.load(), 0);
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
}

TEST(rocksdb_store, a_large_shard_is_flushed_while_it_is_written) {
  temp_dir dir;
  auto opened = store::open_rocksdb_store((dir.path() / "db").string());
  ASSERT_TRUE(opened) << to_string(opened.error());
  auto& db = **opened;
  std::vector<std::byte> bytes((size_t{130} << 20) + 12);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(bytes.data() + i, &x, 8);
  }
  weights w{{"huge", std::move(bytes)}};
  auto version = full_version("r", 0, w);
  const uint64_t before = store::background_shard_flushes();
  ASSERT_TRUE(put(db, "default", version));
  EXPECT_GE(store::background_shard_flushes() - before, 1u);
  ASSERT_TRUE(db.claim("default", version.m.ref));
  auto got = read_tensor(db, "default", {"r", 0}, "huge", w["huge"].size());
  ASSERT_TRUE(got) << to_string(got.error());
  EXPECT_TRUE(*got == w["huge"]);
}

/// `v` with `files` kept alongside (manifest entries and bytes).
built_version with_files(built_version v, std::map<std::string, std::string> files) {
  for (const auto& [name, bytes] : files)
    v.m.files[name] = {bytes.size(), checksum::tree_checksum(std::as_bytes(std::span{bytes}))};
  v.files = std::move(files);
  return v;
}

TEST_P(store_backend_test, non_tensor_files_are_kept_byte_identical_with_a_version) {
  std::string binary(3 * 1024 * 1024 + 7, '\0');
  for (size_t i = 0; i < binary.size(); ++i)
    binary[i] = static_cast<char>((i * 131) ^ (i >> 9));
  const std::map<std::string, std::string> files{
    {"config.json", R"({"model_type": "llama", "rope_theta": 500000.0})"},
    {"tokenizer.model", binary},
    {"empty.txt", ""}};
  auto version = with_files(full_version("r", 0, base_weights()), files);
  auto stored = put(*store, pool, version);
  ASSERT_TRUE(stored) << to_string(stored.error());
  ASSERT_TRUE(store->claim(pool, version.m.ref));
  auto m = store->read_manifest(pool, {"r", 0});
  ASSERT_TRUE(m) << to_string(m.error());
  EXPECT_EQ(m->files, version.m.files);
  for (const auto& [name, bytes] : files) {
    auto got = read_version_file(*store, pool, *m, name);
    ASSERT_TRUE(got) << name << ": " << to_string(got.error());
    EXPECT_EQ(*got, bytes) << name;
  }
  // The tensors are unaffected; a file the version does not keep is not found.
  auto a = read_tensor(*store, pool, {"r", 0}, "a", 1000);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, base_weights()["a"]);
  auto missing = read_version_file(*store, pool, *m, "generation_config.json");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, errc::not_found);
  // A delta keeps its own files.
  auto next = base_weights();
  next["a"][0] ^= std::byte{1};
  auto delta = with_files(delta_version("r", 1, base_weights(), next),
                          {{"config.json", R"({"model_type": "llama"})"}});
  ASSERT_TRUE(put(*store, pool, delta));
  ASSERT_TRUE(store->compare_and_advance_pointer(pool, version_ref{"r", 0}, delta.m.ref));
  auto dm = store->read_manifest(pool, {"r", 1});
  ASSERT_TRUE(dm);
  auto cfg = read_version_file(*store, pool, *dm, "config.json");
  ASSERT_TRUE(cfg) << to_string(cfg.error());
  EXPECT_EQ(*cfg, R"({"model_type": "llama"})");
}

TEST_P(store_backend_test, files_must_match_the_manifest_and_their_names_are_checked) {
  // Stored but not listed, listed but not stored, another size: refused.
  auto unlisted = full_version("r", 0, base_weights());
  unlisted.files = {{"config.json", "{}"}};
  auto refused = put(*store, pool, unlisted);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, errc::invalid_manifest) << to_string(refused.error());
  auto listed = with_files(full_version("r", 0, base_weights()), {{"config.json", "{}"}});
  listed.files.clear();
  refused = put(*store, pool, listed);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, errc::invalid_manifest);
  auto other = with_files(full_version("r", 0, base_weights()), {{"config.json", "{}"}});
  other.files["config.json"] = "{ }";
  EXPECT_FALSE(put(*store, pool, other));
  for (std::string bad : {"../config.json", "a/b.json", ".hidden", "model.safetensors",
                          "model.safetensors.index.json", "x\ny"}) {
    auto hostile = with_files(full_version("r", 0, base_weights()), {});
    hostile.files = {{bad, "x"}};
    auto got = put(*store, pool, hostile);
    ASSERT_FALSE(got) << bad;
    EXPECT_EQ(got.error().code, errc::invalid_argument) << bad << ": " << to_string(got.error());
  }
  // Nothing of the refused attempts is visible; the same version then stores.
  EXPECT_FALSE(store->read_manifest(pool, {"r", 0}));
  auto good = with_files(full_version("r", 0, base_weights()), {{"config.json", "{}"}});
  ASSERT_TRUE(put(*store, pool, good));
  // Re-publishing it with other files is another content.
  ASSERT_TRUE(store->claim(pool, good.m.ref));
  auto changed = with_files(full_version("r", 0, base_weights()), {{"config.json", "[]"}});
  auto again = put(*store, pool, changed);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, errc::version_exists);
  EXPECT_TRUE(put(*store, pool, good));
}

TEST_P(store_backend_test, stored_version_is_invisible_until_the_pointer_names_it) {
  auto version = full_version("r", 0, base_weights());
  ASSERT_TRUE(put(*store, pool, version));
  auto m = store->read_manifest(pool, {"r", 0});
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code, errc::not_found);
  EXPECT_TRUE(store->list_versions(pool, "r")->empty());
  ASSERT_TRUE(store->claim(pool, version.m.ref));
  EXPECT_TRUE(store->read_manifest(pool, {"r", 0}));
}

TEST_P(store_backend_test, deltas_advance_the_pointer_and_are_listed) {
  auto w0 = base_weights();
  publish_anchor("r", 0, w0);
  auto w = w0;
  for (uint64_t v = 1; v <= 3; ++v) {
    auto next = w;
    next["a"][v] = static_cast<std::byte>(0xAA);
    ASSERT_TRUE(publish_delta("r", v, w, next));
    w = next;
  }
  auto p = store->read_pointer(pool);
  ASSERT_TRUE(p && p->has_value()) << (p ? "no pointer" : to_string(p.error()));
  EXPECT_EQ(**p, (pointer_record{{"r", 3}, 0}));
  auto listed = store->list_versions(pool, "r");
  ASSERT_TRUE(listed);
  EXPECT_EQ(listed->size(), 4u);
  auto m = store->read_manifest(pool, {"r", 2});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->touched, std::vector<std::string>{"a"});
}

TEST_P(store_backend_test, a_pointer_is_answered_from_memory_only_where_nothing_else_moves_it) {
  // Embedded RocksDB is its pointers' only writer (its lock file keeps
  // others out); S3 is shared between processes, and the actor's client
  // asks the actor.
  const bool remembers = GetParam().name == "rocksdb";
  EXPECT_FALSE(store->pointer_without_io(pool)) << "nothing read or moved yet";
  auto w0 = base_weights();
  publish_anchor("r", 0, w0);
  auto known = store->pointer_without_io(pool);
  ASSERT_EQ(known.has_value(), remembers);
  if (remembers) {
    EXPECT_EQ(*known, (pointer_record{{"r", 0}, 0})) << "the claim is remembered";
  }
  auto w1 = w0;
  w1["b"][7] = static_cast<std::byte>(0x5A);
  ASSERT_TRUE(publish_delta("r", 1, w0, w1));
  known = store->pointer_without_io(pool);
  ASSERT_EQ(known.has_value(), remembers);
  if (remembers) {
    EXPECT_EQ(*known, (pointer_record{{"r", 1}, 0})) << "the move is remembered";
  }
  // A refused move leaves what is known as it was.
  EXPECT_FALSE(store->compare_and_advance_pointer(pool, version_ref{"r", 0}, {"r", 1}));
  EXPECT_EQ(**store->read_pointer(pool), (pointer_record{{"r", 1}, 0}));
  EXPECT_FALSE(store->pointer_without_io("other")) << "a pool without a pointer";
}

/// A RocksDB store at `path` with one claimed anchor, `r/0`, closed again.
void store_claimed_anchor(const std::string& path) {
  auto opened = store::open_rocksdb_store(path);
  ASSERT_TRUE(opened);
  auto v0 = full_version("r", 0, {{"w", random_bytes(64, 1)}});
  ASSERT_TRUE(put(**opened, "default", v0));
  ASSERT_TRUE((*opened)->claim("default", v0.m.ref));
}

TEST(rocksdb_store, a_reopened_store_remembers_a_pointer_once_it_read_it) {
  temp_dir dir;
  const auto path = (dir.path() / "db").string();
  ASSERT_NO_FATAL_FAILURE(store_claimed_anchor(path));
  auto opened = store::open_rocksdb_store(path);
  ASSERT_TRUE(opened);
  EXPECT_FALSE((*opened)->pointer_without_io("default"));
  auto read = (*opened)->read_pointer("default");
  ASSERT_TRUE(read && *read);
  auto known = (*opened)->pointer_without_io("default");
  ASSERT_TRUE(known);
  EXPECT_EQ(*known, **read);
}

TEST(store_base, a_remembered_pointer_spares_the_backend_and_a_failed_move_forgets_it) {
  memory_store m;
  const std::string pool = "default";
  auto v0 = full_version("r", 0, {{"w", random_bytes(64, 1)}});
  ASSERT_TRUE(put(m, pool, v0));
  ASSERT_TRUE(m.claim(pool, v0.m.ref));
  const size_t loads = m.pointer_loads();
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ((*m.read_pointer(pool))->latest, (version_ref{"r", 0}));
  EXPECT_EQ(m.pointer_loads(), loads) << "reads answered from memory";

  auto v1 = full_version("r", 1, {{"w", random_bytes(64, 2)}});
  ASSERT_TRUE(put(m, pool, v1));
  m.fail_next_move();
  auto moved = m.compare_and_advance_pointer(pool, version_ref{"r", 0}, {"r", 1});
  ASSERT_FALSE(moved);
  EXPECT_EQ(moved.error().code, errc::backend_failure);
  EXPECT_FALSE(m.pointer_without_io(pool)) << "a failed move leaves nothing remembered";
  EXPECT_EQ((*m.read_pointer(pool))->latest, (version_ref{"r", 0}));
  EXPECT_EQ(m.pointer_loads(), loads + 2) << "the move and the read after it loaded the pointer";
  ASSERT_TRUE(m.pointer_without_io(pool)) << "remembered again from that read";
  ASSERT_TRUE(m.compare_and_advance_pointer(pool, version_ref{"r", 0}, {"r", 1}));
  EXPECT_EQ(m.pointer_without_io(pool)->latest, (version_ref{"r", 1}));
}

TEST(store_base, a_load_that_overlaps_a_move_is_not_remembered) {
  // A load that starts while a move is under way and reads the pointer
  // before it lands must not be remembered, even if it ends after a later
  // reader already saw (and returned) the moved pointer.
  memory_store m;
  const std::string pool = "default";
  auto v0 = full_version("r", 0, {{"w", random_bytes(64, 1)}});
  auto v1 = full_version("r", 1, {{"w", random_bytes(64, 2)}});
  ASSERT_TRUE(put(m, pool, v0));
  ASSERT_TRUE(put(m, pool, v1));
  ASSERT_TRUE(m.claim(pool, v0.m.ref));
  m.fail_next_move();
  ASSERT_FALSE(m.compare_and_advance_pointer(pool, version_ref{"r", 0}, {"r", 1}));
  ASSERT_FALSE(m.pointer_without_io(pool)) << "nothing remembered: reads load the pointer";

  using step = memory_store::pointer_step;
  std::thread early;
  std::promise<void> early_read, release;
  std::shared_future<void> released = release.get_future().share();
  const auto main_thread = std::this_thread::get_id();
  std::optional<pointer_record> early_got, later_got, known_meanwhile;
  m.on_pointer([&](step s) {
    if (s == step::move_landing && std::this_thread::get_id() == main_thread) {
      // A reader starts now and reads the pointer from before the move ...
      early = std::thread{[&] {
        auto p = m.read_pointer(pool);
        if (p && *p)
          early_got = **p;
      }};
      early_read.get_future().wait();
    } else if (s == step::loaded && std::this_thread::get_id() != main_thread) {
      early_read.set_value();
      released.wait(); // ... and finishes only after the move landed.
    } else if (s == step::move_landed) {
      m.on_pointer({});
      auto p = m.read_pointer(pool); // A later reader sees the move ...
      if (p && *p)
        later_got = **p;
      release.set_value();
      early.join();
      known_meanwhile = m.pointer_without_io(pool); // ... and nobody may go back.
    }
  });
  auto moved = m.compare_and_advance_pointer(pool, version_ref{"r", 0}, {"r", 1});
  ASSERT_TRUE(moved) << to_string(moved.error());
  ASSERT_TRUE(early_got && later_got);
  EXPECT_EQ(early_got->latest, (version_ref{"r", 0}));
  EXPECT_EQ(later_got->latest, (version_ref{"r", 1}));
  EXPECT_FALSE(known_meanwhile && (known_meanwhile->latest == version_ref{"r", 0}))
    << "the early load was remembered after a reader saw the move";
  EXPECT_EQ(m.pointer_without_io(pool)->latest, (version_ref{"r", 1}));
}

TEST(store_base, readers_racing_pointer_moves_never_see_the_pointer_go_back) {
  memory_store m;
  const std::string pool = "default";
  constexpr uint64_t versions = 150;
  std::vector<built_version> built;
  for (uint64_t v = 0; v < versions; ++v) {
    built.push_back(full_version("r", v, {{"w", random_bytes(16, static_cast<uint32_t>(v))}}));
    ASSERT_TRUE(put(m, pool, built.back()));
  }
  ASSERT_TRUE(m.claim(pool, built[0].m.ref));
  // Slow loads and moves widen the windows that moves and loads overlap in.
  m.delay_pointers(std::chrono::microseconds{400}, std::chrono::microseconds{200});
  std::atomic<bool> done{false};
  std::atomic<uint64_t> went_back{0}, reads{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t)
    readers.emplace_back([&] {
      uint64_t last = 0;
      while (!done) {
        auto p = m.read_pointer(pool);
        if (!p || !*p)
          continue;
        if ((*p)->latest.version < last)
          ++went_back;
        last = (*p)->latest.version;
        ++reads;
      }
    });
  // Every move overlaps readers: each waits until they have read again.
  auto readers_went_on = [&] {
    const uint64_t from = reads;
    while (reads < from + 3)
      std::this_thread::yield();
  };
  readers_went_on();
  for (uint64_t v = 1; v < versions; ++v) {
    if (v % 3 == 0)
      m.fail_next_move(); // a failed move (nothing remembered), then the same move again
    auto moved = m.compare_and_advance_pointer(pool, version_ref{"r", v - 1}, {"r", v});
    if (!moved)
      moved = m.compare_and_advance_pointer(pool, version_ref{"r", v - 1}, {"r", v});
    ASSERT_TRUE(moved) << to_string(moved.error());
    // A move acknowledged is what every later read sees.
    EXPECT_EQ((*m.read_pointer(pool))->latest.version, v);
    readers_went_on();
  }
  done = true;
  for (auto& r : readers)
    r.join();
  EXPECT_EQ(went_back, 0u);
  EXPECT_EQ(m.pointer_without_io(pool)->latest.version, versions - 1);
}

TEST_P(store_backend_test, empty_delta_has_no_shards) {
  auto w = base_weights();
  publish_anchor("r", 0, w);
  ASSERT_TRUE(publish_delta("r", 1, w, w));
  auto m = store->read_manifest(pool, {"r", 1});
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->is_empty_delta());
}

TEST_P(store_backend_test, rewind_is_refused_and_pointer_unchanged) {
  auto w = base_weights();
  publish_anchor("r", 0, w);
  auto w1 = w;
  w1["b"][0] ^= std::byte{1};
  ASSERT_TRUE(publish_delta("r", 1, w, w1));
  auto back = store->compare_and_advance_pointer(pool, version_ref{"r", 1}, {"r", 0});
  ASSERT_FALSE(back);
  EXPECT_EQ(back.error().code, errc::rewind);
  EXPECT_EQ((*store->read_pointer(pool))->latest, (version_ref{"r", 1}));
}

TEST_P(store_backend_test, observers_hear_each_pointer_move_once_and_nothing_else) {
  // The one place a host learns of a move, whoever asked for it.
  std::vector<std::pair<std::string, version_ref>> heard;
  std::mutex m;
  auto id = store->observe_pointers([&](const std::string& p, const pointer_record& now) {
    std::lock_guard guard{m};
    heard.emplace_back(p, now.latest);
  });
  auto w = base_weights();
  publish_anchor("r", 0, w);
  auto w1 = w;
  w1["a"][0] ^= std::byte{1};
  ASSERT_TRUE(publish_delta("r", 1, w, w1));
  // Refused (a rewind) and unchanged (a retried advance) moves are silent.
  EXPECT_FALSE(store->compare_and_advance_pointer(pool, version_ref{"r", 1}, {"r", 0}));
  EXPECT_TRUE(store->compare_and_advance_pointer(pool, version_ref{"r", 1}, {"r", 1}));
  {
    std::lock_guard guard{m};
    ASSERT_EQ(heard.size(), 2u);
    EXPECT_EQ(heard[0], (std::pair<std::string, version_ref>{pool, {"r", 0}}));
    EXPECT_EQ(heard[1], (std::pair<std::string, version_ref>{pool, {"r", 1}}));
  }
  store->unobserve_pointers(id);
  auto w2 = w1;
  w2["a"][1] ^= std::byte{1};
  ASSERT_TRUE(publish_delta("r", 2, w1, w2));
  std::lock_guard guard{m};
  EXPECT_EQ(heard.size(), 2u);
}

TEST_P(store_backend_test, republishing_identical_version_is_idempotent) {
  auto w = base_weights();
  publish_anchor("r", 0, w);
  auto w1 = w;
  w1["c"][3] ^= std::byte{9};
  ASSERT_TRUE(publish_delta("r", 1, w, w1));
  // A trainer retrying after a lost acknowledgement.
  auto again = delta_version("r", 1, w, w1);
  ASSERT_TRUE(put(*store, pool, again));
  auto moved = store->compare_and_advance_pointer(pool, version_ref{"r", 1}, {"r", 1});
  ASSERT_TRUE(moved) << to_string(moved.error());
  EXPECT_EQ(moved->latest, (version_ref{"r", 1}));
}

TEST_P(store_backend_test, republishing_different_content_is_version_exists) {
  auto w = base_weights();
  publish_anchor("r", 0, w);
  auto w1 = w;
  w1["c"][3] ^= std::byte{9};
  ASSERT_TRUE(publish_delta("r", 1, w, w1));
  auto other = w;
  other["a"][0] ^= std::byte{1};
  auto conflicting = delta_version("r", 1, w, other);
  auto ok = put(*store, pool, conflicting);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error().code, errc::version_exists);
  // Nothing was overwritten.
  auto bytes = read_tensor(*store, pool, {"r", 1}, "c", 64);
  ASSERT_TRUE(bytes);
  EXPECT_EQ(store->read_manifest(pool, {"r", 1})->touched, std::vector<std::string>{"c"});
}

TEST_P(store_backend_test, stale_expected_pointer_is_a_conflict) {
  auto w = base_weights();
  publish_anchor("r", 0, w);
  auto w1 = w;
  w1["a"][1] ^= std::byte{1};
  ASSERT_TRUE(publish_delta("r", 1, w, w1));
  auto w2 = w1;
  w2["a"][2] ^= std::byte{1};
  auto v2 = delta_version("r", 2, w1, w2);
  ASSERT_TRUE(put(*store, pool, v2));
  auto moved = store->compare_and_advance_pointer(pool, version_ref{"r", 0}, {"r", 2});
  ASSERT_FALSE(moved);
  EXPECT_EQ(moved.error().code, errc::conflict);
  EXPECT_NE(moved.error().message.find("found r/weight_v000001"), std::string::npos);
}

TEST_P(store_backend_test, delta_without_published_base_is_a_missing_link) {
  auto w = base_weights();
  publish_anchor("r", 0, w);
  auto w2 = w;
  w2["a"][0] ^= std::byte{1};
  auto v2 = delta_version("r", 2, w, w2);
  ASSERT_TRUE(put(*store, pool, v2));
  auto moved = store->compare_and_advance_pointer(pool, version_ref{"r", 0}, {"r", 2});
  ASSERT_FALSE(moved);
  EXPECT_EQ(moved.error().code, errc::missing_link);
}

TEST_P(store_backend_test, first_version_of_a_run_must_be_an_anchor) {
  auto w = base_weights();
  auto v0 = delta_version("r", 1, w, w);
  ASSERT_TRUE(put(*store, pool, v0));
  auto claimed = store->claim(pool, {"r", 1});
  ASSERT_FALSE(claimed);
}

TEST_P(store_backend_test, run_switch_and_resume_above_zero) {
  auto w = base_weights();
  publish_anchor("a", 0, w);
  publish_anchor("b", 40, w);
  auto p = store->read_pointer(pool);
  EXPECT_EQ(**p, (pointer_record{{"b", 40}, 40}));
  auto w41 = w;
  w41["a"][0] ^= std::byte{1};
  ASSERT_TRUE(publish_delta("b", 41, w, w41));
  EXPECT_EQ(**store->read_pointer(pool), (pointer_record{{"b", 41}, 40}));
  // Back to run a (claimed before, boot 0): a delta of it is allowed.
  auto w1 = w;
  w1["b"][0] ^= std::byte{1};
  ASSERT_TRUE(publish_delta("a", 1, w, w1));
  EXPECT_EQ(**store->read_pointer(pool), (pointer_record{{"a", 1}, 0}));
  // Re-claiming a's boot is idempotent and does not move the pointer back.
  auto again = store->claim(pool, {"a", 0});
  ASSERT_TRUE(again) << to_string(again.error());
  EXPECT_EQ(again->latest, (version_ref{"a", 1}));
}

TEST_P(store_backend_test, pools_are_independent) {
  auto w = base_weights();
  publish_anchor("r", 0, w);
  auto other = store->read_pointer("other-pool");
  ASSERT_TRUE(other);
  EXPECT_FALSE(other->has_value());
  EXPECT_FALSE(store->read_manifest("other-pool", {"r", 0}));
}

TEST_P(store_backend_test, truncated_shard_is_refused_and_leaves_nothing_visible) {
  auto version = full_version("r", 0, base_weights());
  auto broken = version;
  broken.shards[0].second.resize(broken.shards[0].second.size() - 10);
  auto ok = put(*store, pool, broken);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error().code, errc::invalid_format);
  EXPECT_NE(ok.error().message.find("model-00001-of-00001.safetensors"), std::string::npos)
    << ok.error().message;
  EXPECT_FALSE(store->claim(pool, {"r", 0}));
  // The honest retry goes through.
  ASSERT_TRUE(put(*store, pool, version));
  ASSERT_TRUE(store->claim(pool, {"r", 0}));
}

TEST_P(store_backend_test, corrupt_shard_bytes_fail_the_anchor_checksum) {
  auto version = full_version("r", 0, base_weights());
  version.shards[0].second.back() ^= std::byte{0xff};
  auto ok = put(*store, pool, version);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error().code, errc::checksum_mismatch);
  EXPECT_NE(ok.error().message.find("tensor '"), std::string::npos);
}

TEST_P(store_backend_test, manifest_with_wrong_checksum_is_refused) {
  auto version = full_version("r", 0, base_weights());
  version.m.checksums["b"] ^= 1;
  auto ok = put(*store, pool, version);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error().code, errc::checksum_mismatch);
  EXPECT_NE(ok.error().message.find("'b'"), std::string::npos);
}

TEST_P(store_backend_test, shards_must_match_the_manifest) {
  auto version = full_version("r", 0, base_weights());
  std::vector<shard_upload> none;
  auto missing = put_version(*store, pool, version.m, none);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, errc::invalid_argument);
  auto extra = version;
  extra.shards.emplace_back("model-00009-of-00009.safetensors", extra.shards[0].second);
  auto refused = put(*store, pool, extra);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("model-00009-of-00009"), std::string::npos);
  auto wrong_total = version;
  wrong_total.m.total_size += 1;
  EXPECT_FALSE(put(*store, pool, wrong_total));
}

TEST_P(store_backend_test, reads_outside_a_tensor_are_refused) {
  publish_anchor("r", 0, base_weights());
  std::vector<std::byte> buf(10);
  auto past = store->read_range(pool, {"r", 0}, "c", 60, buf);
  ASSERT_FALSE(past);
  EXPECT_EQ(past.error().code, errc::invalid_argument);
  EXPECT_NE(past.error().message.find("'c'"), std::string::npos);
  auto unknown = store->read_range(pool, {"r", 0}, "nope", 0, buf);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, errc::not_found);
}

TEST_P(store_backend_test, hostile_names_are_refused) {
  EXPECT_FALSE(store->read_pointer("../x"));
  EXPECT_FALSE(store->read_manifest(pool, {"a/b", 0}));
  auto version = full_version("r", 0, base_weights());
  EXPECT_FALSE(put(*store, "bad pool", version));
}

TEST_P(store_backend_test, retention_keeps_newest_their_anchors_and_the_boot) {
  auto w = base_weights();
  publish_anchor("r", 0, w);
  for (uint64_t v = 1; v <= 9; ++v) {
    auto next = w;
    next["a"][v] ^= std::byte{1};
    if (v == 5) {
      auto anchor = full_version("r", 5, next);
      ASSERT_TRUE(put(*store, pool, anchor));
      ASSERT_TRUE(store->compare_and_advance_pointer(pool, version_ref{"r", 4}, {"r", 5}));
    } else {
      ASSERT_TRUE(publish_delta("r", v, w, next));
    }
    w = next;
  }
  // Read before the collection: the layouts a read caches go with the
  // versions they describe.
  std::vector<std::byte> buf(4);
  ASSERT_TRUE(store->read_range(pool, {"r", 3}, "a", 0, buf));
  auto report = store->retain(pool, {2, {}, false, {}});
  ASSERT_TRUE(report) << to_string(report.error());
  // Keep 8, 9 and their chain back to anchor 5, and boot 0.
  std::vector<version_ref> deleted{{"r", 1}, {"r", 2}, {"r", 3}, {"r", 4}};
  EXPECT_EQ(refs_of(report->deleted), deleted);
  auto listed = store->list_versions(pool, "r");
  ASSERT_TRUE(listed);
  std::vector<version_ref> left{{"r", 0}, {"r", 5}, {"r", 6}, {"r", 7}, {"r", 8}, {"r", 9}};
  EXPECT_EQ(*listed, left);
  // The collected bytes are freed: no file of theirs stays open here.
  EXPECT_EQ(deleted_files_held_open(dir.path()), std::vector<std::string>{});
  EXPECT_FALSE(store->read_manifest(pool, {"r", 3}));
  auto gone = store->read_range(pool, {"r", 3}, "a", 0, buf);
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().code, errc::not_found) << to_string(gone.error());
  EXPECT_TRUE(store->read_range(pool, {"r", 6}, "a", 0, buf));
}

TEST_P(store_backend_test, dropped_runs_go_entirely_unless_the_pointer_uses_them) {
  auto w = base_weights();
  publish_anchor("old", 0, w);
  auto next = w;
  next["a"][1] ^= std::byte{1};
  ASSERT_TRUE(publish_delta("old", 1, w, next));
  publish_anchor("new", 0, next);
  retention_request drop{2, {}, false, {"old", "new"}};
  drop.dry_run = true;
  auto planned = store->retain(pool, drop);
  ASSERT_TRUE(planned) << to_string(planned.error());
  std::vector<version_ref> gone{{"old", 0}, {"old", 1}};
  EXPECT_EQ(refs_of(planned->deleted), gone);
  ASSERT_TRUE(store->list_versions(pool, "old"));
  EXPECT_EQ(store->list_versions(pool, "old")->size(), 2u) << "a dry run deletes nothing";
  drop.dry_run = false;
  auto report = store->retain(pool, drop);
  ASSERT_TRUE(report) << to_string(report.error());
  // The boot of "old" goes too; "new" holds the pointer and stays.
  EXPECT_EQ(refs_of(report->deleted), gone);
  EXPECT_TRUE(store->list_versions(pool, "old")->empty());
  EXPECT_EQ(*store->list_versions(pool, "new"), (std::vector<version_ref>{{"new", 0}}));
  EXPECT_FALSE(store->read_manifest(pool, {"old", 0}));
  EXPECT_TRUE(store->read_manifest(pool, {"new", 0}));
  // Without the drop, a run's boot is never collected.
  auto again = store->retain(pool, {1, {}, false, {}});
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->deleted.empty());
}

TEST(rocksdb_store, garbage_pointer_record_is_corrupt_data) {
  temp_dir dir;
  const auto path = (dir.path() / "db").string();
  ASSERT_NO_FATAL_FAILURE(store_claimed_anchor(path));
  {
    std::vector<rocksdb::ColumnFamilyDescriptor> cfs{{rocksdb::kDefaultColumnFamilyName, {}},
                                                     {"manifests", {}}};
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open({}, path, cfs, &handles, &raw).ok());
    ASSERT_TRUE(raw->Put({}, handles[0], std::string{"ptr\0default", 11}, "\xc1garbage").ok());
    for (auto* h : handles)
      raw->DestroyColumnFamilyHandle(h);
    delete raw;
  }
  auto opened = store::open_rocksdb_store(path);
  ASSERT_TRUE(opened);
  auto p = (*opened)->read_pointer("default");
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, errc::corrupt_data);
  EXPECT_NE(p.error().message.find("default"), std::string::npos) << p.error().message;
  // Nothing was overwritten: the version is still there for a repair.
  auto versions = (*opened)->list_versions("default", "r");
  ASSERT_TRUE(versions);
  EXPECT_EQ(versions->size(), 1u);
}

TEST(rocksdb_store, schema_mismatch_is_refused) {
  temp_dir dir;
  const auto path = (dir.path() / "db").string();
  { ASSERT_TRUE(store::open_rocksdb_store(path)); }
  {
    std::vector<rocksdb::ColumnFamilyDescriptor> cfs{{rocksdb::kDefaultColumnFamilyName, {}},
                                                     {"manifests", {}}};
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open({}, path, cfs, &handles, &raw).ok());
    ASSERT_TRUE(raw->Put({}, handles[0], "schema", "stitch-rocksdb-999").ok());
    for (auto* h : handles)
      raw->DestroyColumnFamilyHandle(h);
    delete raw;
  }
  auto opened = store::open_rocksdb_store(path);
  ASSERT_FALSE(opened);
  EXPECT_NE(opened.error().message.find("stitch-rocksdb-999"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(backends, store_backend_test, ::testing::ValuesIn(backends()),
                         [](const ::testing::TestParamInfo<backend_factory>& p) {
                           return p.param.name;
                         });

} // namespace
} // namespace stitch
