// The store actor on CAF's deterministic scheduler: every message is stepped
// by hand, so the order of replies and notifications is exact.

#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/store.hpp"
#include "runtime/node/system_config.hpp"
#include "runtime/store/rocksdb_store.hpp"
#include "store/store_fixtures.hpp"

namespace stitch {
namespace {

using namespace stitch::testing;
using namespace std::chrono_literals;

caf::actor_system_config& deterministic(caf::actor_system_config& cfg) {
  register_stitch_types(cfg);
  cfg.set("scheduler.policy", caf::atom("testing"));
  cfg.set("logger.file-verbosity", caf::atom("quiet"));
  return cfg;
}

class store_actor_test : public ::testing::Test {
protected:
  store_actor_test()
      : sys(deterministic(cfg)), self(sys, true),
        sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {
    auto opened = store::open_rocksdb_store((dir.path() / "db").string());
    EXPECT_TRUE(opened);
    backend = std::shared_ptr<store_backend>{std::move(*opened)};
    actor = sys.spawn(store_service, backend, dir.path() / "spool");
    sched.run();
  }

  ~store_actor_test() override {
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    sched.run();
  }

  /// The next message in `self`'s mailbox, which must already be there.
  template <class... Fs>
  void next(Fs&&... fs) {
    bool got = false;
    self->receive(
      [&](auto&&... xs) {
        got = true;
        (fs(xs...), ...);
      },
      caf::after(0s) >> [&] {});
    ASSERT_TRUE(got) << "no message arrived";
  }

  temp_dir dir;
  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scoped_actor self;
  caf::scheduler::test_coordinator& sched;
  std::shared_ptr<store_backend> backend;
  store_actor actor;
  const std::string pool = "default";
};

TEST_F(store_actor_test, subscribers_hear_the_pointer_move_before_the_claim_is_answered) {
  self->send(actor, atom::subscribe_v, pool, caf::actor_cast<caf::actor>(self));
  sched.run();
  auto v0 = full_version("r", 0, {{"w", random_bytes(100, 1)}});
  ASSERT_TRUE(put(*backend, pool, v0));
  self->send(actor, atom::claim_v, pool, v0.m.ref);
  EXPECT_EQ(sched.run(), 1u);
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
  sched.run();
  bool failed = false;
  self->receive([&](const std::string&) {},
                [&](const caf::error& err) {
                  failed = true;
                  EXPECT_EQ(err.category(), caf::atom("stitch"));
                  EXPECT_EQ(static_cast<errc>(err.code()), errc::not_found);
                },
                caf::after(0s) >> [] {});
  EXPECT_TRUE(failed);
}

TEST_F(store_actor_test, range_reads_are_bounded) {
  auto v0 = full_version("r", 0, {{"w", random_bytes(100, 1)}});
  ASSERT_TRUE(put(*backend, pool, v0));
  ASSERT_TRUE(backend->claim(pool, v0.m.ref));
  self->send(actor, atom::read_range_v, pool, version_ref{"r", 0}, std::string{"w"}, uint64_t{0},
             max_chunk_bytes + 1);
  sched.run();
  bool refused = false;
  self->receive(
    [&](const std::vector<char>&) {},
    [&](const caf::error& err) { refused = static_cast<errc>(err.code()) == errc::limit_exceeded; },
    caf::after(0s) >> [] {});
  EXPECT_TRUE(refused);
  self->send(actor, atom::read_range_v, pool, version_ref{"r", 0}, std::string{"w"}, uint64_t{10},
             uint64_t{20});
  sched.run();
  std::vector<char> got;
  self->receive([&](std::vector<char>& bytes) { got = std::move(bytes); },
                [&](const caf::error&) {}, caf::after(0s) >> [] {});
  ASSERT_EQ(got.size(), 20u);
  EXPECT_EQ(
    std::memcmp(got.data(), v0.shards[0].second.data() + v0.shards[0].second.size() - 90, 20), 0);
}

TEST_F(store_actor_test, upload_of_a_shard_not_in_the_manifest_is_refused_and_dropped) {
  auto v0 = full_version("r", 0, {{"w", random_bytes(100, 1)}});
  self->send(actor, atom::put_begin_v, pool, to_json(v0.m));
  sched.run();
  uint64_t id = 0;
  self->receive([&](uint64_t upload) { id = upload; }, [&](const caf::error&) {},
                caf::after(0s) >> [] {});
  ASSERT_NE(id, 0u);
  self->send(actor, atom::put_chunk_v, id, std::string{"../evil.safetensors"},
             std::vector<char>(10));
  sched.run();
  bool refused = false;
  self->receive([&](uint64_t) {}, [&](const caf::error&) { refused = true; },
                caf::after(0s) >> [] {});
  EXPECT_TRUE(refused);
  self->send(actor, atom::put_end_v, id);
  sched.run();
  bool gone = false;
  self->receive(
    [&](bool) {},
    [&](const caf::error& err) { gone = static_cast<errc>(err.code()) == errc::not_found; },
    caf::after(0s) >> [] {});
  EXPECT_TRUE(gone) << "the upload was dropped with its spooled bytes";
  EXPECT_TRUE(std::filesystem::is_empty(dir.path() / "spool"));
}

TEST_F(store_actor_test, dead_subscribers_are_forgotten) {
  auto sub = sys.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](atom::pointer_moved, const std::string&, const pointer_record&) {}};
  });
  self->send(actor, atom::subscribe_v, pool, sub);
  sched.run();
  caf::anon_send_exit(sub, caf::exit_reason::user_shutdown);
  sched.run();
  auto v0 = full_version("r", 0, {{"w", random_bytes(100, 1)}});
  ASSERT_TRUE(put(*backend, pool, v0));
  ASSERT_TRUE(backend->claim(pool, v0.m.ref));
  self->send(actor, atom::notify_v, pool);
  EXPECT_EQ(sched.run(), 1u) << "nothing is delivered to the dead subscriber";
}

} // namespace
} // namespace stitch
