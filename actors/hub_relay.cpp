#include "actors/hub_relay.hpp"

#include <caf/all.hpp>

#include <string>
#include <unordered_map>
#include <vector>

#include "actors/handle_types.hpp"
#include "actors/local_only.hpp"
#include "actors/log.hpp"
#include "actors/store_actor.hpp"
#include "runtime/core/error.hpp"

namespace stitch {

namespace {

constexpr auto lookup_timeout = std::chrono::seconds{5};
constexpr auto lookup_retry = std::chrono::milliseconds{500};

struct relay_state {
  static inline const char* name = "hub-relay";
  hub_relay_options opts;
  caf::actor target;
  /// A lookup is out or scheduled.
  bool looking = false;
  struct remembered {
    caf::strong_actor_ptr sender;
    caf::message msg;
  };
  std::vector<remembered> sticky;
  /// With `own_requests`: the callers of the requests sent and not yet
  /// answered, by the relay's own request id.
  std::unordered_map<uint64_t, caf::response_promise> out;
};

using self_ptr = caf::stateful_actor<relay_state>*;

void look_up(self_ptr self);

/// Answers every request still out with a retryable error: the target that
/// had them is gone and will never answer.
void fail_requests_out(self_ptr self) {
  auto& st = self->state;
  if (st.out.empty())
    return;
  auto out = std::move(st.out);
  st.out.clear();
  log::warn("node", "lost the " + st.opts.role + " it pointed at with " + std::to_string(out.size())
                      + " request(s) unanswered; each is answered with a retryable error");
  for (auto& [key, promise] : out)
    promise.deliver(to_caf_error(
      {errc::engine_unavailable, "the " + st.opts.role
                                   + " went away before it answered (its node is down or "
                                     "restarting); retry"}));
}

/// Sends the current request to the target as the relay's own and passes
/// its answer (or error) back to the one who asked.
void send_as_own(self_ptr self, caf::message msg) {
  auto& st = self->state;
  auto caller = self->make_response_promise();
  auto handle = self->request(st.target, caf::duration{st.opts.request_bound}, std::move(msg));
  const uint64_t key = handle.id().integer_value();
  st.out.emplace(key, std::move(caller));
  // CAF 0.17's behaviors have no catch-all: an answer that matches no
  // handler is offered again as `sec::unexpected_response` holding the
  // answer as its context, so the one error handler sees every answer.
  self->add_multiplexed_response_handler(handle.id(), caf::behavior{[self, key](caf::error& e) {
                                           auto& out = self->state.out;
                                           auto it = out.find(key);
                                           if (it == out.end())
                                             return;
                                           if (e == caf::sec::unexpected_response)
                                             it->second.deliver(std::move(e.context()));
                                           else
                                             it->second.deliver(std::move(e));
                                           out.erase(it);
                                         }});
}

void point_at(self_ptr self, caf::actor target) {
  auto& st = self->state;
  if (st.target == target)
    return;
  if (st.target) {
    self->demonitor(st.target);
    // Requests out to the old target are answered as lost: the caller asks
    // again, through the new one (a late answer from the old is dropped).
    fail_requests_out(self);
  }
  st.target = std::move(target);
  if (!st.target) {
    look_up(self);
    return;
  }
  self->monitor(st.target);
  for (const auto& r : st.sticky)
    st.target->enqueue(r.sender, caf::make_message_id(), r.msg, self->context());
}

void look_up(self_ptr self) {
  auto& st = self->state;
  if (!st.opts.directory || st.looking || st.target)
    return;
  st.looking = true;
  self->request(st.opts.directory, lookup_timeout, atom::lookup_v, st.opts.role)
    .then(
      [self](caf::actor& found) {
        self->state.looking = false;
        if (!self->state.target && found) {
          log::info("node", "the " + self->state.opts.role + " is reachable again");
          point_at(self, std::move(found));
        }
      },
      [self](const caf::error&) {
        // The coordinator is away too, or nobody serves the role yet.
        self->state.looking = false;
        self->delayed_send(self, lookup_retry, atom::tick_v);
      });
}

caf::behavior hub_relay(self_ptr self, hub_relay_options opts, caf::actor target) {
  self->state.opts = std::move(opts);
  self->set_down_handler([self](caf::down_msg& down) {
    auto& st = self->state;
    if (st.target && down.source == st.target.address()) {
      st.target = nullptr;
      fail_requests_out(self);
      look_up(self);
      return;
    }
    std::erase_if(st.sticky, [&](const relay_state::remembered& r) {
      return caf::actor_cast<caf::actor_addr>(r.sender) == down.source;
    });
  });
  self->set_default_handler(
    [self](caf::scheduled_actor*, caf::message_view& view) -> caf::result<caf::message> {
      auto& st = self->state;
      auto msg = view.move_content_to_message();
      if (st.opts.sticky && self->current_sender() && st.opts.sticky(msg)) {
        auto sender = self->current_sender();
        bool known = false;
        for (const auto& r : st.sticky)
          known = known || (r.sender == sender && to_string(r.msg) == to_string(msg));
        if (!known) {
          self->monitor(caf::actor_cast<caf::actor>(sender));
          st.sticky.push_back({sender, msg});
        }
      }
      if (!st.target)
        return to_caf_error(
          {errc::engine_unavailable, "the " + st.opts.role
                                       + " is unreachable from this node (its node is "
                                         "down or restarting); retry"});
      if (st.opts.own_requests && self->current_message_id().is_request()) {
        send_as_own(self, std::move(msg));
        return caf::delegated<caf::message>{};
      }
      auto promise = self->make_response_promise();
      promise.delegate(st.target, std::move(msg));
      return caf::delegated<caf::message>{};
    });
  point_at(self, std::move(target));
  if (!self->state.target)
    look_up(self);
  return {
    [self](atom::rebind, caf::actor& to) {
      // Only this node points its relays.
      if (!from_this_node(self))
        return;
      point_at(self, std::move(to));
    },
    [self](atom::tick) { look_up(self); },
  };
}

} // namespace

hub_relay_options owning_relay_options(std::string role) {
  hub_relay_options o;
  o.role = std::move(role);
  o.own_requests = true;
  return o;
}

hub_relay_options coordinator_relay_options() {
  return owning_relay_options("coordinator");
}

hub_relay_options store_relay_options(caf::actor directory) {
  auto o = owning_relay_options("store");
  o.directory = std::move(directory);
  o.sticky = [](const caf::message& m) {
    return m.match_elements<atom::subscribe, std::string, pointer_listener_actor>();
  };
  return o;
}

caf::actor spawn_hub_relay(caf::actor_system& sys, hub_relay_options opts, caf::actor target) {
  return sys.spawn(hub_relay, std::move(opts), std::move(target));
}

} // namespace stitch

namespace stitch {

void rebind_hub_relay(const caf::actor& relay, const caf::actor& target) {
  if (!relay)
    return;
  // From an actor of this node (see `from_this_node`), never anonymously.
  caf::scoped_actor self{relay->home_system()};
  self->send(relay, atom::rebind_v, target);
}

} // namespace stitch
