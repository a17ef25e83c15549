// The coordinator and node agents on CAF's deterministic scheduler: real
// actors, with the node's hooks and the replicas, publisher and gateway
// replaced by small fakes, so each failure path (a node lost mid-placement,
// a refused resubmit, a failed boot publish, a replica that goes down, a
// trainer that cannot start, a silent member) is stepped exactly.

#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <map>
#include <memory>
#include <set>
#include <thread>

#include "actors/coordinator.hpp"
#include "actors/fakes.hpp"
#include "actors/gateway_actor.hpp"
#include "actors/node_agent.hpp"
#include "actors/publisher_actor.hpp"
#include "node/system_config.hpp"

namespace stitch {
namespace {

using namespace std::chrono_literals;
using testing::deterministic;

/// A publisher whose boot publishes succeed or fail as told.
struct fake_publisher_state {
  std::shared_ptr<bool> fail;
};

publisher_actor::behavior_type
fake_publisher(publisher_actor::stateful_pointer<fake_publisher_state> self,
               std::shared_ptr<bool> fail) {
  self->state.fail = std::move(fail);
  auto answer = [self]() -> caf::result<pipeline::publish_report> {
    if (*self->state.fail)
      return to_caf_error({errc::backend_failure, "the disk is full"});
    pipeline::publish_report s;
    s.claimed = true;
    return s;
  };
  return {
    [answer](atom::publish, const publish_args&, const std::string&) { return answer(); },
    [answer](atom::init_model, const publish_args&, const std::string&, uint64_t) {
      return answer();
    },
    [](atom::publish, const publish_args&, std::vector<pipeline::tensor_header>&) -> uint64_t {
      return 0;
    },
    [](atom::chunk, uint64_t, stitch::shared_piece&) -> uint64_t { return 0; },
    [](atom::finish, uint64_t) -> caf::result<pipeline::publish_report> {
      return to_caf_error({errc::not_found, "no session"});
    },
    [](atom::abort, uint64_t) {},
    [](atom::collect, const std::string&, uint32_t, bool, const std::string&) -> retention_report {
      return {};
    },
    [](atom::collect, const std::string&, const std::vector<std::string>&,
       const std::string&) -> retention_report { return {}; },
    [](atom::offer, const version_ref&, bool, const std::string&) -> caf::result<peer_offer> {
      return to_caf_error({errc::not_found, "lends nothing"});
    },
    [](atom::server_info) { return std::string{}; },
    [](atom::server_info, const std::string&) {},
    [](atom::release, uint64_t) {},
    [](atom::done, uint64_t) {},
    [](atom::tick) {},
  };
}

/// What a node's hooks saw, and how they behave.
struct node_log {
  std::vector<placement> spawned;
  std::vector<std::string> gone;
  std::vector<std::string> trainers;
  /// Spawning fails with this (empty: succeeds).
  std::string spawn_error;
  /// The replicas report this applied version.
  std::optional<version_ref> applied;
  bool trainer_fails = false;
  /// Joins after the first (the agent re-enrolls the node's roles on each).
  int rejoins = 0;
};

/// Gateways see enrolls and retires: recorded as text.
struct recorder_state {
  std::shared_ptr<std::vector<std::string>> seen;
};

gateway_actor::behavior_type recorder(gateway_actor::stateful_pointer<recorder_state> self,
                                      std::shared_ptr<std::vector<std::string>> seen) {
  self->state.seen = std::move(seen);
  return {
    [self](atom::enroll, const std::string& pool, const replica_actor&, const std::string&) {
      self->state.seen->push_back("enroll " + pool);
    },
    [self](atom::retire, const replica_actor&, const std::string&) {
      self->state.seen->push_back("retire");
    },
    [](atom::generate, std::string&, std::string&, replica_call&) -> replica_answer { return {}; },
    [](atom::cancel, uint64_t) {},
    [](atom::wake, const std::string&) {},
    [](atom::pool_view, const std::string&) { return std::vector<replica_info>{}; },
    [](atom::stats) { return gateway_stats{}; },
    [](atom::replica_state, const replica_info&) {},
    [](atom::event, uint64_t, const std::string&) {},
  };
}

class cluster_roles_test : public ::testing::Test {
protected:
  cluster_roles_test()
      : sys(deterministic(cfg)), self(sys, true),
        sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {}

