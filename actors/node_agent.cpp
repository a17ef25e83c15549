#include "actors/node_agent.hpp"

#include <caf/all.hpp>
#include <caf/io/middleman_actor.hpp>

#include <algorithm>

#include "actors/credentials.hpp"
#include "actors/log.hpp"
#include "config/node_config.hpp"

namespace stitch {

namespace {

using self_ptr = node_agent_actor::stateful_pointer<node_agent_state>;

constexpr auto join_timeout = std::chrono::seconds{10};
constexpr auto connect_timeout = std::chrono::seconds{10};
constexpr auto rejoin_delay = std::chrono::milliseconds{500};
/// Reconnecting backs off from 200 ms to this.
constexpr auto reconnect_max_delay = std::chrono::milliseconds{2000};

/// What the node runs, for the coordinator to adopt: placed replicas that
/// are up and not retiring, and its trainers.
member_holdings holdings(const node_agent_state& st) {
  member_holdings h;
  for (const auto& [id, p] : st.placed)
    if (st.by_id.contains(id) && !st.retiring.contains(id))
      h.replicas.push_back(p);
  if (st.hooks.running_trainers)
    h.trainers = st.hooks.running_trainers();
  return h;
}

const std::string& cap(self_ptr self) {
  return self->state.address.member_token;
}

/// Whether a message carries the member capability (logged when not).
bool is_member(self_ptr self, const std::string& presented, std::string_view what) {
  return member_admits("node", cap(self), presented, what);
}

void retry_later(self_ptr self) {
  auto& st = self->state;
  auto delay = std::min<std::chrono::milliseconds>(
    reconnect_max_delay, std::chrono::milliseconds{200 << std::min<uint32_t>(st.attempts, 4)});
  ++st.attempts;
  self->delayed_send(self, delay, atom::tick_v);
}

void try_join(self_ptr self) {
  auto& st = self->state;
  if (st.asking || !st.coordinator)
    return;
  st.asking = true;
  self->request(st.coordinator, join_timeout, atom::join_v, st.me, holdings(st), self, cap(self))
    .then(
      [self](uint64_t heartbeat_ms) {
        auto& now = self->state;
        now.asking = false;
        now.joined = true;
        now.attempts = 0;
        now.heartbeat = std::chrono::milliseconds{heartbeat_ms};
        log::info("node", "joined the coordinator; heartbeat every " + std::to_string(heartbeat_ms)
                            + " ms");
        if (now.joins++ > 0 && now.hooks.rejoined)
          now.hooks.rejoined();
        for (auto& [run, outcome] : now.untold)
          self->send(now.coordinator, atom::trained_v, run, outcome, cap(self));
        now.untold.clear();
        self->delayed_send(self, now.heartbeat, atom::tick_v);
      },
      [self](const caf::error& err) {
        auto& now = self->state;
        now.asking = false;
        if (now.coordinator)
          log::warn("node", "joining the coordinator failed (" + self->system().render(err)
                              + "); retrying");
        self->delayed_send(self, rejoin_delay, atom::tick_v);
      });
}

/// Reaches the coordinator's address again (its node restarted, or the
/// network came back), then joins.
void reconnect(self_ptr self) {
  auto& st = self->state;
  if (st.asking)
    return;
  if (!st.address.connector)
    return; // nowhere to look: the coordinator stays lost
  st.asking = true;
  auto mm = caf::actor_cast<caf::io::middleman_actor>(st.address.connector);
  self->request(mm, connect_timeout, caf::connect_atom_v, st.address.host, st.address.port)
    .then(
      [self](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>& ifs) {
        auto& now = self->state;
        now.asking = false;
        auto want = self->system().message_types(caf::detail::type_list<coordinator_actor>{});
        if (!ptr || ifs != want) {
          log::warn("node",
                    now.address.host + ":" + std::to_string(now.address.port)
                      + (ptr ? " serves an actor that is not a coordinator" : " serves no actor")
                      + "; retrying");
          retry_later(self);
          return;
        }
        now.coordinator = caf::actor_cast<coordinator_actor>(std::move(ptr));
        self->monitor(now.coordinator);
        log::info("node", "reached the coordinator at " + now.address.host + ":"
                            + std::to_string(now.address.port) + " again; joining");
        if (now.hooks.coordinator_changed)
          now.hooks.coordinator_changed(now.coordinator);
        try_join(self);
      },
      [self](const caf::error& err) {
        auto& now = self->state;
        now.asking = false;
        if (now.attempts < 3 || now.attempts % 20 == 0)
          log::warn("node", "the coordinator at " + now.address.host + ":"
                              + std::to_string(now.address.port) + " is unreachable ("
                              + self->system().render(err) + "); retrying");
        retry_later(self);
      });
}

/// Connects to the members this node keeps direct connections to.
void connect_mesh(self_ptr self, std::vector<node_view> nodes) {
  auto& st = self->state;
  auto mm = caf::actor_cast<caf::io::middleman_actor>(st.address.connector);
  for (auto& n : nodes) {
    bool hub = std::find(n.roles.begin(), n.roles.end(), "coordinator") != n.roles.end();
    if (n.name <= st.me.name || hub || n.mesh.empty() || st.mesh_peers.contains(n.name)
        || st.mesh_connecting.contains(n.name))
      continue;
    auto at = config::parse_listen_address(n.mesh);
    if (!at)
      continue;
    // A loopback mesh address means "on the coordinator's machine" only when
    // the coordinator is reached on loopback too (a one-machine cluster);
    // otherwise it would reach whatever listens there on this machine.
    if (config::is_loopback(at->host) && !config::is_loopback(st.address.host)) {
      if (st.mesh_failing.insert(n.name).second)
        log::warn("node", "node " + n.name + " accepts direct connections on " + n.mesh
                            + " only (set its cluster.listen to an address this node reaches); "
                              "its traffic passes through the hub");
      continue;
    }
    st.mesh_connecting.insert(n.name);
    self->request(mm, connect_timeout, caf::connect_atom_v, at->host, at->port)
      .then(
        [self, name = n.name, at = n.mesh](const caf::node_id&, caf::strong_actor_ptr& ptr,
                                           const std::set<std::string>&) {
          auto& now = self->state;
          now.mesh_connecting.erase(name);
          if (!ptr) {
            log::warn("node", "node " + name + "'s mesh address " + at + " serves no actor");
            return;
          }
          auto peer = caf::actor_cast<caf::actor>(std::move(ptr));
          self->monitor(peer);
          now.mesh_peers[name] = std::move(peer);
          bool was_failing = now.mesh_failing.erase(name) > 0;
          log::info("node",
                    "reaches node " + name + " directly at " + at + (was_failing ? " again" : ""));
        },
        [self, name = n.name, at = n.mesh](const caf::error& err) {
          auto& now = self->state;
          now.mesh_connecting.erase(name);
          // Tried again after the next heartbeat.
          now.mesh_epoch = 0;
          if (now.mesh_failing.insert(name).second)
            log::warn("node", "cannot reach node " + name + " directly at " + at + " ("
                                + self->system().render(err)
                                + "); its traffic passes through the hub until it can");
        });
  }
}

/// The membership changed (or a direct connection dropped): the members'
/// mesh addresses, then connections to the missing ones.
void refresh_mesh(self_ptr self, uint64_t epoch) {
  auto& st = self->state;
  if (!st.address.connector || epoch == 0 || epoch == st.mesh_epoch || st.mesh_asking
      || !st.coordinator)
    return;
  st.mesh_asking = true;
  self->request(st.coordinator, join_timeout, atom::mesh_v)
    .then(
      [self, epoch](std::vector<node_view>& nodes) {
        self->state.mesh_asking = false;
        self->state.mesh_epoch = epoch;
        connect_mesh(self, std::move(nodes));
      },
      [self](const caf::error&) { self->state.mesh_asking = false; });
}

} // namespace

node_agent_actor::behavior_type
node_agent(node_agent_actor::stateful_pointer<node_agent_state> self, member_info me,
           coordinator_actor coordinator, node_agent_hooks hooks, coordinator_address address) {
  auto& init = self->state;
  init.me = std::move(me);
  init.coordinator = std::move(coordinator);
  init.hooks = std::move(hooks);
  init.address = std::move(address);
  self->monitor(init.coordinator);
  self->set_down_handler([self](const caf::down_msg& down) {
    auto& st = self->state;
    if (st.coordinator && down.source == st.coordinator.address()) {
      log::error("node", "lost the coordinator (" + self->system().render(down.reason)
                           + "); replicas keep serving what they hold and converging through "
                             "the store"
                           + (st.address.connector ? "; reconnecting" : ""));
      st.joined = false;
      st.coordinator = nullptr;
      st.attempts = 0;
      if (st.hooks.coordinator_changed)
        st.hooks.coordinator_changed(coordinator_actor{});
      // The pending tick (heartbeat or join retry) reconnects.
      return;
    }
    for (auto peer = st.mesh_peers.begin(); peer != st.mesh_peers.end(); ++peer)
      if (peer->second.address() == down.source) {
        log::warn("node", "the direct connection to node " + peer->first + " closed; reconnecting");
        st.mesh_peers.erase(peer);
        st.mesh_epoch = 0;
        return;
      }
    auto it = st.replicas.find(down.source);
    if (it == st.replicas.end())
      return;
    std::string id = it->second;
    st.replicas.erase(it);
    st.by_id.erase(id);
    st.placed.erase(id);
    st.retiring.erase(id);
    if (st.hooks.replica_gone)
      st.hooks.replica_gone(id);
    if (st.coordinator)
      self->send(st.coordinator, atom::replica_down_v, id, cap(self));
  });
  try_join(self);
  return {
    [self](atom::spawn, const placement& p, const experiment_spec& spec,
           const std::string& presented) -> caf::result<replica_actor> {
      auto& st = self->state;
      if (!is_member(self, presented, "a placement (" + p.replica_id + ")"))
        return to_caf_error({errc::unauthorized, "placing a replica needs the cluster's member "
                                                 "capability"});
      if (st.by_id.contains(p.replica_id))
        return st.by_id.at(p.replica_id);
      auto made = st.hooks.spawn_replica(p, spec);
      if (!made)
        return to_caf_error(made.error());
      self->monitor(*made);
      st.replicas[made->address()] = p.replica_id;
      st.by_id[p.replica_id] = *made;
      st.placed[p.replica_id] = p;
      return *made;
    },
    [self](atom::retire, const std::string& id, const std::string& presented) {
      auto& st = self->state;
      if (!is_member(self, presented, "a retire (" + id + ")"))
        return;
      if (auto it = st.by_id.find(id); it != st.by_id.end()) {
        st.retiring.insert(id);
        self->send(it->second, atom::retire_v, cap(self));
      }
    },
    [self](atom::train, const experiment_spec& spec, const std::string& gateway,
           const std::string& presented) {
      if (!is_member(self, presented, "a trainer's start (" + spec.run_id + ")"))
        return;
      auto ok = self->state.hooks.start_trainer(spec, gateway, self);
      if (!ok) {
        log::error("node",
                   "the trainer of " + spec.run_id + " did not start: " + to_string(ok.error()));
        self->send(self, atom::trained_v, spec.run_id, "failed: " + to_string(ok.error()),
                   cap(self));
      }
    },
    [self](atom::stop, const std::string& run, const std::string& presented) {
      if (is_member(self, presented, "a trainer's stop (" + run + ")")
          && self->state.hooks.stop_trainer)
        self->state.hooks.stop_trainer(run);
    },
    [self](atom::tick) {
      auto& st = self->state;
      if (!from_itself(self))
        return;
      if (!st.coordinator) {
        reconnect(self);
        return;
      }
      if (!st.joined) {
        try_join(self);
        return;
      }
      self->request(st.coordinator, st.heartbeat * 4, atom::heartbeat_v, st.me.name)
        .then(
          [self](uint64_t epoch) {
            auto& now = self->state;
            if (epoch != 0)
              refresh_mesh(self, epoch);
            if (epoch != 0 || !now.joined)
              return;
            // Removed after missed heartbeats (this process stalled): the
            // coordinator placed this node's replicas elsewhere. Retire them
            // and join again as a fresh member (the next tick does).
            log::warn("node", "the coordinator no longer counts this node as a member; retiring "
                                + std::to_string(now.by_id.size())
                                + " replica(s) and joining again");
            now.joined = false;
            for (const auto& [id, r] : now.by_id) {
              now.retiring.insert(id);
              self->send(r, atom::retire_v, cap(self));
            }
          },
          [](const caf::error&) {
            // A lost coordinator shows as a down message.
          });
      self->delayed_send(self, st.heartbeat, atom::tick_v);
    },
    [self](atom::progress, const std::string& run, const step_report& step,
           const std::string& presented) {
      if (is_member(self, presented, "a trainer's progress") && self->state.joined)
        self->send(self->state.coordinator, atom::progress_v, run, step, cap(self));
    },
    [self](atom::trained, const std::string& run, const std::string& outcome,
           const std::string& presented) {
      auto& st = self->state;
      if (!is_member(self, presented, "a trainer's end"))
        return;
      if (st.joined)
        self->send(st.coordinator, atom::trained_v, run, outcome, cap(self));
      else
        st.untold.emplace_back(run, outcome);
    },
  };
}

} // namespace stitch
