// The store actor on CAF's deterministic scheduler with hand-stepped lanes:
// every message and every backend job is stepped by hand, so the order of
// replies and notifications is exact, and a lane can be held mid-work.

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <nlohmann/json.hpp>

#include "actors/executors.hpp"
#include "actors/fakes.hpp"
#include "actors/status.hpp"
#include "actors/store.hpp"
#include "node/system_config.hpp"
#include "runtime/store/rocksdb_store.hpp"
#include "store/store_fixtures.hpp"

namespace stitch {
namespace {

using namespace stitch::testing;
using namespace std::chrono_literals;

class store_actor_test : public ::testing::Test {
protected:
  store_actor_test()
      : sys(deterministic(cfg)), self(sys, true),
        sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {
    auto opened = store::open_rocksdb_store((dir.path() / "db").string());
    EXPECT_TRUE(opened);
    backend = std::shared_ptr<store_backend>{std::move(*opened)};
    store_options opts;
    opts.upload_idle_timeout = 60s;
    actor = sys.spawn(store_service, backend, store_lanes{fast, bulk, reads}, opts);
    sched.run();
  }

  ~store_actor_test() override {
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    sched.run();
    fast->run_all();
    bulk->run_all();
    reads->run_all();
  }

  /// Steps messages and lane jobs until neither has anything left.
  void settle() {
    for (;;) {
      size_t n = sched.run();
      n += fast->run_all();
      n += bulk->run_all();
      n += reads->run_all();
      if (n == 0)
        return;
    }
  }

  /// The next message in `self`'s mailbox, if one is there.
  template <class... Fs>
  bool next(Fs&&... fs) {
    bool got = true;
    self->receive(
      std::forward<Fs>(fs)..., caf::after(0s) >> [&] { got = false; });
    return got;
  }

  /// The error code of the next answer, `none` for a success.
  template <class T>
  errc answer_code() {
    errc code = errc::invalid_argument;
    bool got = false;
    self->receive(
      [&](T&) {
        got = true;
        code = errc::none;
      },
      [&](const caf::error& err) {
        got = true;
        code = static_cast<errc>(err.code());
      },
      caf::after(0s) >> [] {});
    EXPECT_TRUE(got) << "no answer arrived";
    return code;
  }

  /// A published anchor of `run` in `p`.
  built_version published(const std::string& p, const std::string& run, uint64_t seed) {
    auto v = full_version(run, 0, {{"w", random_bytes(1000, seed)}});
    EXPECT_TRUE(put(*backend, p, v));
    EXPECT_TRUE(backend->claim(p, v.m.ref));
    return v;
  }