  ~cluster_roles_test() override {
    for (auto& [name, a] : agents)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    if (coord)
      caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    if (publisher)
      caf::anon_send_exit(publisher, caf::exit_reason::user_shutdown);
    if (gateway)
      caf::anon_send_exit(gateway, caf::exit_reason::user_shutdown);
    sched.run();
  }

  void start(coordinator_options o = {}) {
    o.heartbeat_timeout = o.heartbeat_timeout == 3000ms ? 60s : o.heartbeat_timeout;
    cap = o.member_token;
    coord = sys.spawn(coordinator, o);
    publisher = sys.spawn(fake_publisher, publish_fails);
    gateway = sys.spawn(recorder, gateway_seen);
    self->send(coord, atom::enroll_v, std::string{"publisher"},
               caf::actor_cast<caf::actor>(publisher), cap);
    self->send(coord, atom::enroll_v, std::string{"gateway"}, caf::actor_cast<caf::actor>(gateway),
               cap);
    sched.run();
  }

  /// A node named `name` with replica slots `slots` joins.
  node_log& join(const std::string& name, std::vector<uint32_t> slots,
                 std::vector<std::string> roles = {"replica"}, std::string gateway = {}) {
    auto log = std::make_shared<node_log>();
    logs[name] = log;
    node_agent_hooks hooks;
    hooks.spawn_replica = [this, log](const placement& p,
                                      const experiment_spec&) -> result<replica_actor> {
      log->spawned.push_back(p);
      if (!log->spawn_error.empty())
        return make_error(errc::engine_unavailable, log->spawn_error);
      replica_info info;
      info.replica_id = p.replica_id;
      info.pool = p.pool;
      info.ready = log->applied.has_value();
      info.applied = log->applied;
      if (log->applied)
        info.serving = log->applied->version;
      return sys.spawn(testing::scripted_replica, info, testing::generate_script{},
                       std::function<void(uint64_t)>{});
    };
    hooks.replica_gone = [log](const std::string& id) { log->gone.push_back(id); };
    hooks.start_trainer = [log](const experiment_spec& spec, const std::string&,
                                node_agent_actor) -> status {
      log->trainers.push_back(spec.run_id);
      if (log->trainer_fails)
        return make_error(errc::invalid_argument, "no GPU for the trainer");
      return {};
    };
    hooks.stop_trainer = [](const std::string&) {};
    hooks.rejoined = [log] { ++log->rejoins; };
    member_info me{name, std::move(roles), std::move(slots), std::move(gateway)};
    coordinator_address where;
    where.member_token = cap;
    agents[name] = sys.spawn(node_agent, me, coord, hooks, where);
    sched.run();
    return *log;
  }

  experiment_spec spec(const std::string& run, uint32_t replicas, bool trainer = false) {
    experiment_spec s;
    s.run_id = run;
    s.replicas = replicas;
    s.trainer.enabled = trainer;
    return s;
  }

  /// Asks the coordinator; the answer's text or the error's.
  template <class... Ts>
  std::string ask(Ts... xs) {
    self->send(coord, xs...);
    sched.run();
    std::string out = "(no answer)";
    self->receive([&](const std::string& s) { out = s; },
                  [&](const caf::error& e) { out = "error: " + sys.render(e); },
                  caf::after(0s) >> [] {});
    return out;
  }

  cluster_view view() {
    self->send(coord, atom::cluster_view_v);
    sched.run();
    cluster_view out;
    self->receive([&](const cluster_view& v) { out = v; },
                  caf::after(0s) >> [&] { ADD_FAILURE() << "no cluster view"; });
    return out;
  }

