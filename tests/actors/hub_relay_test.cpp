// A node's relay to a hub actor, on CAF's deterministic scheduler: messages
// reach the actor it points at with their sender (answers come straight
// back), a relay pointing at nothing answers at once with an error naming
// the role, remembered subscriptions are replayed to a new target, and a
// relay with a directory finds a new target itself when its target dies.

#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/fakes.hpp"
#include "actors/handle_types.hpp"
#include "actors/hub_relay.hpp"

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
  for (const auto& x : {a, b, relay})
    caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
  sched.run();
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
  for (const auto& x : {second, directory, relay})
    caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
  sched.run();
}

} // namespace
} // namespace stitch