  temp_dir dir;
  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scoped_actor self;
  caf::scheduler::test_coordinator& sched;
  std::shared_ptr<manual_executor> fast = std::make_shared<manual_executor>();
  std::shared_ptr<manual_executor> bulk = std::make_shared<manual_executor>();
  std::shared_ptr<manual_executor> reads = std::make_shared<manual_executor>();
  std::shared_ptr<store_backend> backend;
  store_actor actor;
  const std::string pool = "default";
};

TEST_F(store_actor_test, handlers_only_queue_work_and_answer_when_the_lane_reports) {
  auto v0 = full_version("r", 0, {{"w", random_bytes(100, 1)}});
  ASSERT_TRUE(put(*backend, pool, v0));
  self->send(actor, atom::claim_v, pool, v0.m.ref, std::string{});
  sched.run();
  EXPECT_EQ(fast->size(), 1u) << "the claim waits on the fast lane";
  EXPECT_FALSE(backend->read_pointer(pool)->has_value()) << "nothing ran in the handler";
  EXPECT_FALSE(next([](const pointer_record&) {}, [](const caf::error&) {}))
    << "no answer before the lane ran";
  settle();
  EXPECT_EQ(answer_code<pointer_record>(), errc::none);
  EXPECT_EQ((*backend->read_pointer(pool))->latest, (version_ref{"r", 0}));
}

TEST_F(store_actor_test, a_listener_of_every_pool_hears_each_pools_moves) {
  self->send(actor, atom::subscribe_v, std::string{},
             caf::actor_cast<pointer_listener_actor>(self));
  settle();
  auto v0 = full_version("r", 0, {{"w", random_bytes(100, 1)}});
  ASSERT_TRUE(put(*backend, pool, v0));
  ASSERT_TRUE(put(*backend, "other", v0));
  self->send(actor, atom::claim_v, pool, v0.m.ref, std::string{});
  self->send(actor, atom::claim_v, std::string{"other"}, v0.m.ref, std::string{});
  settle();
  std::set<std::string> heard;
  for (int i = 0; i < 4; ++i)
    self->receive(
      [&](atom::pointer_moved, const std::string& p, const pointer_record& r) {
        EXPECT_EQ(r, (pointer_record{{"r", 0}, 0}));
        heard.insert(p);
      },
      [&](const pointer_record&) {}, caf::after(std::chrono::seconds{0}) >> [] {});
  EXPECT_EQ(heard, (std::set<std::string>{pool, "other"}));
}

TEST_F(store_actor_test, status_shows_every_pool_of_the_store_those_without_replicas_included) {
  published("side", "s", 1);
  auto status = sys.spawn(status_service, status_options{}, actor);
  settle();
  // A pool claimed after the status actor started, through the store.
  auto v0 = full_version("r", 0, {{"w", random_bytes(100, 2)}});
  ASSERT_TRUE(put(*backend, pool, v0));
  self->send(actor, atom::claim_v, pool, v0.m.ref, std::string{});
  settle();
  EXPECT_EQ(answer_code<pointer_record>(), errc::none);
  self->send(status, atom::status_view_v);
  settle();
  std::string text;
  ASSERT_TRUE(next([&](const status_snapshot& s) { text = status_json(s); }));
  auto j = nlohmann::json::parse(text);
  std::map<std::string, std::string> pools;
  for (const auto& p : j["pools"])
    pools[p["pool"]] = p["pointer"];
  EXPECT_EQ(pools, (std::map<std::string, std::string>{{"side", "s/weight_v000000"},
                                                       {pool, "r/weight_v000000"}}))
    << text;
  caf::anon_send_exit(status, caf::exit_reason::user_shutdown);
  settle();
}

TEST_F(store_actor_test, listeners_hear_the_pointer_move_before_the_claim_is_answered) {
  self->send(actor, atom::subscribe_v, pool, caf::actor_cast<pointer_listener_actor>(self));
  settle();
  auto v0 = full_version("r", 0, {{"w", random_bytes(100, 1)}});
  ASSERT_TRUE(put(*backend, pool, v0));
  self->send(actor, atom::claim_v, pool, v0.m.ref, std::string{});
  settle();
  std::vector<std::string> order;
  for (int i = 0; i < 2; ++i)
    self->receive(
      [&](atom::pointer_moved, const std::string& p, const pointer_record& r) {
        EXPECT_EQ(p, pool);
        EXPECT_EQ(r, (pointer_record{{"r", 0}, 0}));
        order.push_back("moved");
      },
      [&](const pointer_record& r) {
        EXPECT_EQ(r.latest, (version_ref{"r", 0}));
        order.push_back("reply");
      },
      caf::after(0s) >> [&] { order.push_back("nothing"); });
  EXPECT_EQ(order, (std::vector<std::string>{"moved", "reply"}));
}

TEST_F(store_actor_test, errors_cross_the_boundary_as_stitch_errors) {
  self->send(actor, atom::read_manifest_v, pool, version_ref{"r", 3});
  settle();
  bool failed = false;
  self->receive([&](const manifest&) {},
                [&](const caf::error& err) {
                  failed = true;
                  EXPECT_EQ(err.category(), caf::atom("stitch"));
                  EXPECT_EQ(static_cast<errc>(err.code()), errc::not_found);
                },
                caf::after(0s) >> [] {});
  EXPECT_TRUE(failed);
}

TEST_F(store_actor_test, range_reads_are_bounded) {
  auto v0 = published(pool, "r", 1);
  self->send(actor, atom::read_range_v, pool, version_ref{"r", 0}, std::string{"w"}, uint64_t{0},
             max_chunk_bytes + 1);
  settle();
  EXPECT_EQ(answer_code<stitch::shared_piece>(), errc::limit_exceeded);
  self->send(actor, atom::read_range_v, pool, version_ref{"r", 0}, std::string{"w"}, uint64_t{10},
             uint64_t{20});
  settle();
  std::vector<char> got;
  self->receive(
    [&](const stitch::shared_piece& bytes) { got.assign(bytes.data, bytes.data + bytes.size); },
    [&](const caf::error&) {}, caf::after(0s) >> [] {});
  ASSERT_EQ(got.size(), 20u);
  const auto& shard = v0.shards[0].second;
  EXPECT_EQ(std::memcmp(got.data(), shard.data() + shard.size() - 990, 20), 0);
}

TEST_F(store_actor_test, a_held_bulk_lane_delays_no_pointer_manifest_read_or_other_pool) {
  auto v0 = published(pool, "r", 1);
  // A large upload is under way: its bytes sit on the bulk lane, not run.
  auto big = full_version("r", 1, {{"w", random_bytes(3 * max_chunk_bytes, 2)}});
  self->send(actor, atom::put_begin_v, pool, version_ref{"r", 1}, std::string{});
  sched.run();
  bulk->run_all();
  sched.run();
  uint64_t id = 0;
  self->receive([&](uint64_t upload) { id = upload; }, caf::after(0s) >> [] {});
  ASSERT_NE(id, 0u);
  const auto& bytes = big.shards[0].second;
  self->send(actor, atom::put_shard_v, id, big.shards[0].first, uint64_t{bytes.size()});
  for (size_t at = 0; at < bytes.size(); at += max_chunk_bytes) {
    auto n = std::min<size_t>(max_chunk_bytes, bytes.size() - at);
    std::vector<char> chunk(reinterpret_cast<const char*>(bytes.data() + at),
                            reinterpret_cast<const char*>(bytes.data() + at + n));
    self->send(actor, atom::put_chunk_v, id, std::move(chunk));
  }
  sched.run();
  ASSERT_GT(bulk->size(), 0u) << "the upload waits on the bulk lane";

  // Meanwhile: pointer, manifest, listing and another pool's claim.
  auto other = full_version("q", 0, {{"w", random_bytes(100, 3)}});
  ASSERT_TRUE(put(*backend, "other", other));
  self->send(actor, atom::read_pointer_v, pool);
  self->send(actor, atom::read_manifest_v, pool, version_ref{"r", 0});
  self->send(actor, atom::list_v, pool, std::string{"r"});
  self->send(actor, atom::claim_v, std::string{"other"}, other.m.ref, std::string{});
  // ... and a replica of the other pool syncing: its manifest and bytes.
  self->send(actor, atom::read_manifest_v, std::string{"other"}, other.m.ref);
  self->send(actor, atom::read_range_v, std::string{"other"}, other.m.ref, std::string{"w"},
             uint64_t{0}, uint64_t{100});
  for (;;) {
    size_t n = sched.run() + fast->run_all() + reads->run_all();
    if (n == 0)
      break;
  }
  caf::optional<pointer_record> pointer;
  self->receive([&](caf::optional<pointer_record>& p) { pointer = p; }, caf::after(0s) >> [] {});
  ASSERT_TRUE(pointer);
  EXPECT_EQ(pointer->latest, (version_ref{"r", 0}));
  manifest m;
  self->receive([&](manifest& got) { m = std::move(got); }, caf::after(0s) >> [] {});
  EXPECT_EQ(m, v0.m);
  std::vector<version_ref> listed;
  self->receive([&](std::vector<version_ref>& got) { listed = std::move(got); },
                caf::after(0s) >> [] {});
  EXPECT_EQ(listed, (std::vector<version_ref>{{"r", 0}}));
  EXPECT_EQ(answer_code<pointer_record>(), errc::none);
  EXPECT_EQ((*backend->read_pointer("other"))->latest, (version_ref{"q", 0}));
  manifest other_m;
  self->receive([&](manifest& got) { other_m = std::move(got); }, caf::after(0s) >> [] {});
  EXPECT_EQ(other_m, other.m);
  std::vector<char> got_bytes;
  self->receive(
    [&](const stitch::shared_piece& got) { got_bytes.assign(got.data, got.data + got.size); },
    caf::after(0s) >> [] {});
  ASSERT_EQ(got_bytes.size(), 100u);
  auto want = random_bytes(100, 3);
  EXPECT_EQ(std::memcmp(got_bytes.data(), want.data(), 100), 0);
  EXPECT_GT(bulk->size(), 0u) << "all of it answered while the upload was still held";

  // Released, the upload completes.
  self->send(actor, atom::put_end_v, id, big.m);
  settle();
  size_t acks = 0;
  while (next([&](uint64_t) { ++acks; }, [&](bool ok) { EXPECT_TRUE(ok); }))
    ;
  EXPECT_TRUE(backend->compare_and_advance_pointer(pool, version_ref{"r", 0}, {"r", 1}));
}

TEST_F(store_actor_test, a_pointer_the_store_remembers_is_answered_without_the_fast_lane) {
  // A pool without a pointer: the read waits on the fast lane.
  self->send(actor, atom::read_pointer_v, pool);
  sched.run();
  EXPECT_EQ(fast->size(), 1u);
  EXPECT_FALSE(next([](const caf::optional<pointer_record>&) {}, [](const caf::error&) {}));
  settle();
  caf::optional<pointer_record> none{pointer_record{}};
  ASSERT_TRUE(next([&](const caf::optional<pointer_record>& p) { none = p; }));
  EXPECT_FALSE(none);

  // Claimed through the actor, the pointer is answered by the handler
  // itself, also while the fast lane is held by other work.
  auto v0 = full_version("r", 0, {{"w", random_bytes(100, 1)}});
  ASSERT_TRUE(put(*backend, pool, v0));
  self->send(actor, atom::claim_v, pool, v0.m.ref, std::string{});
  settle();
  EXPECT_EQ(answer_code<pointer_record>(), errc::none);
  self->send(actor, atom::read_manifest_v, pool, v0.m.ref);
  self->send(actor, atom::read_pointer_v, pool);
  sched.run();
  EXPECT_EQ(fast->size(), 1u) << "only the manifest read waits on the fast lane";
  caf::optional<pointer_record> pointer;
  ASSERT_TRUE(next([&](const caf::optional<pointer_record>& p) { pointer = p; }));
  ASSERT_TRUE(pointer);
  EXPECT_EQ(*pointer, (pointer_record{{"r", 0}, 0}));
  settle();
  manifest m;
  ASSERT_TRUE(next([&](manifest& got) { m = std::move(got); }));
  EXPECT_EQ(m, v0.m);

  // A move through the actor is what the next read answers.
  auto v1 = full_version("r", 1, {{"w", random_bytes(100, 2)}});
  ASSERT_TRUE(put(*backend, pool, v1));
  self->send(actor, atom::advance_v, pool, caf::optional<version_ref>{version_ref{"r", 0}},
             version_ref{"r", 1}, std::string{});
  settle();
  EXPECT_EQ(answer_code<pointer_record>(), errc::none);
  self->send(actor, atom::read_pointer_v, pool);
  sched.run();
  EXPECT_EQ(fast->size(), 0u);
  ASSERT_TRUE(next([&](const caf::optional<pointer_record>& p) { pointer = p; }));
  ASSERT_TRUE(pointer);
  EXPECT_EQ(pointer->latest, (version_ref{"r", 1}));
}

TEST_F(store_actor_test, a_full_lane_answers_busy) {
  auto small = std::make_shared<manual_executor>(1);
  auto a = sys.spawn(store_service, backend, store_lanes{small, bulk, reads}, store_options{});
  self->send(a, atom::read_pointer_v, pool);
  self->send(a, atom::read_pointer_v, pool);
  sched.run();
  EXPECT_EQ(answer_code<caf::optional<pointer_record>>(), errc::busy);
  while (sched.run() + small->run_all() > 0)
    ;
  EXPECT_EQ(answer_code<caf::optional<pointer_record>>(), errc::none);
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_F(store_actor_test, a_bad_upload_is_refused_and_leaves_nothing) {
  auto v0 = full_version("r", 0, {{"w", random_bytes(100, 1)}});
  self->send(actor, atom::put_begin_v, pool, v0.m.ref, std::string{});
  settle();
  uint64_t id = 0;
  self->receive([&](uint64_t upload) { id = upload; }, caf::after(0s) >> [] {});
  ASSERT_NE(id, 0u);
  self->send(actor, atom::put_shard_v, id, std::string{"../evil.safetensors"}, uint64_t{10});
  settle();
  EXPECT_EQ(answer_code<bool>(), errc::invalid_argument);
  self->send(actor, atom::put_end_v, id, v0.m);
  settle();
  EXPECT_EQ(answer_code<bool>(), errc::not_found) << "the upload ended with its failure";
  // Nothing of it is on disk.
  size_t files = 0;
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(dir.path() / "db" / "versions"))
    files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 0u);
}

TEST_F(store_actor_test, a_shard_that_does_not_match_the_manifest_fails_the_commit) {
  auto v0 = full_version("r", 0, {{"w", random_bytes(100, 1)}});
  auto wrong = v0.m;
  wrong.checksums["w"] ^= 1;
  self->send(actor, atom::put_begin_v, pool, v0.m.ref, std::string{});
  settle();
  uint64_t id = 0;
  self->receive([&](uint64_t upload) { id = upload; }, caf::after(0s) >> [] {});
  const auto& bytes = v0.shards[0].second;
  self->send(actor, atom::put_shard_v, id, v0.shards[0].first, uint64_t{bytes.size()});
  self->send(actor, atom::put_chunk_v, id,
             std::vector<char>(reinterpret_cast<const char*>(bytes.data()),
                               reinterpret_cast<const char*>(bytes.data() + bytes.size())));
  self->send(actor, atom::put_end_v, id, wrong);
  settle();
  EXPECT_EQ(answer_code<bool>(), errc::none);
  EXPECT_EQ(answer_code<uint64_t>(), errc::none);
  EXPECT_EQ(answer_code<bool>(), errc::checksum_mismatch);
  EXPECT_FALSE(backend->claim(pool, v0.m.ref)) << "nothing was stored";
}

TEST_F(store_actor_test, an_idle_upload_is_dropped_with_what_it_wrote) {
  auto v0 = full_version("r", 0, {{"w", random_bytes(100, 1)}});
  self->send(actor, atom::put_begin_v, pool, v0.m.ref, std::string{});
  settle();
  uint64_t id = 0;
  self->receive([&](uint64_t upload) { id = upload; }, caf::after(0s) >> [] {});
  const auto& bytes = v0.shards[0].second;
  self->send(actor, atom::put_shard_v, id, v0.shards[0].first, uint64_t{bytes.size()});
  self->send(actor, atom::put_chunk_v, id,
             std::vector<char>(reinterpret_cast<const char*>(bytes.data()),
                               reinterpret_cast<const char*>(bytes.data()) + 10));
  settle();
  EXPECT_EQ(answer_code<bool>(), errc::none);
  EXPECT_EQ(answer_code<uint64_t>(), errc::none);
  // The sweep runs every 30 s; the upload was idle past its 60 s.
  sched.advance_time(std::chrono::seconds{91});
  settle();
  self->send(actor, atom::put_chunk_v, id, std::vector<char>(10, 'x'));
  settle();
  EXPECT_EQ(answer_code<uint64_t>(), errc::not_found);
  size_t files = 0;
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(dir.path() / "db" / "versions"))
    files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 0u) << "its half-written shard is gone";
}

