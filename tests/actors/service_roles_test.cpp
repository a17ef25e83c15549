// The publisher, status and rollout-driver actors on CAF's deterministic
// scheduler, their failure paths stepped exactly: publishes that conflict,
// rewind or lack the token, streamed sessions refused or dropped when idle,
// collections pinned by (or waiting on) the version directory; replicas and
// gateways that die under the status actor; rollout requests refused.

#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <nlohmann/json.hpp>

#include "actors/executors.hpp"
#include "actors/fakes.hpp"
#include "actors/gateway.hpp"
#include "actors/publisher.hpp"
#include "actors/rollout_driver.hpp"
#include "actors/status.hpp"
#include "node/system_config.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/store/rocksdb_store.hpp"
#include "store/store_fixtures.hpp"

namespace stitch {
namespace {

using namespace std::chrono_literals;
using testing::deterministic;
using testing::manual_executor;
using testing::random_bytes;
using testing::temp_dir;

/// A ready replica `id` of pool "default", serving version `v` of "run".
replica_info ready_replica(const std::string& id, uint64_t v) {
  replica_info info;
  info.replica_id = id;
  info.pool = "default";
  info.ready = true;
  info.applied = version_ref{"run", v};
  info.serving = v;
  return info;
}

class actor_fixture : public ::testing::Test {
protected:
  actor_fixture()
      : sys(deterministic(cfg)), self(sys, true),
        sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {}

  /// The next answer to `self`: its text, "error: ..." or "(none)".
  template <class T>
  std::optional<T> answer(std::string* error_text = nullptr) {
    std::optional<T> out;
    self->receive([&](T& x) { out = std::move(x); },
                  [&](const caf::error& e) {
                    if (error_text)
                      *error_text = sys.render(e);
                  },
                  caf::after(0s) >>
                    [&] {
                      if (error_text)
                        *error_text = "(none)";
                    });
    return out;
  }

  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scoped_actor self;
  caf::scheduler::test_coordinator& sched;
};

// -- publisher ----------------------------------------------------------------

pipeline::tensor_set small_model(uint32_t seed) {
  pipeline::tensor_set w;
  for (auto [name, n] : {std::pair{"a.weight", 4096}, std::pair{"b.weight", 2048}}) {
    auto& t = w[name];
    t.name = name;
    t.type = safetensors::dtype::f32;
    t.shape = {static_cast<uint64_t>(n) / 4};
    t.bytes = random_bytes(static_cast<size_t>(n), seed++);
  }
  return w;
}

/// Answers `in_use` with a fixed set, or never (when `silent`).
struct directory_state {
  std::vector<version_ref> used;
  bool silent = false;
  std::vector<caf::typed_response_promise<std::vector<version_ref>>> held;
};

version_directory_actor::behavior_type
fake_directory(version_directory_actor::stateful_pointer<directory_state> self,
               std::vector<version_ref> used, bool silent) {
  self->state.used = std::move(used);
  self->state.silent = silent;
  return {
    [self](atom::in_use, const std::string&) -> caf::result<std::vector<version_ref>> {
      if (self->state.silent) {
        auto p = self->make_response_promise<std::vector<version_ref>>();
        self->state.held.push_back(p);
        return p;
      }
      return self->state.used;
    },
  };
}

class publisher_actor_test : public actor_fixture {
protected:
  publisher_actor_test() {
    auto opened = store::open_rocksdb_store((dir.path() / "db").string());
    EXPECT_TRUE(opened);
    backend = std::shared_ptr<store_backend>{std::move(*opened)};
  }
  ~publisher_actor_test() override {
    if (publisher)
      caf::anon_send_exit(publisher, caf::exit_reason::user_shutdown);
    if (directory)
      caf::anon_send_exit(directory, caf::exit_reason::user_shutdown);
    sched.run();
    workers->run_all();
  }