  std::vector<version_ref> in_use(const std::string& pool) {
    self->send(coord, atom::in_use_v, pool);
    sched.run();
    std::vector<version_ref> out;
    self->receive([&](const std::vector<version_ref>& v) { out = v; },
                  caf::after(0s) >> [&] { ADD_FAILURE() << "no in_use answer"; });
    return out;
  }

  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scoped_actor self;
  caf::scheduler::test_coordinator& sched;
  coordinator_actor coord;
  publisher_actor publisher;
  gateway_actor gateway;
  std::shared_ptr<bool> publish_fails = std::make_shared<bool>(false);
  std::shared_ptr<std::vector<std::string>> gateway_seen =
    std::make_shared<std::vector<std::string>>();
  std::map<std::string, node_agent_actor> agents;
  std::map<std::string, std::shared_ptr<node_log>> logs;
  /// The member capability the fixture's nodes present.
  std::string cap;
};

TEST_F(cluster_roles_test, a_member_message_without_the_member_capability_changes_nothing) {
  coordinator_options o;
  o.admin_token = "admin";
  o.member_token = "member-cap";
  start(o);
  auto& n1 = join("n1", {0, 1});
  ASSERT_NE(ask(atom::submit_v, spec("r", 1), std::string{"admin"}).find("submitted"),
            std::string::npos);
  ASSERT_EQ(n1.spawned.size(), 1u);
  auto placed = view().experiments.at(0).replicas.at(0).replica_id;
  auto seen_before = gateway_seen->size();
  ASSERT_GE(seen_before, 1u) << "the gateway learnt of the placed replica";

  // A stranger's node joins: refused with the reason, and not a member.
  member_info intruder{"intruder", {"replica"}, {0, 1, 2, 3}, ""};
  self->send(coord, atom::join_v, intruder, member_holdings{}, agents.at("n1"),
             std::string{"guess"});
  sched.run();
  std::string refusal;
  self->receive([&](uint64_t) { refusal = "joined"; },
                [&](const caf::error& e) { refusal = sys.render(e); }, caf::after(0s) >> [] {});
  EXPECT_NE(refusal.find("member capability"), std::string::npos) << refusal;
  for (const auto& m : view().nodes)
    EXPECT_NE(m.name, "intruder");

  // Its gateway does not enroll (it would hear of every replica), its
  // replica-down report does not make the coordinator place a replica
  // again, its trainer report is dropped.
  auto their_seen = std::make_shared<std::vector<std::string>>();
  auto their_gateway = sys.spawn(recorder, their_seen);
  self->send(coord, atom::enroll_v, std::string{"gateway"},
             caf::actor_cast<caf::actor>(their_gateway), std::string{});
  self->send(coord, atom::replica_down_v, placed, std::string{});
  sched.run();
  sched.trigger_timeouts();
  sched.run();
  EXPECT_EQ(n1.spawned.size(), 1u) << "no replacement placed for a forged replica_down";
  EXPECT_TRUE(their_seen->empty()) << "an unenrolled gateway heard of replicas";

  // A forged offer does not list a holder; a lookup without the capability
  // is refused.
  auto lend = sys.spawn(testing::scripted_replica, replica_info{}, testing::generate_script{},
                        std::function<void(uint64_t)>{});
  self->send(coord, atom::offer_v, std::string{"default"}, version_ref{"r", 0},
             std::string{"fake-holder"}, std::string{"n1"},
             caf::actor_cast<peer_holder_actor>(lend), false, std::string{"nope"});
  self->send(coord, atom::lookup_v, std::string{"default"}, version_ref{"r", 0},
             std::string{"receiver"}, std::string{"n1"}, false, std::string{"member-cap"});
  sched.run();
  std::vector<holder_entry> listed;
  self->receive([&](const std::vector<holder_entry>& h) { listed = h; },
                [&](const caf::error& e) { ADD_FAILURE() << sys.render(e); },
                caf::after(0s) >> [] { ADD_FAILURE() << "no lookup answer"; });
  for (const auto& h : listed)
    EXPECT_NE(h.replica_id, "fake-holder");
  self->send(coord, atom::lookup_v, std::string{"default"}, version_ref{"r", 0},
             std::string{"receiver"}, std::string{"n1"}, false, std::string{});
  sched.run();
  bool refused = false;
  self->receive([&](const std::vector<holder_entry>&) {},
                [&](const caf::error&) { refused = true; }, caf::after(0s) >> [] {});
  EXPECT_TRUE(refused) << "a lookup without the capability was answered";

  // The node agent takes placements and retires from the coordinator only.
  self->send(agents.at("n1"), atom::spawn_v, placement{"x-0", "r", "default", "n1", 1},
             spec("r", 1), std::string{"wrong"});
  self->send(agents.at("n1"), atom::retire_v, placed, std::string{});
  sched.run();
  EXPECT_EQ(n1.spawned.size(), 1u) << "a forged placement spawned a replica";
  EXPECT_TRUE(n1.gone.empty()) << "a forged retire stopped a replica";

  // A forged state for the placed replica, from an actor the coordinator
  // did not subscribe to, does not move what retention keeps.
  auto before = in_use("default");
  replica_info forged;
  forged.replica_id = placed;
  forged.pool = "default";
  forged.applied = version_ref{"r", 42};
  self->send(coord, atom::replica_state_v, forged);
  sched.run();
  EXPECT_EQ(in_use("default"), before);

  // With the capability, the same messages work: the end of the replica is
  // heard and it is placed again.
  self->send(coord, atom::replica_down_v, placed, std::string{"member-cap"});
  sched.run();
  sched.trigger_timeouts();
  sched.run();
  EXPECT_EQ(n1.spawned.size(), 2u);
  caf::anon_send_exit(their_gateway, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(lend, caf::exit_reason::user_shutdown);
}

TEST_F(cluster_roles_test, submit_places_replicas_enrolls_them_and_reports_their_state) {
  start();
  auto& n1 = join("n1", {0, 1});
  n1.applied = version_ref{"r", 0};
  auto answer = ask(atom::submit_v, spec("r", 2), std::string{});
  EXPECT_NE(answer.find("submitted r to pool default"), std::string::npos) << answer;
  ASSERT_EQ(n1.spawned.size(), 2u);
  EXPECT_EQ((std::set<uint32_t>{n1.spawned[0].slot, n1.spawned[1].slot}),
            (std::set<uint32_t>{0, 1}));
  EXPECT_EQ(*gateway_seen, (std::vector<std::string>{"enroll default", "enroll default"}));
  auto v = view();
  ASSERT_EQ(v.nodes.size(), 1u);
  EXPECT_EQ(v.nodes[0].name, "n1");
  ASSERT_EQ(v.experiments.size(), 1u);
  ASSERT_EQ(v.experiments[0].replicas.size(), 2u);
  for (const auto& r : v.experiments[0].replicas) {
    EXPECT_TRUE(r.up);
    EXPECT_TRUE(r.known);
    EXPECT_EQ(r.applied, (version_ref{"r", 0}));
  }
  ASSERT_EQ(v.directory.size(), 1u);
  EXPECT_EQ(v.directory[0].nodes, std::vector<std::string>{"n1"});
  // The directory retention asks: what replicas serve.
  EXPECT_EQ(in_use("default"), std::vector<version_ref>{(version_ref{"r", 0})});
  EXPECT_TRUE(in_use("other").empty());
}

TEST_F(cluster_roles_test, the_directory_hands_each_receiver_an_idle_primary_and_backups) {
  start();
  auto& n1 = join("n1", {0, 1});
  auto& n2 = join("n2", {0});
  n1.applied = version_ref{"r", 4};
  n2.applied = version_ref{"r", 4};
  ASSERT_NE(ask(atom::submit_v, spec("r", 3), std::string{}).find("submitted"), std::string::npos);
  ASSERT_EQ(n1.spawned.size() + n2.spawned.size(), 3u);
  auto lookup = [&](const version_ref& v, const std::string& receiver, const std::string& node,
                    bool frames = false) {
    self->send(coord, atom::lookup_v, std::string{"default"}, v, receiver, node, frames, cap);
    sched.run();
    std::vector<holder_entry> out;
    self->receive(
      [&](const std::vector<holder_entry>& hs) {
        for (const auto& h : hs)
          EXPECT_TRUE(h.handle) << h.replica_id;
        out = hs;
      },
      caf::after(0s) >> [&] { ADD_FAILURE() << "no lookup answer"; });
    return out;
  };
  const std::string on_n2 = n2.spawned.at(0).replica_id;
  // A receiver on n2 gets the n2 holder as its primary (all idle), the
  // others as backups; never itself.
  auto first = lookup({"r", 4}, "x", "n2");
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0].replica_id, on_n2);
  EXPECT_EQ(first[0].node, "n2");
  EXPECT_FALSE(first[0].backup);
  EXPECT_TRUE(first[1].backup);
  EXPECT_TRUE(first[2].backup);
  auto mine = lookup({"r", 4}, on_n2, "n2");
  ASSERT_EQ(mine.size(), 2u); // "x" is listed as fetching, but is no replica
  for (const auto& h : mine)
    EXPECT_NE(h.replica_id, on_n2);
  EXPECT_EQ(mine[0].node, "n1");
  // on_n2 serves x and one n1 replica serves on_n2: the idle one is next.
  auto third = lookup({"r", 4}, "y", "n1");
  ASSERT_FALSE(third.empty());
  EXPECT_NE(third[0].replica_id, on_n2);
  EXPECT_NE(third[0].replica_id, mine[0].replica_id);
  EXPECT_FALSE(third[0].backup);
  // x's fetch ended: on_n2 is idle again and first for a receiver on n2.
  self->send(coord, atom::done_v, std::string{"default"}, version_ref{"r", 4}, std::string{"x"},
             true, false, cap);
  sched.run();
  auto fourth = lookup({"r", 4}, "z", "n2");
  ASSERT_FALSE(fourth.empty());
  EXPECT_EQ(fourth[0].replica_id, on_n2);
  // Nobody holds another version or another pool's.
  EXPECT_TRUE(lookup({"r", 5}, "x", "n1").empty());
  self->send(coord, atom::lookup_v, std::string{"other"}, version_ref{"r", 4}, std::string{"x"},
             std::string{"n1"}, false, cap);
  sched.run();
  self->receive([&](const std::vector<holder_entry>& hs) { EXPECT_TRUE(hs.empty()); },
                caf::after(0s) >> [&] { ADD_FAILURE() << "no lookup answer"; });

