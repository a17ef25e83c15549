// A node's relay to a hub actor, on CAF's deterministic scheduler: messages
// reach the actor it points at with their sender (answers come straight
// back), a relay pointing at nothing answers at once with an error naming
// the role, remembered subscriptions are replayed to a new target, and a
// relay with a directory finds a new target itself when its target dies, and
// a relay that owns its requests answers those a dying target never will.

#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/fakes.hpp"
#include "actors/handle_types.hpp"
#include "actors/hub_relay.hpp"
#include "actors/store_actor.hpp"

namespace stitch {
namespace {

using namespace std::chrono_literals;
using testing::deterministic;

/// A hub actor: answers `(text)` with its name, and tells a subscriber.
caf::behavior fake_hub(caf::event_based_actor* self, std::string name) {
  return {
    [name](const std::string& text) { return name + ":" + text; },
    [self, name](atom::subscribe, const std::string& pool) {
      self->send(caf::actor_cast<caf::actor>(self->current_sender()), name + " tells " + pool);
    },
  };
}

/// A hub actor that never answers `(claim, text)` (it keeps the promises),
/// answers `(text)` with its name and `(list, text)` with an error.
struct holding_state {
  std::vector<caf::response_promise> held;
};
caf::behavior holding_hub(caf::stateful_actor<holding_state>* self, std::string name) {
  return {
    [name](const std::string& text) { return name + ":" + text; },
    [self](atom::claim, const std::string&) -> caf::result<std::string> {
      self->state.held.push_back(self->make_response_promise());
      return caf::delegated<std::string>{};
    },
    [](atom::list, const std::string& text) -> caf::result<std::string> {
      return to_caf_error({errc::not_found, "no " + text});
    },
  };
}

/// The coordinator's role directory: answers `(lookup, role)` with `who`.
caf::behavior fake_directory(caf::event_based_actor*, std::shared_ptr<caf::actor> who) {
  return {
    [who](atom::lookup, const std::string&) -> caf::result<caf::actor> {
      if (!*who)
        return to_caf_error({errc::not_found, "nobody"});
      return *who;
    },
  };
}

class hub_relay_test : public ::testing::Test {
protected:
  hub_relay_test()
      : sys(deterministic(cfg)), self(sys, true),
        sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {}

  /// Asks `whom` for `text`: the answer or "error: ...".
  std::string ask(const caf::actor& whom, const std::string& text) {
    auto answer = self->request(whom, caf::infinite, text);
    sched.run();
    std::string out = "(none)";
    answer.receive([&](std::string& s) { out = s; },
                   [&](const caf::error& e) { out = "error: " + sys.render(e); });
    return out;
  }

  /// Runs what is due, then the next text (or error) `self` received.
  std::string next_text() {
    sched.run();
    std::string out = "(none)";
    self->receive([&](std::string& s) { out = s; },
                  [&](const caf::error& e) { out = "error: " + sys.render(e); },
                  caf::after(0s) >> [] {});
    return out;
  }

  /// Sends `whom` a request its holding hub keeps, kills `hub` (as a hub on
  /// a node that is killed: CAF leaves the held promise unanswered, a dead
  /// node's are never answered at all) and returns what the caller got,
  /// which can only be the relay's answer ("(no answer)" if none came).
  std::string ask_held_then_kill(const caf::actor& whom, const caf::actor& hub) {
    auto held = self->request(whom, caf::infinite, atom::claim_v, std::string{"pool"});
    sched.run();
    caf::anon_send_exit(hub, caf::exit_reason::kill);
    sched.run();
    if (self->mailbox().empty())
      return "(no answer)";
    std::string out = "(none)";
    held.receive([&](std::string& s) { out = s; },
                 [&](const caf::error& e) { out = "error: " + sys.render(e); });
    return out;
  }

