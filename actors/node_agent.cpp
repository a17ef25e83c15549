#include "actors/node_agent.hpp"

#include <caf/all.hpp>

#include "actors/log.hpp"

namespace stitch {

namespace {

using self_ptr = node_agent_actor::stateful_pointer<node_agent_state>;

constexpr auto join_timeout = std::chrono::seconds{10};
constexpr auto rejoin_delay = std::chrono::milliseconds{500};

void try_join(self_ptr self) {
  self->request(self->state.coordinator, join_timeout, atom::join_v, self->state.me, self)
    .then(
      [self](uint64_t heartbeat_ms) {
        auto& st = self->state;
        st.joined = true;
        st.heartbeat = std::chrono::milliseconds{heartbeat_ms};
        log::info("node", "joined the coordinator; heartbeat every " + std::to_string(heartbeat_ms)
                            + " ms");
        if (st.joins++ > 0 && st.hooks.rejoined)
          st.hooks.rejoined();
        self->delayed_send(self, st.heartbeat, atom::tick_v);
      },
      [self](const caf::error& err) {
        if (self->state.lost)
          return;
        log::warn("node",
                  "joining the coordinator failed (" + self->system().render(err) + "); retrying");
        self->delayed_send(self, rejoin_delay, atom::tick_v);
      });
}

} // namespace

node_agent_actor::behavior_type
node_agent(node_agent_actor::stateful_pointer<node_agent_state> self, member_info me,
           coordinator_actor coordinator, node_agent_hooks hooks) {
  auto& init = self->state;
  init.me = std::move(me);
  init.coordinator = std::move(coordinator);
  init.hooks = std::move(hooks);
  self->monitor(init.coordinator);
  self->set_down_handler([self](const caf::down_msg& down) {
    auto& st = self->state;
    if (down.source == st.coordinator.address()) {
      log::error("node", "lost the coordinator (" + self->system().render(down.reason)
                           + "); replicas keep serving and converging through the store");
      st.joined = false;
      st.lost = true;
      return;
    }
    auto it = st.replicas.find(down.source);
    if (it == st.replicas.end())
      return;
    std::string id = it->second;
    st.replicas.erase(it);
    st.by_id.erase(id);
    if (st.hooks.replica_gone)
      st.hooks.replica_gone(id);
    self->send(st.coordinator, atom::replica_down_v, id);
  });
  try_join(self);
  return {
    [self](atom::spawn, const placement& p,
           const experiment_spec& spec) -> caf::result<replica_actor> {
      auto& st = self->state;
      if (st.by_id.contains(p.replica_id))
        return st.by_id.at(p.replica_id);
      auto made = st.hooks.spawn_replica(p, spec);
      if (!made)
        return to_caf_error(made.error());
      self->monitor(*made);
      st.replicas[made->address()] = p.replica_id;
      st.by_id[p.replica_id] = *made;
      return *made;
    },
    [self](atom::retire, const std::string& id) {
      if (auto it = self->state.by_id.find(id); it != self->state.by_id.end())
        self->send(it->second, atom::retire_v);
    },
    [self](atom::train, const experiment_spec& spec, const std::string& gateway) {
      auto ok = self->state.hooks.start_trainer(spec, gateway, self);
      if (!ok) {
        log::error("node",
                   "the trainer of " + spec.run_id + " did not start: " + to_string(ok.error()));
        self->send(self->state.coordinator, atom::trained_v, spec.run_id,
                   "failed: " + to_string(ok.error()));
      }
    },
    [self](atom::stop, const std::string& run) {
      if (self->state.hooks.stop_trainer)
        self->state.hooks.stop_trainer(run);
    },
    [self](atom::tick) {
      auto& st = self->state;
      if (st.lost)
        return;
      if (!st.joined) {
        try_join(self);
        return;
      }
      self->request(st.coordinator, st.heartbeat * 4, atom::heartbeat_v, st.me.name)
        .then(
          [self](bool member) {
            auto& now = self->state;
            if (member || !now.joined)
              return;
            // Removed after missed heartbeats (this process stalled): the
            // coordinator placed this node's replicas elsewhere. Retire them
            // and join again as a fresh member (the next tick does).
            log::warn("node", "the coordinator no longer counts this node as a member; retiring "
                                + std::to_string(now.by_id.size())
                                + " replica(s) and joining again");
            now.joined = false;
            for (const auto& [id, r] : now.by_id)
              self->send(r, atom::retire_v);
          },
          [](const caf::error&) {
            // A lost coordinator shows as a down message.
          });
      self->delayed_send(self, st.heartbeat, atom::tick_v);
    },
    [self](atom::progress, const std::string& run, const step_report& step) {
      self->send(self->state.coordinator, atom::progress_v, run, step);
    },
    [self](atom::trained, const std::string& run, const std::string& outcome) {
      self->send(self->state.coordinator, atom::trained_v, run, outcome);
    },
  };
}

} // namespace stitch