  // Delta frames have a directory of their own: replicas holding version 4
  // in full hold none of its frames; a publisher lending version 5's
  // frames is listed for frames only, and a receiver that fetched them
  // serves the next one.
  EXPECT_TRUE(lookup({"r", 4}, "w", "n1", true).empty());
  auto lender = sys.spawn(testing::scripted_replica, replica_info{}, testing::generate_script{},
                          std::function<void(uint64_t)>{});
  self->send(coord, atom::offer_v, std::string{"default"}, version_ref{"r", 5},
             std::string{"publisher@n1"}, std::string{"n1"},
             caf::actor_cast<peer_holder_actor>(lender), true, cap);
  sched.run();
  EXPECT_TRUE(lookup({"r", 5}, "w", "n1").empty()) << "frames listed as full tensors";
  auto frames = lookup({"r", 5}, on_n2, "n2", true);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].replica_id, "publisher@n1");
  self->send(coord, atom::done_v, std::string{"default"}, version_ref{"r", 5}, on_n2, true, true,
             cap);
  sched.run();
  auto next = lookup({"r", 5}, "v", "n2", true);
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].replica_id, on_n2) << "a complete replica comes before the publisher";
  EXPECT_EQ(next[1].replica_id, "publisher@n1");
}

TEST_F(cluster_roles_test, resubmits_conflicts_and_missing_tokens_are_refused) {
  coordinator_options o;
  o.admin_token = "secret";
  start(o);
  join("n1", {0});
  auto no_token = ask(atom::submit_v, spec("r", 1), std::string{});
  EXPECT_NE(no_token.find("unauthorized"), std::string::npos) << no_token;
  EXPECT_NE(ask(atom::submit_v, spec("r", 1), std::string{"secret"}).find("submitted"),
            std::string::npos);
  auto again = ask(atom::submit_v, spec("r", 1), std::string{"secret"});
  EXPECT_NE(again.find("already active"), std::string::npos) << again;
  auto same_pool = ask(atom::submit_v, spec("r2", 1), std::string{"secret"});
  EXPECT_NE(same_pool.find("error"), std::string::npos) << same_pool;
  auto ghost = ask(atom::scale_v, std::string{"ghost"}, uint32_t{2}, std::string{"secret"});
  EXPECT_NE(ghost.find("error"), std::string::npos) << ghost;
  auto stop_no_token = ask(atom::stop_v, std::string{"r"}, std::string{"wrong"});
  EXPECT_NE(stop_no_token.find("unauthorized"), std::string::npos) << stop_no_token;
  EXPECT_EQ(view().experiments.size(), 1u);
}