  void start(std::string token = {}, publisher_limits limits = {}, size_t keep = 0,
             std::vector<version_ref> used = {}, bool silent = false, uint32_t anchor_every = 10) {
    publisher_retention retention;
    retention.keep_last = keep;
    if (keep > 0 || silent) {
      directory = sys.spawn(fake_directory, std::move(used), silent);
      retention.directory = directory;
    }
    pipeline::publisher_options po;
    po.scratch_dir = dir.path() / "scratch";
    po.anchor_every = anchor_every;
    publisher = sys.spawn(publisher_service, backend, store_actor{}, po, workers, std::move(token),
                          limits, retention, publisher_lending{});
    sched.run();
  }

  /// Runs messages and worker jobs until both are idle.
  void settle() {
    for (;;) {
      size_t n = sched.run();
      n += workers->run_all();
      if (n == 0)
        return;
    }
  }

  std::string write(uint64_t v, const pipeline::tensor_set& w) {
    auto path = dir.path() / ("v" + std::to_string(v));
    EXPECT_TRUE(pipeline::write_hf_directory(path, w));
    return path.string();
  }

  /// Opens a streamed session of one small tensor (its piece buffers'
  /// warm-up run, its publish queued on the workers); its id.
  std::optional<uint64_t> open_session() {
    publish_args args;
    args.run_id = "r";
    std::vector<pipeline::tensor_header> one{{"a", safetensors::dtype::f32, {2}, 8}};
    self->send(publisher, atom::publish_v, args, one);
    sched.run();
    EXPECT_TRUE(workers->run_one()); // the piece buffers' warm-up
    sched.run();
    std::string err;
    auto id = answer<uint64_t>(&err);
    EXPECT_TRUE(id) << err;
    return id;
  }

  /// Publishes `w` as `run`/`v` from a directory; the summary or the error text.
  std::string publish(uint64_t v, const pipeline::tensor_set& w, std::string token = {},
                      std::string run = "r") {
    publish_args args;
    args.run_id = run;
    args.version = v;
    args.token = std::move(token);
    self->send(publisher, atom::publish_v, args, write(v, w));
    settle();
    std::string err;
    auto s = answer<pipeline::publish_report>(&err);
    if (!s)
      return "error: " + err;
    // The answer carries the figures, not the manifest (replicas and
    // exports read that from the store).
    EXPECT_GT(s->raw_bytes, 0u);
    EXPECT_TRUE(s->published.tensor_specs.empty() && s->published.checksums.empty());
    return s->kind == version_kind::full ? "full" : "delta";
  }