  /// Stops `actors` and runs what their exits set off.
  void shut_down(std::initializer_list<caf::actor> actors) {
    for (const auto& x : actors)
      caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
    sched.run();
  }

  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scoped_actor self;
  caf::scheduler::test_coordinator& sched;
};

TEST_F(hub_relay_test, delegates_with_the_sender_and_refuses_by_role_while_pointing_nowhere) {
  auto a = sys.spawn(fake_hub, std::string{"a"});
  auto relay = spawn_hub_relay(sys, {"coordinator", {}, {}}, a);
  sched.run();
  EXPECT_EQ(ask(relay, "hi"), "a:hi");
  // Pointing at nothing: an error at once, naming the role.
  rebind_hub_relay(relay, caf::actor{});
  sched.run();
  auto refused = ask(relay, "hi");
  EXPECT_NE(refused.find("the coordinator is unreachable"), std::string::npos) << refused;
  // Pointed elsewhere, the next request goes there.
  auto b = sys.spawn(fake_hub, std::string{"b"});
  rebind_hub_relay(relay, b);
  sched.run();
  EXPECT_EQ(ask(relay, "again"), "b:again");
  shut_down({a, b, relay});
}

TEST_F(hub_relay_test, finds_a_new_target_through_its_directory_and_replays_subscriptions) {
  auto first = sys.spawn(fake_hub, std::string{"store1"});
  auto current = std::make_shared<caf::actor>(first);
  auto directory = sys.spawn(fake_directory, current);
  hub_relay_options o;
  o.role = "store";
  o.directory = directory;
  o.sticky = [](const caf::message& m) { return m.match_elements<atom::subscribe, std::string>(); };
  auto relay = spawn_hub_relay(sys, o, first);
  sched.run();
  self->send(relay, atom::subscribe_v, std::string{"pool-a"});
  EXPECT_EQ(next_text(), "store1 tells pool-a");
  // The same subscription again is remembered once.
  self->send(relay, atom::subscribe_v, std::string{"pool-a"});
  EXPECT_EQ(next_text(), "store1 tells pool-a");

  // The store dies; the directory knows none yet: requests are refused and
  // the relay keeps asking.
  *current = caf::actor{};
  caf::anon_send_exit(first, caf::exit_reason::kill);
  sched.run();
  auto refused = ask(relay, "read");
  EXPECT_NE(refused.find("the store is unreachable"), std::string::npos) << refused;

  // A new store is enrolled: the relay's next lookup finds it, replays the
  // subscription (once, with its sender) and forwards to it.
  auto second = sys.spawn(fake_hub, std::string{"store2"});
  *current = second;
  sched.trigger_timeouts();
  sched.run();
  EXPECT_EQ(next_text(), "store2 tells pool-a");
  EXPECT_EQ(next_text(), "(none)");
  EXPECT_EQ(ask(relay, "read"), "store2:read");
  shut_down({second, directory, relay});
}

// Without `own_requests` the held request below is never answered.
TEST_F(hub_relay_test, owned_requests_are_answered_when_their_target_dies_unanswering) {
  auto first = sys.spawn(holding_hub, std::string{"store1"});
  auto current = std::make_shared<caf::actor>(first);
  auto directory = sys.spawn(fake_directory, current);
  hub_relay_options o;
  o.role = "store";
  o.directory = directory;
  o.own_requests = true;
  auto relay = spawn_hub_relay(sys, o, first);
  sched.run();
  // Answers and errors pass back through the relay.
  EXPECT_EQ(ask(relay, "read"), "store1:read");
  {
    auto answer = self->request(relay, caf::infinite, atom::list_v, std::string{"such run"});
    sched.run();
    std::string out = "(none)";
    answer.receive([&](std::string& s) { out = s; },
                   [&](const caf::error& e) { out = "error: " + sys.render(e); });
    EXPECT_NE(out.find("no such run"), std::string::npos) << out;
    EXPECT_NE(out.find("not_found"), std::string::npos) << out;
  }
  // A request the store holds, then the store dies without answering: the
  // relay answers it, retryably, naming the role, as soon as it sees the
  // store go down.
  *current = caf::actor{};
  auto out = ask_held_then_kill(relay, first);
  EXPECT_NE(out.find("the store went away before it answered"), std::string::npos) << out;
  EXPECT_NE(out.find("engine_unavailable"), std::string::npos) << out;

  // A new store: requests go there.
  auto second = sys.spawn(holding_hub, std::string{"store2"});
  *current = second;
  sched.trigger_timeouts();
  sched.run();
  EXPECT_EQ(ask(relay, "read"), "store2:read");
  shut_down({second, directory, relay});
}

// The relays a node runs (`coordinator_relay_options`, `store_relay_options`)
// both own their requests; plain messages (enrollments, replica states,
// subscriptions) still reach the hub with their own sender.
TEST_F(hub_relay_test, a_nodes_coordinator_relay_answers_what_a_dying_coordinator_held) {
  auto coordinator = sys.spawn(holding_hub, std::string{"coordinator1"});
  auto relay = spawn_hub_relay(sys, coordinator_relay_options(), coordinator);
  sched.run();
  EXPECT_EQ(ask(relay, "lookup"), "coordinator1:lookup");
  auto out = ask_held_then_kill(relay, coordinator);
  EXPECT_NE(out.find("the coordinator went away before it answered"), std::string::npos) << out;
  EXPECT_NE(out.find("engine_unavailable"), std::string::npos) << out;
  // Pointed at the restarted coordinator by the node agent.
  auto again = sys.spawn(fake_hub, std::string{"coordinator2"});
  rebind_hub_relay(relay, again);
  sched.run();
  self->send(relay, atom::subscribe_v, std::string{"pool-a"});
  EXPECT_EQ(next_text(), "coordinator2 tells pool-a");
  EXPECT_EQ(ask(relay, "lookup"), "coordinator2:lookup");
  shut_down({again, relay});
}

TEST_F(hub_relay_test, a_nodes_store_relay_remembers_pointer_subscriptions_and_owns_requests) {
  auto opts = store_relay_options(caf::actor{});
  EXPECT_EQ(opts.role, "store");
  EXPECT_TRUE(opts.own_requests);
  ASSERT_TRUE(opts.sticky);
  pointer_listener_actor listener;
  EXPECT_TRUE(opts.sticky(caf::make_message(atom::subscribe_v, std::string{"pool"}, listener)));
  EXPECT_FALSE(opts.sticky(caf::make_message(atom::subscribe_v, std::string{"pool"})));
  EXPECT_FALSE(opts.sticky(caf::make_message(std::string{"read"})));
}

} // namespace
} // namespace stitch