TEST_F(cluster_roles_test, a_failed_boot_publish_rolls_the_experiment_back) {
  start();
  auto& n1 = join("n1", {0});
  *publish_fails = true;
  auto answer = ask(atom::submit_v, spec("r", 1), std::string{});
  EXPECT_NE(answer.find("was not published"), std::string::npos) << answer;
  EXPECT_NE(answer.find("the disk is full"), std::string::npos) << answer;
  EXPECT_TRUE(n1.spawned.empty());
  EXPECT_TRUE(view().experiments.empty());
  // The run can be submitted again once the publisher works.
  *publish_fails = false;
  EXPECT_NE(ask(atom::submit_v, spec("r", 1), std::string{}).find("submitted"), std::string::npos);
  EXPECT_EQ(n1.spawned.size(), 1u);
}

TEST_F(cluster_roles_test, a_node_lost_mid_placement_is_placed_again_on_another) {
  start();
  auto& n1 = join("n1", {0});
  n1.spawn_error = "the GPU fell off the bus";
  ask(atom::submit_v, spec("r", 1), std::string{});
  ASSERT_EQ(n1.spawned.size(), 1u);
  // The spawn failed: the coordinator tries again after a pause.
  sched.trigger_timeouts();
  sched.run();
  EXPECT_EQ(n1.spawned.size(), 2u);
  // The node dies; another joins and gets the replica.
  caf::anon_send_exit(agents.at("n1"), caf::exit_reason::kill);
  agents.erase("n1");
  sched.run();
  auto v = view();
  EXPECT_TRUE(v.nodes.empty());
  ASSERT_EQ(v.experiments.size(), 1u);
  EXPECT_FALSE(v.experiments[0].shortfall.empty());
  auto& n2 = join("n2", {3});
  ASSERT_EQ(n2.spawned.size(), 1u);
  EXPECT_EQ(n2.spawned[0].slot, 3u);
  EXPECT_EQ(n2.spawned[0].node, "n2");
  EXPECT_TRUE(view().experiments[0].shortfall.empty());
}