  temp_dir dir;
  std::shared_ptr<store_backend> backend;
  std::shared_ptr<manual_executor> workers = std::make_shared<manual_executor>();
  publisher_actor publisher;
  version_directory_actor directory;
};

TEST_F(publisher_actor_test, conflicts_rewinds_and_missing_tokens_are_refused) {
  start("secret");
  auto w = small_model(1);
  auto refused = publish(0, w);
  EXPECT_NE(refused.find("unauthorized"), std::string::npos) << refused;
  EXPECT_EQ(publish(0, w, "secret"), "full");
  // The same version with other bytes: refused, naming it.
  auto clash = publish(0, small_model(9), "secret");
  EXPECT_NE(clash.find("version_exists"), std::string::npos) << clash;
  auto w1 = w;
  w1["a.weight"].bytes[3] ^= std::byte{1};
  EXPECT_EQ(publish(1, w1, "secret"), "delta");
  EXPECT_EQ(publish(2, w1, "secret"), "delta");
  // Going back below the pointer is a rewind.
  auto back = publish(1, small_model(4), "secret");
  EXPECT_NE(back.find("error"), std::string::npos) << back;
  auto listed = backend->list_versions("default", "r");
  ASSERT_TRUE(listed);
  EXPECT_EQ(listed->size(), 3u);
  // A missing directory names itself.
  publish_args args;
  args.run_id = "r";
  args.version = 3;
  args.token = "secret";
  self->send(publisher, atom::publish_v, args, (dir.path() / "nope").string());
  settle();
  std::string err;
  EXPECT_FALSE(answer<pipeline::publish_report>(&err));
  EXPECT_NE(err.find("nope"), std::string::npos) << err;
}

TEST_F(publisher_actor_test, only_its_own_node_says_where_its_http_surface_listens) {
  start("secret");
  auto url = [&] {
    self->send(publisher, atom::server_info_v);
    sched.run();
    return answer<std::string>().value_or("(none)");
  };
  self->send(publisher, atom::server_info_v, std::string{"http://127.0.0.1:7000"});
  sched.run();
  EXPECT_EQ(url(), "http://127.0.0.1:7000");
  // An anonymous message (as one from another node can arrive) would have
  // `stitch publish --stream` send the admin token elsewhere: ignored.
  caf::anon_send(publisher, atom::server_info_v, std::string{"http://attacker:9"});
  sched.run();
  EXPECT_EQ(url(), "http://127.0.0.1:7000");
}

TEST_F(publisher_actor_test, streamed_sessions_are_bounded_checked_and_dropped_when_idle) {
  publisher_limits limits;
  limits.max_sessions = 1;
  limits.session_idle_timeout = 0s;
  start({}, limits);
  publish_args args;
  args.run_id = "r";
  std::vector<pipeline::tensor_header> bad{{"b", safetensors::dtype::f32, {2}, 8},
                                           {"a", safetensors::dtype::f32, {2}, 8}};
  self->send(publisher, atom::publish_v, args, bad);
  settle();
  std::string err;
  EXPECT_FALSE(answer<uint64_t>(&err));
  EXPECT_NE(err.find("invalid_argument"), std::string::npos) << err;
  std::vector<pipeline::tensor_header> good{{"a", safetensors::dtype::f32, {2}, 8}};
  self->send(publisher, atom::publish_v, args, good);
  sched.run();
  // The id comes once the session's piece buffers are warm (the first job on
  // the workers; the publish itself, next in line, waits for bytes).
  EXPECT_FALSE(answer<uint64_t>(&err));
  ASSERT_TRUE(workers->run_one());
  sched.run();
  auto id = answer<uint64_t>(&err);
  ASSERT_TRUE(id) << err;
  // One session at a time.
  self->send(publisher, atom::publish_v, args, good);
  sched.run();
  EXPECT_FALSE(answer<uint64_t>(&err));
  EXPECT_NE(err.find("too many publishes"), std::string::npos) << err;
  EXPECT_NE(err.find("busy"), std::string::npos) << err; // retryable: nothing started
  // Its client goes silent: the sweep drops it, and nothing becomes visible.
  sched.advance_time(1s);
  self->send(publisher, atom::tick_v);
  sched.run();
  settle();
  self->send(publisher, atom::finish_v, *id);
  settle();
  EXPECT_FALSE(answer<pipeline::publish_report>(&err));
  EXPECT_NE(err.find("not_found"), std::string::npos) << err;
  auto listed = backend->list_versions("default", "r");
  EXPECT_TRUE(!listed || listed->empty());
}

TEST_F(publisher_actor_test, streamed_session_ids_cannot_be_guessed) {
  start();
  auto a = open_session();
  ASSERT_TRUE(a);
  // (Aborted, and its publish run, before the next: a publish waiting for
  // bytes would hold the test's one worker.)
  self->send(publisher, atom::abort_v, *a);
  sched.run();
  ASSERT_TRUE(workers->run_one());
  auto b = open_session();
  ASSERT_TRUE(b);
  self->send(publisher, atom::abort_v, *b);
  sched.run();
  ASSERT_TRUE(workers->run_one());
  EXPECT_NE(*a + 1, *b) << "sequential session ids";
  EXPECT_GT(std::max(*a, *b), uint64_t{1} << 32);
}

TEST_F(publisher_actor_test, an_aborted_session_frees_its_slot_before_its_publish_has_run) {
  // A session aborted while its publish waits for its turn (behind a long
  // publish to its pool) gives its slot back at once, not when that turn
  // comes.
  publisher_limits limits;
  limits.max_sessions = 1;
  start({}, limits);
  auto first = open_session();
  ASSERT_TRUE(first);
  // Its publish is queued on the workers, not run.
  self->send(publisher, atom::abort_v, *first);
  sched.run();
  publish_args other;
  other.pool = "other";
  other.run_id = "r";
  self->send(publisher, atom::publish_v, other,
             std::vector<pipeline::tensor_header>{{"a", safetensors::dtype::f32, {2}, 8}});
  sched.run();
  std::string err;
  EXPECT_FALSE(answer<uint64_t>(&err));
  EXPECT_EQ(err, "(none)") << "refused while the aborted session's publish was queued";
  // The workers run the aborted publish (it fails at once: its stream is
  // closed), then the new session's warm-up. (Not `settle`: the new
  // session's publish would wait for bytes.)
  ASSERT_TRUE(workers->run_one());
  ASSERT_TRUE(workers->run_one());
  sched.run();
  auto second = answer<uint64_t>(&err);
  ASSERT_TRUE(second) << err;
  EXPECT_NE(*second, *first);
  // The aborted publish ran and failed; nothing of it is visible.
  self->send(publisher, atom::finish_v, *first);
  sched.run();
  EXPECT_FALSE(answer<pipeline::publish_report>(&err));
  EXPECT_NE(err.find("not_found"), std::string::npos) << err;
  auto listed = backend->list_versions("default", "r");
  EXPECT_TRUE(!listed || listed->empty());
}

TEST_F(publisher_actor_test, a_publisher_that_stops_ends_the_publishes_waiting_for_bytes) {
  start();
  ASSERT_TRUE(open_session());
  // The node stops: the publish on a worker, waiting for bytes no client
  // will send now, ends at once (it would wait forever otherwise) and
  // leaves nothing visible.
  caf::anon_send_exit(publisher, caf::exit_reason::user_shutdown);
  sched.run();
  publisher = publisher_actor{};
  workers->run_all();
  auto listed = backend->list_versions("default", "r");
  EXPECT_TRUE(!listed || listed->empty());
}

TEST_F(publisher_actor_test, collections_after_publishes_keep_what_the_directory_pins) {
  // Keep 1, an anchor every 2 versions; a replica still serves version 1.
  start({}, {}, 1, {version_ref{"r", 1}}, false, 2);
  auto w = small_model(1);
  for (uint64_t v = 0; v < 5; ++v) {
    w["b.weight"].bytes[v] ^= std::byte{2};
    EXPECT_EQ(publish(v, w), v % 2 == 0 ? "full" : "delta") << v;
  }
  settle();
  auto listed = backend->list_versions("default", "r");
  ASSERT_TRUE(listed);
  std::vector<uint64_t> left;
  for (const auto& r : *listed)
    left.push_back(r.version);
  // The boot (0), the pinned 1 (whose chain is the boot) and the newest (4,
  // an anchor); 2 and 3 are gone.
  EXPECT_EQ(left, (std::vector<uint64_t>{0, 1, 4}));
  // gc on demand says why each stays.
  self->send(publisher, atom::collect_v, std::string{"default"}, uint32_t{0}, true, std::string{});
  settle();
  auto report = answer<retention_report>();
  ASSERT_TRUE(report);
  EXPECT_TRUE(report->deleted.empty());
  std::map<uint64_t, keep_reason> why;
  for (const auto& e : report->kept)
    why[e.ref.version] = e.why;
  EXPECT_EQ(why, (std::map<uint64_t, keep_reason>{
                   {0, keep_reason::boot}, {1, keep_reason::pinned}, {4, keep_reason::pinned}}));
}

TEST_F(publisher_actor_test, a_directory_that_does_not_answer_means_nothing_is_collected) {
  start({}, {}, 1, {}, true);
  auto w = small_model(1);
  for (uint64_t v = 0; v < 3; ++v) {
    w["b.weight"].bytes[v] ^= std::byte{2};
    publish(v, w);
  }
  sched.trigger_timeouts();
  settle();
  auto listed = backend->list_versions("default", "r");
  ASSERT_TRUE(listed);
  EXPECT_EQ(listed->size(), 3u) << "nothing deleted without knowing what replicas use";
  self->send(publisher, atom::collect_v, std::string{}, uint32_t{1}, false, std::string{});
  settle();
  sched.trigger_timeouts();
  settle();
  std::string err;
  EXPECT_FALSE(answer<retention_report>(&err));
  EXPECT_NE(err.find("nothing was collected"), std::string::npos) << err;
}

// -- status -------------------------------------------------------------------

class status_actor_test : public actor_fixture {
protected:
  ~status_actor_test() override {
    caf::anon_send_exit(status, caf::exit_reason::user_shutdown);
    sched.run();
  }