TEST_F(store_actor_test, dead_listeners_are_forgotten) {
  auto sub = sys.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](atom::pointer_moved, const std::string&, const pointer_record&) {}};
  });
  self->send(actor, atom::subscribe_v, pool, caf::actor_cast<pointer_listener_actor>(sub));
  settle();
  caf::anon_send_exit(sub, caf::exit_reason::user_shutdown);
  settle();
  published(pool, "r", 1);
  EXPECT_EQ(sched.run(), 1u) << "only the backend's move reaches the store: nothing goes to the "
                                "dead listener";
}

} // namespace
} // namespace stitch

namespace stitch {
namespace {

TEST_F(store_actor_test, a_store_with_an_admin_token_refuses_every_write_without_it) {
  store_options opts;
  opts.admin_token = "secret";
  auto a = sys.spawn(store_service, backend, store_lanes{fast, bulk, reads}, opts);
  auto v0 = full_version("r", 0, {{"w", random_bytes(100, 1)}});
  ASSERT_TRUE(put(*backend, pool, v0));
  for (const std::string& token : {std::string{}, std::string{"wrong"}}) {
    self->send(a, atom::claim_v, pool, v0.m.ref, token);
    settle();
    EXPECT_EQ(answer_code<pointer_record>(), errc::unauthorized) << token;
    self->send(a, atom::advance_v, pool, caf::optional<version_ref>{}, v0.m.ref, token);
    settle();
    EXPECT_EQ(answer_code<pointer_record>(), errc::unauthorized);
    self->send(a, atom::put_begin_v, pool, version_ref{"r", 1}, token);
    settle();
    EXPECT_EQ(answer_code<uint64_t>(), errc::unauthorized);
    retention_request keep_one;
    keep_one.keep_last = 1;
    self->send(a, atom::retain_v, pool, keep_one, token);
    settle();
    EXPECT_EQ(answer_code<retention_report>(), errc::unauthorized);
  }
  auto pointer = backend->read_pointer(pool);
  ASSERT_TRUE(pointer);
  EXPECT_FALSE(*pointer) << "nothing was claimed";
  // With the token, the same writes go through; upload ids cannot be guessed.
  self->send(a, atom::claim_v, pool, v0.m.ref, std::string{"secret"});
  settle();
  EXPECT_EQ(answer_code<pointer_record>(), errc::none);
  std::vector<uint64_t> ids;
  for (uint64_t v : {1, 2}) {
    self->send(a, atom::put_begin_v, pool, version_ref{"r", v}, std::string{"secret"});
    settle();
    self->receive([&](uint64_t id) { ids.push_back(id); }, caf::after(0s) >> [] {});
  }
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_NE(ids[0] + 1, ids[1]) << "sequential upload ids";
  EXPECT_GT(std::max(ids[0], ids[1]), uint64_t{1} << 32);
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  settle();
}

} // namespace
} // namespace stitch