TEST_F(cluster_roles_test, a_replica_that_goes_down_is_replaced_and_a_retired_one_frees_its_slot) {
  start();
  auto& n1 = join("n1", {0, 1});
  ask(atom::submit_v, spec("r", 2), std::string{});
  ASSERT_EQ(n1.spawned.size(), 2u);
  // A replica dies: the agent reports it, the coordinator places it again.
  auto v = view();
  ASSERT_EQ(v.experiments[0].replicas.size(), 2u);
  self->send(coord, atom::replica_down_v, v.experiments[0].replicas[0].replica_id, std::string{});
  sched.run();
  EXPECT_EQ(n1.spawned.size(), 3u);
  // Scaling down retires a replica: it drains, leaves, and its slot is free.
  auto scaled = ask(atom::scale_v, std::string{"r"}, uint32_t{1}, std::string{});
  EXPECT_NE(scaled.find("1 draining"), std::string::npos) << scaled;
  EXPECT_EQ(n1.gone.size(), 1u) << "the agent saw its replica leave";
  EXPECT_EQ(view().experiments[0].replicas.size(), 1u);
  auto up = ask(atom::scale_v, std::string{"r"}, uint32_t{2}, std::string{});
  EXPECT_NE(up.find("1 placed"), std::string::npos) << up;
  EXPECT_EQ(n1.spawned.size(), 4u);
}