  nlohmann::json view() {
    self->send(status, atom::status_view_v);
    sched.run();
    auto snapshot = answer<status_snapshot>();
    EXPECT_TRUE(snapshot);
    return nlohmann::json::parse(snapshot ? status_json(*snapshot) : "{}");
  }

  status_actor status = sys.spawn(status_service, status_options{}, store_actor{});
};

TEST_F(status_actor_test, follows_replicas_until_they_die_and_shows_the_cluster) {
  replica_info info = ready_replica("r0", 4);
  info.state = sync_state::staging;
  info.pointer = version_ref{"run", 6};
  auto replica = sys.spawn(testing::scripted_replica, info, testing::generate_script{},
                           std::function<void(uint64_t)>{});
  self->send(status, atom::enroll_v, std::string{"default"}, replica, std::string{});
  sched.run();
  self->send(status, atom::pointer_moved_v, std::string{"default"},
             pointer_record{version_ref{"run", 6}, 0});
  cluster_view cluster;
  experiment_status e;
  e.run_id = "run";
  e.last_step = step_report{3, 6, 0.25, 8, 1, 2, 40, 0};
  cluster.experiments.push_back(e);
  self->send(status, atom::cluster_view_v, cluster, std::string{});
  sched.run();
  auto j = view();
  ASSERT_EQ(j["replicas"].size(), 1u);
  EXPECT_EQ(j["replicas"][0]["applied"], "run/weight_v000004");
  EXPECT_EQ(j["replicas"][0]["sync_state"], "STAGING");
  ASSERT_EQ(j["transfers"].size(), 1u);
  EXPECT_EQ(j["transfers"][0]["to"], "run/weight_v000006");
  EXPECT_EQ(j["pools"][0]["pointer"], "run/weight_v000006");
  EXPECT_EQ(j["experiments"][0]["last_step"]["reward"], 0.25);
  // The replica dies: the status forgets it.
  caf::anon_send_exit(replica, caf::exit_reason::kill);
  sched.run();
  EXPECT_TRUE(view()["replicas"].empty());
}

TEST_F(actor_fixture, gateways_and_status_take_replicas_only_with_the_member_capability) {
  replica_info info = ready_replica("intruder", 9);
  auto foreign = sys.spawn(testing::scripted_replica, info, testing::generate_script{},
                           std::function<void(uint64_t)>{});
  gateway_options go;
  go.member_token = "member-cap";
  auto gateway = sys.spawn(gateway_service, go);
  status_options so;
  so.member_token = "member-cap";
  auto status = sys.spawn(status_service, so, store_actor{});
  auto pool_view = [&] {
    self->send(gateway, atom::pool_view_v, std::string{});
    sched.run();
    return answer<std::vector<replica_info>>().value_or(std::vector<replica_info>{});
  };
  auto shown = [&] {
    self->send(status, atom::status_view_v);
    sched.run();
    auto snapshot = answer<status_snapshot>();
    return snapshot ? snapshot->replicas.size() : size_t{999};
  };
  // Enrolled without the capability (or with a wrong one), a foreign
  // replica would answer rollout clients: neither actor takes it, and a
  // forged cluster view is not shown.
  self->send(gateway, atom::enroll_v, std::string{"default"}, foreign, std::string{});
  self->send(status, atom::enroll_v, std::string{"default"}, foreign, std::string{"member-caq"});
  cluster_view forged;
  forged.experiments.push_back(experiment_status{});
  forged.experiments.back().run_id = "forged";
  self->send(status, atom::cluster_view_v, forged, std::string{});
  sched.run();
  EXPECT_TRUE(pool_view().empty());
  EXPECT_EQ(shown(), 0u);
  self->send(status, atom::status_view_v);
  sched.run();
  auto snapshot = answer<status_snapshot>();
  ASSERT_TRUE(snapshot);
  EXPECT_FALSE(snapshot->cluster) << "a forged cluster view was taken";
  // With it, both do; a removal without it is ignored.
  self->send(gateway, atom::enroll_v, std::string{"default"}, foreign, std::string{"member-cap"});
  self->send(status, atom::enroll_v, std::string{"default"}, foreign, std::string{"member-cap"});
  sched.run();
  EXPECT_EQ(pool_view().size(), 1u);
  EXPECT_EQ(shown(), 1u);
  self->send(gateway, atom::retire_v, foreign, std::string{"nope"});
  sched.run();
  EXPECT_EQ(pool_view().size(), 1u);
  self->send(gateway, atom::retire_v, foreign, std::string{"member-cap"});
  sched.run();
  EXPECT_TRUE(pool_view().empty());
  // A replica state from an actor that is not the enrolled replica counts
  // nowhere.
  self->send(gateway, atom::enroll_v, std::string{"default"}, foreign, std::string{"member-cap"});
  sched.run();
  info.applied = version_ref{"run", 99};
  info.serving = 99;
  self->send(gateway, atom::replica_state_v, info);
  self->send(status, atom::replica_state_v, info);
  sched.run();
  for (const auto& r : pool_view())
    EXPECT_NE(r.serving, 99u);
  for (const auto& a : {caf::actor_cast<caf::actor>(gateway), caf::actor_cast<caf::actor>(status),
                        caf::actor_cast<caf::actor>(foreign)})
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_F(status_actor_test, metrics_answer_even_when_a_gateway_died_or_hangs) {
  auto hung = sys.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {
      [](atom::stats) -> caf::result<gateway_stats> { return caf::delegated<gateway_stats>{}; }};
  });
  auto dead = sys.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](atom::stats) { return gateway_stats{}; }};
  });
  self->send(status, atom::enroll_v, caf::actor_cast<gateway_actor>(hung), std::string{});
  self->send(status, atom::enroll_v, caf::actor_cast<gateway_actor>(dead), std::string{});
  sched.run();
  caf::anon_send_exit(dead, caf::exit_reason::kill);
  sched.run();
  self->send(status, atom::metrics_v);
  sched.run();
  EXPECT_FALSE(answer<std::string>()) << "waits for the hung gateway";
  // The hung gateway's request times out: the metrics come anyway.
  sched.trigger_timeouts();
  sched.run();
  auto text = answer<std::string>();
  ASSERT_TRUE(text);
  EXPECT_NE(text->find("stitch_stage_seconds"), std::string::npos);
  caf::anon_send_exit(hung, caf::exit_reason::kill);
  sched.run();
}