TEST_F(cluster_roles_test, a_trainer_without_a_gateway_or_that_cannot_start_is_reported_failed) {
  start();
  auto& n1 = join("n1", {0}, {"replica", "trainer"});
  // Refused up front: the trainer would have nowhere to sample.
  auto refused = ask(atom::submit_v, spec("r", 1, true), std::string{});
  EXPECT_NE(refused.find("no member hosts the role 'gateway'"), std::string::npos) << refused;
  EXPECT_TRUE(view().experiments.empty());
  EXPECT_TRUE(n1.trainers.empty());

  // With a gateway, the node's trainer hook refuses: the run shows why.
  auto& n2 = join("n2", {0}, {"replica", "trainer", "gateway"}, "127.0.0.1:8080");
  n1.trainer_fails = true;
  n2.trainer_fails = true;
  auto other = spec("s", 1, true);
  other.pool = "p2";
  auto submitted = ask(atom::submit_v, other, std::string{});
  EXPECT_NE(submitted.find("submitted"), std::string::npos) << submitted;
  ASSERT_EQ(n1.trainers.size() + n2.trainers.size(), 1u);
  std::string outcome;
  for (const auto& e : view().experiments)
    if (e.run_id == "s")
      outcome = e.trainer_outcome;
  EXPECT_NE(outcome.find("no GPU for the trainer"), std::string::npos) << outcome;
}

TEST_F(cluster_roles_test, a_member_missing_its_heartbeats_is_removed) {
  coordinator_options o;
  o.heartbeat_timeout = 1ms;
  start(o);
  join("n1", {0});
  ASSERT_EQ(view().nodes.size(), 1u);
  std::this_thread::sleep_for(5ms);
  // Its heartbeat check, as its own timer sends it (one from anyone else is
  // ignored).
  caf::send_as(coord, coord, atom::tick_v);
  sched.run();
  EXPECT_TRUE(view().nodes.empty());
  // Its next heartbeat is answered false: it is not a member any more.
  self->send(coord, atom::heartbeat_v, std::string{"n1"});
  sched.run();
  uint64_t epoch = 99;
  self->receive([&](uint64_t e) { epoch = e; }, caf::after(0s) >> [] {});
  EXPECT_EQ(epoch, 0u) << "0: not a member";
}

TEST_F(cluster_roles_test, a_removed_node_joins_again_and_enrolls_its_roles_again) {
  coordinator_options o;
  o.heartbeat_timeout = 1ms;
  start(o);
  auto& n1 = join("n1", {}, {"status"});
  EXPECT_EQ(n1.rejoins, 0);
  // A partition: its heartbeats stop long enough for the coordinator to
  // remove it, which drops the node's role handles...
  std::this_thread::sleep_for(5ms);
  // Its heartbeat check, as its own timer sends it (one from anyone else is
  // ignored).
  caf::send_as(coord, coord, atom::tick_v);
  sched.run();
  ASSERT_TRUE(view().nodes.empty());
  // ...then its heartbeat is answered false and its next tick joins again.
  for (int i = 0; i < 10 && n1.rejoins == 0; ++i) {
    sched.trigger_timeouts();
    sched.run();
  }
  EXPECT_EQ(n1.rejoins, 1);
  auto nodes = view().nodes;
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].name, "n1");
}

TEST_F(cluster_roles_test, a_node_agent_that_loses_its_coordinator_stops_rejoining) {
  start();
  auto& n1 = join("n1", {0});
  (void) n1;
  caf::anon_send_exit(coord, caf::exit_reason::kill);
  sched.run();
  // Its timers find the coordinator lost and send nothing; the agent lives on.
  sched.trigger_timeouts();
  sched.run();
  self->send(agents.at("n1"), atom::retire_v, std::string{"nobody"}, std::string{});
  sched.run();
  coord = nullptr;
}

} // namespace
} // namespace stitch