// -- rollout driver -------------------------------------------------------------

class rollout_driver_test : public actor_fixture {
protected:
  ~rollout_driver_test() override {
    caf::anon_send_exit(driver, caf::exit_reason::user_shutdown);
    sched.run();
  }
  std::shared_ptr<manual_executor> workers = std::make_shared<manual_executor>();
  rollout_driver_actor driver = sys.spawn(rollout_driver, workers);
};

TEST_F(rollout_driver_test, refuses_bad_requests_and_reports_an_unreachable_gateway) {
  std::string err;
  self->send(driver, atom::rollouts_v, rollout_request{"127.0.0.1", 9, "default", 0, 0, 0});
  sched.run();
  EXPECT_FALSE(answer<std::vector<engine::rollout_result>>(&err));
  EXPECT_NE(err.find("count"), std::string::npos) << err;
  self->send(driver, atom::rollouts_v, rollout_request{"", 0, "default", 0, 4, 0});
  sched.run();
  EXPECT_FALSE(answer<std::vector<engine::rollout_result>>(&err));
  EXPECT_NE(err.find("no gateway"), std::string::npos) << err;
  self->send(driver, atom::rollouts_v, rollout_request{"127.0.0.1", 1, "default", 0, 2, 0});
  sched.run();
  EXPECT_EQ(workers->size(), 1u);
  workers->run_all();
  sched.run();
  auto results = answer<std::vector<engine::rollout_result>>(&err);
  ASSERT_TRUE(results) << err;
  ASSERT_EQ(results->size(), 2u);
  for (const auto& r : *results) {
    EXPECT_FALSE(r.ok);
    EXPECT_FALSE(r.error.empty());
  }
}

} // namespace
} // namespace stitch
