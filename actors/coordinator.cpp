#include "actors/coordinator.hpp"

#include <caf/all.hpp>

#include <set>

#include "actors/credentials.hpp"
#include "actors/gateway_actor.hpp"
#include "actors/log.hpp"
#include "actors/publisher_actor.hpp"
#include "actors/status_actor.hpp"
#include "runtime/core/retention.hpp"
#include "runtime/core/token.hpp"

namespace stitch {

namespace {

using self_ptr = coordinator_actor::stateful_pointer<coordinator_state>;
using clock = std::chrono::steady_clock;

constexpr auto spawn_timeout = std::chrono::seconds{60};
constexpr auto boot_timeout = std::chrono::minutes{10};
/// Heartbeat checks between two re-enrollments of the placed replicas.
constexpr uint64_t reenroll_every_ticks = 10;
/// A replica that failed to start is placed again after this.
constexpr auto replace_delay = std::chrono::seconds{2};

std::chrono::milliseconds heartbeat_every(const coordinator_state& st) {
  return std::max(std::chrono::milliseconds{50}, st.opts.heartbeat_timeout / 4);
}

caf::error refused(errc code, std::string message) {
  return to_caf_error({code, std::move(message)});
}

caf::error unauthorized(const char* what) {
  return refused(errc::unauthorized,
                 std::string{what} + " needs the admin token (--token or STITCH_TOKEN)");
}

/// Whether a member's message carries the member capability (logged when not).
bool is_member(self_ptr self, const std::string& presented, std::string_view what) {
  return member_admits("coordinator", self->state.opts.member_token, presented, what);
}

/// Where the trainer's rollouts go: a gateway on the trainer's own node, or
/// else any member's.
std::string gateway_for(const coordinator_state& st, const std::string& node) {
  const auto& members = st.plan.members();
  if (auto it = members.find(node); it != members.end() && !it->second.gateway_http.empty())
    return it->second.gateway_http;
  for (const auto& [name, m] : members)
    if (!m.gateway_http.empty())
      return m.gateway_http;
  return {};
}

void carry_out(self_ptr self, std::vector<plan_effect> effects);
void publish_view(self_ptr self);

/// Every gateway and status actor routes to, or shows, a placed replica.
void enroll_everywhere(self_ptr self, const std::string& pool, const replica_actor& replica) {
  auto& st = self->state;
  for (const auto& gw : st.roles["gateway"])
    caf::anon_send(caf::actor_cast<gateway_actor>(gw), atom::enroll_v, pool, replica,
                   st.opts.member_token);
  for (const auto& s : st.roles["status"])
    caf::anon_send(caf::actor_cast<status_actor>(s), atom::enroll_v, pool, replica,
                   st.opts.member_token);
}

/// Places `p`, or (`adopt`) takes in the replica its node runs already: the
/// agent answers the handle of a replica it has under that id.
void place(self_ptr self, const placement& p, bool adopt = false) {
  auto& st = self->state;
  auto member = st.members.find(p.node);
  const auto* spec = st.plan.spec_of(p.run_id);
  if (member == st.members.end() || !spec) {
    carry_out(self, st.plan.replica_lost(p.replica_id));
    return;
  }
  log::info("coordinator", std::string{adopt ? "adopting " : "placing "} + p.replica_id + " (pool "
                             + p.pool + ") on " + p.node + " slot " + std::to_string(p.slot));
  const auto& cap = st.opts.member_token;
  self->request(member->second.agent, spawn_timeout, atom::spawn_v, p, *spec, cap)
    .then(
      [self, p](const replica_actor& replica) {
        auto& now = self->state;
        auto placed = now.plan.placements().find(p.replica_id);
        if (placed == now.plan.placements().end()) {
          // Its run was rolled back while it started: it leaves at once.
          self->send(replica, atom::retire_v, now.opts.member_token);
          return;
        }
        // Retired while it started: its agent got the retire after the spawn
        // and drains it; nobody routes to it meanwhile.
        if (placed->second.retiring)
          return;
        now.replicas[p.replica_id] = replica;
        self->send(replica, atom::subscribe_v, caf::actor_cast<replica_watcher_actor>(self));
        enroll_everywhere(self, p.pool, replica);
        log::info("coordinator", p.replica_id + " is up on " + p.node);
      },
      [self, p](const caf::error& err) {
        log::error("coordinator", "placing " + p.replica_id + " on " + p.node
                                    + " failed: " + self->system().render(err));
        self->delayed_send(self, replace_delay, atom::replica_down_v, p.replica_id,
                           self->state.opts.member_token);
      });
}

/// The experiments as they stand now, to the node's persistence.
void persist(self_ptr self) {
  if (self->state.opts.persist)
    self->state.opts.persist(self->state.plan.records());
}

void carry_out(self_ptr self, std::vector<plan_effect> effects) {
  auto& st = self->state;
  for (auto& e : effects) {
    switch (e.what) {
      case plan_effect::kind::place_replica: place(self, e.replica); break;
      case plan_effect::kind::adopt_replica: place(self, e.replica, true); break;
      case plan_effect::kind::retire_replica:
        log::info("coordinator", "retiring " + e.replica.replica_id + " on " + e.replica.node);
        if (auto m = st.members.find(e.replica.node); m != st.members.end())
          self->send(m->second.agent, atom::retire_v, e.replica.replica_id, st.opts.member_token);
        break;
      case plan_effect::kind::start_trainer: {
        auto m = st.members.find(e.node);
        const auto* spec = st.plan.spec_of(e.run_id);
        if (m == st.members.end() || !spec)
          break;
        auto gateway = gateway_for(st, e.node);
        if (gateway.empty()) {
          st.plan.trainer_ended(e.run_id);
          st.runs[e.run_id].outcome = "failed: no member hosts a gateway";
          log::error("coordinator", "trainer of " + e.run_id + " cannot start: no gateway");
          break;
        }
        log::info("coordinator",
                  "starting the trainer of " + e.run_id + " on " + e.node + " via " + gateway);
        self->send(m->second.agent, atom::train_v, *spec, gateway, st.opts.member_token);
        break;
      }
      case plan_effect::kind::stop_trainer:
        if (auto m = st.members.find(e.node); m != st.members.end())
          self->send(m->second.agent, atom::stop_v, e.run_id, st.opts.member_token);
        break;
    }
  }
  // Placed replicas the plan dropped (their node left) are gone: gateways
  // stop routing to them.
  std::erase_if(st.infos, [&](const auto& kv) { return !st.plan.placements().contains(kv.first); });
  std::erase_if(st.replicas, [&](const auto& kv) {
    if (st.plan.placements().contains(kv.first))
      return false;
    for (const auto& gw : st.roles["gateway"])
      caf::anon_send(caf::actor_cast<gateway_actor>(gw), atom::retire_v, kv.second,
                     st.opts.member_token);
    return true;
  });
  persist(self);
  publish_view(self);
}

void remove_member(self_ptr self, std::string name, const std::string& why) {
  auto& st = self->state;
  auto it = st.members.find(name);
  if (it == st.members.end())
    return;
  auto silent =
    std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - it->second.last_heartbeat);
  log::warn("coordinator", "node " + name + " removed: " + why + "; last heartbeat "
                             + std::to_string(silent.count()) + " ms ago (bound "
                             + std::to_string(st.opts.heartbeat_timeout.count()) + " ms)");
  auto agent = caf::actor_cast<caf::actor>(it->second.agent);
  st.members.erase(it);
  ++st.membership_epoch;
  for (auto& [role, handles] : st.roles)
    std::erase_if(handles, [&](const caf::actor& a) {
      return a.node() == agent.node() && a.node() != self->node();
    });
  carry_out(self, st.plan.leave(name));
}

cluster_view view_of(const coordinator_state& st) {
  cluster_view out;
  auto now = clock::now();
  for (const auto& [name, m] : st.plan.members()) {
    node_view n{name, m.roles, m.slots, m.gateway_http, std::nullopt, m.mesh};
    if (auto it = st.members.find(name); it != st.members.end())
      n.last_heartbeat_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second.last_heartbeat)
          .count();
    out.nodes.push_back(std::move(n));
  }
  for (const auto& v : st.plan.experiments()) {
    experiment_status e;
    e.run_id = v.spec.run_id;
    e.pool = v.spec.pool;
    e.replicas_wanted = v.spec.replicas;
    e.commit_mode = v.spec.commit_mode;
    for (const auto& p : v.replicas) {
      placed_replica_view r;
      r.replica_id = p.replica_id;
      r.node = p.node;
      r.slot = p.slot;
      r.up = st.replicas.contains(p.replica_id);
      if (auto info = st.infos.find(p.replica_id); info != st.infos.end()) {
        r.known = true;
        r.ready = info->second.ready;
        r.applied = info->second.applied;
        r.state = info->second.state;
      }
      e.replicas.push_back(std::move(r));
    }
    e.trainer_node = v.trainer_node;
    e.shortfall = v.shortfall;
    if (auto r = st.runs.find(v.spec.run_id); r != st.runs.end()) {
      e.last_step = r->second.last_step;
      e.trainer_outcome = r->second.outcome;
    }
    out.experiments.push_back(std::move(e));
  }
  // Which node holds which version's bytes (a replica's applied version).
  std::map<std::pair<std::string, version_ref>, std::set<std::string>> holders;
  for (const auto& [id, info] : st.infos)
    if (info.applied)
      if (auto p = st.plan.placements().find(id); p != st.plan.placements().end())
        holders[{p->second.pool, *info.applied}].insert(p->second.node);
  for (auto& [key, nodes] : holders)
    out.directory.push_back({key.first, key.second, {nodes.begin(), nodes.end()}});
  return out;
}

/// Status actors show the members and experiments.
void publish_view(self_ptr self) {
  auto& st = self->state;
  auto it = st.roles.find("status");
  if (it == st.roles.end() || it->second.empty())
    return;
  auto view = view_of(st);
  for (const auto& s : it->second)
    caf::anon_send(caf::actor_cast<status_actor>(s), atom::cluster_view_v, view,
                   st.opts.member_token);
}

void rollback(self_ptr self, const std::string& run) {
  auto& st = self->state;
  if (auto undone = st.plan.stop(run)) {
    for (auto& e : *undone)
      if (e.what == plan_effect::kind::retire_replica) {
        if (st.replicas.contains(e.replica.replica_id))
          carry_out(self, {e});
        else
          st.plan.retired(e.replica.replica_id);
      }
  }
}

/// The member whose node is `where` (empty when none).
std::string member_on(const coordinator_state& st, const caf::node_id& where) {
  for (const auto& [name, m] : st.members)
    if (m.agent.node() == where)
      return name;
  return {};
}

/// The handle of a holder the directory names (a placed or standalone
/// replica, or a publisher).
peer_holder_actor holder_handle(const coordinator_state& st, const std::string& id) {
  if (auto r = st.replicas.find(id); r != st.replicas.end())
    return r->second;
  for (const auto& [addr, r] : st.standalone_replicas)
    if (r.info && r.info->replica_id == id)
      return r.handle;
  if (auto l = st.lenders.find(id); l != st.lenders.end())
    return l->second;
  return {};
}

std::vector<holder_entry> on_lookup_holders(self_ptr self, const std::string& pool,
                                            const version_ref& version, const std::string& receiver,
                                            const std::string& receiver_node, bool frames) {
  auto& st = self->state;
  auto& directory = frames ? st.frame_holders : st.holders;
  std::vector<holder_entry> chosen;
  for (const auto& pick : directory.begin_fetch(receiver, receiver_node, pool, version)) {
    auto handle = holder_handle(st, pick.holder);
    if (!handle)
      continue;
    chosen.push_back({pick.holder, pick.node, std::move(handle), pick.backup, pick.partial});
  }
  return chosen;
}

caf::result<replica_actor> on_profile(self_ptr self, const std::string& id,
                                      const std::string& token) {
  auto& st = self->state;
  if (!token_matches(st.opts.admin_token, token))
    return unauthorized("profiling a replica");
  if (auto r = st.replicas.find(id); r != st.replicas.end())
    return r->second;
  std::string known;
  for (const auto& [name, r] : st.replicas)
    known += (known.empty() ? "" : ", ") + name;
  for (const auto& [addr, r] : st.standalone_replicas) {
    if (r.info && r.info->replica_id == id)
      return r.handle;
    if (r.info)
      known += (known.empty() ? "" : ", ") + r.info->replica_id;
  }
  return refused(errc::not_found, "no replica named " + id + " ("
                                    + (known.empty() ? "none is up" : "up: " + known) + ")");
}

void on_replica_state(self_ptr self, replica_info& info) {
  auto& st = self->state;
  // Only a replica it subscribed to tells a state (another's claim about a
  // placed replica would move the directory and retention).
  if (auto it =
        st.standalone_replicas.find(caf::actor_cast<caf::actor_addr>(self->current_sender()));
      it != st.standalone_replicas.end()) {
    st.holders.holds(info.replica_id, member_on(st, it->second.handle.node()), it->second.pool,
                     info.applied);
    it->second.info = std::move(info);
    return;
  }
  auto placed = st.plan.placements().find(info.replica_id);
  auto known_replica = st.replicas.find(info.replica_id);
  if (placed == st.plan.placements().end() || known_replica == st.replicas.end()
      || known_replica->second.address() != self->current_sender())
    return;
  st.holders.holds(info.replica_id, placed->second.node, placed->second.pool, info.applied);
  auto& known = st.infos[info.replica_id];
  bool moved = known.applied != info.applied || known.ready != info.ready;
  known = std::move(info);
  if (moved)
    publish_view(self);
}

void on_enroll_role(self_ptr self, const std::string& role, const caf::actor& handle) {
  self->monitor(handle);
  auto& handles = self->state.roles[role];
  if (std::find(handles.begin(), handles.end(), handle) != handles.end())
    return;
  handles.push_back(handle);
  // A gateway or status actor that comes late learns the replicas up so far.
  for (const auto& [id, replica] : self->state.replicas) {
    const auto& pool = self->state.plan.placements().at(id).pool;
    if (role == "gateway")
      caf::anon_send(caf::actor_cast<gateway_actor>(handle), atom::enroll_v, pool, replica,
                     self->state.opts.member_token);
    else if (role == "status")
      caf::anon_send(caf::actor_cast<status_actor>(handle), atom::enroll_v, pool, replica,
                     self->state.opts.member_token);
  }
  if (role == "status")
    publish_view(self);
}

std::vector<version_ref> on_in_use(self_ptr self, const std::string& pool) {
  auto& st = self->state;
  std::vector<replica_holdings> holdings;
  auto add = [&](const replica_info& i) {
    bool moving = i.state == sync_state::fetching || i.state == sync_state::staging
                  || i.state == sync_state::committing;
    holdings.push_back({i.applied, moving ? i.pointer : std::nullopt});
  };
  for (const auto& [id, info] : st.infos)
    if (auto p = st.plan.placements().find(id);
        p != st.plan.placements().end() && p->second.pool == pool)
      add(info);
  for (const auto& [addr, r] : st.standalone_replicas)
    if (r.pool == pool && r.info)
      add(*r.info);
  auto used = versions_in_use(holdings);
  return std::vector<version_ref>{used.begin(), used.end()};
}

caf::result<uint64_t> on_join(self_ptr self, member_info& info, member_holdings& running,
                              const node_agent_actor& agent) {
  auto& st = self->state;
  std::string name = info.name;
  auto fx = st.plan.join(std::move(info), std::move(running));
  if (!fx)
    return to_caf_error(fx.error());
  self->monitor(agent);
  st.members[name] = {agent, clock::now()};
  ++st.membership_epoch;
  const auto& m = st.plan.members().at(name);
  std::string roles;
  for (const auto& r : m.roles)
    roles += (roles.empty() ? "" : ",") + r;
  log::info("coordinator", "node " + name + " joined: roles " + roles + ", "
                             + std::to_string(m.slots.size()) + " replica slot(s)");
  carry_out(self, std::move(*fx));
  return static_cast<uint64_t>(heartbeat_every(st).count());
}

void on_tick(self_ptr self) {
  auto& st = self->state;
  auto now = clock::now();
  std::vector<std::string> late;
  for (const auto& [name, m] : st.members)
    if (now - m.last_heartbeat > st.opts.heartbeat_timeout)
      late.push_back(name);
  for (const auto& name : late)
    remove_member(self, name, "it missed its heartbeats");
  // Every few seconds gateways and status actors hear of every placed
  // replica again: one that dropped a live replica (its route switched
  // or came back) takes it in again; to one that holds it, it is a no-op.
  if (++st.ticks % reenroll_every_ticks == 0)
    for (const auto& [id, replica] : st.replicas)
      enroll_everywhere(self, st.plan.placements().at(id).pool, replica);
  self->delayed_send(self, heartbeat_every(st), atom::tick_v);
}

void on_recovered(self_ptr self) {
  auto& st = self->state;
  if (!st.plan.recovering())
    return;
  auto fx = st.plan.end_recovery();
  log::info("coordinator", "recovery window over: " + std::to_string(st.replicas.size())
                             + " replica(s) adopted, " + std::to_string(fx.size())
                             + " placement(s) and trainer start(s) to make up the rest");
  carry_out(self, std::move(fx));
}

caf::result<std::string> on_submit(self_ptr self, experiment_spec& spec, const std::string& token) {
  auto& st = self->state;
  if (!token_matches(st.opts.admin_token, token))
    return unauthorized("submit");
  auto publishers = st.roles.find("publisher");
  if (publishers == st.roles.end() || publishers->second.empty())
    return refused(errc::not_found, "no member hosts the role 'publisher' to publish the "
                                    "experiment's boot checkpoint");
  auto fx = st.plan.submit(spec);
  if (!fx)
    return to_caf_error(fx.error());
  st.runs[spec.run_id] = {{}, {}, clock::now()};
  log::info("coordinator", "experiment " + spec.run_id + " admitted in pool " + spec.pool + ": "
                             + std::to_string(spec.replicas) + " replica(s)");
  publish_args args;
  args.pool = spec.pool;
  args.run_id = spec.run_id;
  args.version = spec.boot_version;
  args.token = st.opts.admin_token;
  auto promise = self->make_response_promise<std::string>();
  auto publisher = caf::actor_cast<publisher_actor>(publishers->second.front());
  auto effects = std::make_shared<std::vector<plan_effect>>(std::move(*fx));
  auto on_published = [self, promise, spec, effects](const pipeline::publish_report& s) mutable {
    log::info("coordinator", "experiment " + spec.run_id + ": boot checkpoint published ("
                               + std::string{to_string(s.kind)} + (s.claimed ? ", run claimed" : "")
                               + ")");
    std::string where;
    for (const auto& e : *effects)
      if (e.what == plan_effect::kind::place_replica)
        where += (where.empty() ? "" : ", ") + e.replica.replica_id + "@" + e.replica.node;
      else if (e.what == plan_effect::kind::start_trainer)
        where += (where.empty() ? "" : ", ") + std::string{"trainer@"} + e.node;
    carry_out(self, std::move(*effects));
    promise.deliver("submitted " + spec.run_id + " to pool " + spec.pool + ": " + where);
  };
  auto on_failed = [self, promise, spec](const caf::error& err) mutable {
    rollback(self, spec.run_id);
    self->state.runs.erase(spec.run_id);
    auto e = from_caf_error(self->system(), err);
    promise.deliver(to_caf_error(
      {e.code, "the boot checkpoint of " + spec.run_id + " was not published: " + e.message}));
  };
  // The boot checkpoint: a directory the publisher's node reads, or the
  // built-in model from a seed.
  if (!spec.boot_dir.empty())
    self->request(publisher, boot_timeout, atom::publish_v, args, spec.boot_dir)
      .then(std::move(on_published), std::move(on_failed));
  else
    self
      ->request(publisher, boot_timeout, atom::init_model_v, args, spec.boot_preset, spec.boot_seed)
      .then(std::move(on_published), std::move(on_failed));
  return promise;
}

caf::result<std::string> on_scale(self_ptr self, const std::string& run, uint32_t n,
                                  const std::string& token) {
  auto& st = self->state;
  if (!token_matches(st.opts.admin_token, token))
    return unauthorized("scale");
  auto name = st.plan.resolve_run(run);
  if (!name)
    return to_caf_error(name.error());
  auto fx = st.plan.scale(*name, n);
  if (!fx)
    return to_caf_error(fx.error());
  size_t placed = 0, retired = 0;
  for (const auto& e : *fx) {
    placed += e.what == plan_effect::kind::place_replica;
    retired += e.what == plan_effect::kind::retire_replica;
  }
  log::info("coordinator", "scaling " + *name + " to " + std::to_string(n) + " replica(s)");
  carry_out(self, std::move(*fx));
  return "scaled " + *name + " to " + std::to_string(n) + " replica(s): " + std::to_string(placed)
         + " placed, " + std::to_string(retired) + " draining";
}

caf::result<std::string> on_stop(self_ptr self, const std::string& run, const std::string& token) {
  auto& st = self->state;
  if (!token_matches(st.opts.admin_token, token))
    return unauthorized("stop");
  auto fx = st.plan.stop(run);
  if (!fx)
    return to_caf_error(fx.error());
  st.runs.erase(run);
  log::info("coordinator", "stopping " + run);
  carry_out(self, std::move(*fx));
  return "stopped " + run + ": its replicas drain and leave";
}

void on_replica_down(self_ptr self, const std::string& id) {
  auto& st = self->state;
  auto it = st.plan.placements().find(id);
  if (it == st.plan.placements().end())
    return;
  bool retiring = it->second.retiring;
  st.replicas.erase(id);
  st.infos.erase(id);
  st.holders.forget(id);
  st.frame_holders.forget(id);
  log::info("coordinator", id + (retiring ? " drained and left" : " is down; placing again"));
  carry_out(self, retiring ? st.plan.retired(id) : st.plan.replica_lost(id));
}

void on_trained(self_ptr self, const std::string& run, const std::string& outcome) {
  auto& st = self->state;
  // Only the run's own trainer ends it (a stray one stopped on a node
  // that rejoined does not).
  std::string from;
  for (const auto& [name, m] : st.members)
    if (m.agent.address() == self->current_sender())
      from = name;
  if (!st.plan.trainer_ended(run, from))
    return;
  if (auto it = st.runs.find(run); it != st.runs.end())
    it->second.outcome = outcome.empty() ? "finished" : outcome;
  log::info("coordinator", "trainer of " + run
                             + " ended: " + (outcome.empty() ? std::string{"finished"} : outcome));
  persist(self);
  publish_view(self);
}

/// The experiments persisted before a restart: taken back, their nodes
/// given the recovery window to rejoin with what kept running.
void restore_experiments(self_ptr self) {
  auto& restored = self->state.opts.restored;
  if (restored.empty())
    return;
  auto& st = self->state;
  std::string runs;
  for (const auto& r : restored) {
    runs += (runs.empty() ? "" : ", ") + r.spec.run_id;
    st.runs[r.spec.run_id] = {{}, r.trainer_done ? "finished" : "", clock::now()};
  }
  if (auto ok = st.plan.restore(std::move(restored)); !ok) {
    log::error("coordinator", "the persisted experiments were not restored: " + ok.error().message);
    st.runs.clear();
  } else {
    log::info("coordinator", "recovered experiment(s) " + runs + "; their nodes have "
                               + std::to_string(st.opts.recovery_window.count())
                               + " ms to rejoin with what kept running");
    self->delayed_send(self, st.opts.recovery_window, atom::recovered_v);
  }
  st.opts.restored.clear();
}

/// A role, lender, standalone replica or member went away.
void on_down(self_ptr self, const caf::down_msg& down) {
  auto& st = self->state;
  for (auto& [role, handles] : st.roles)
    std::erase_if(handles, [&](const caf::actor& a) { return a.address() == down.source; });
  for (auto it = st.lenders.begin(); it != st.lenders.end();)
    if (it->second.address() == down.source) {
      st.holders.forget(it->first);
      st.frame_holders.forget(it->first);
      it = st.lenders.erase(it);
    } else {
      ++it;
    }
  if (auto it = st.standalone_replicas.find(down.source); it != st.standalone_replicas.end()) {
    if (it->second.info) {
      st.holders.forget(it->second.info->replica_id);
      st.frame_holders.forget(it->second.info->replica_id);
    }
    st.standalone_replicas.erase(it);
  }
  for (const auto& [name, m] : st.members)
    if (m.agent.address() == down.source) {
      bool left =
        down.reason == caf::exit_reason::user_shutdown || down.reason == caf::exit_reason::normal;
      remove_member(self, name,
                    left ? "it left the cluster"
                         : "its connection closed (" + self->system().render(down.reason) + ")");
      return;
    }
}

} // namespace

coordinator_actor::behavior_type
coordinator(coordinator_actor::stateful_pointer<coordinator_state> self, coordinator_options opts) {
  self->state.opts = std::move(opts);
  restore_experiments(self);
  self->set_down_handler([self](const caf::down_msg& down) { on_down(self, down); });
  self->delayed_send(self, heartbeat_every(self->state), atom::tick_v);
  return {
    [self](atom::lookup, const std::string& role) -> caf::result<caf::actor> {
      auto it = self->state.roles.find(role);
      if (it == self->state.roles.end() || it->second.empty())
        return refused(errc::not_found, "no actor serves the role '" + role + "'");
      return it->second.front();
    },
    [self](atom::lookup, const std::string& pool, const version_ref& version,
           const std::string& receiver, const std::string& receiver_node, bool frames,
           const std::string& cap) -> caf::result<std::vector<holder_entry>> {
      if (!is_member(self, cap, "a holder lookup"))
        return not_a_member("a holder lookup");
      return on_lookup_holders(self, pool, version, receiver, receiver_node, frames);
    },
    [self](atom::done, const std::string&, const version_ref&, const std::string& receiver,
           bool all_fetched, bool frames, const std::string& cap) {
      if (is_member(self, cap, "the end of a fetch"))
        (frames ? self->state.frame_holders : self->state.holders).end_fetch(receiver, all_fetched);
    },
    [self](atom::offer, const std::string& pool, const version_ref& version,
           const std::string& holder, const std::string& node, peer_holder_actor& handle,
           bool frames, const std::string& cap) {
      auto& st = self->state;
      if (!handle || !is_member(self, cap, "a holder's offer"))
        return;
      if (!st.lenders.contains(holder))
        self->monitor(handle);
      st.lenders[holder] = std::move(handle);
      (frames ? st.frame_holders : st.holders).holds(holder, node, pool, version, true);
    },
    [self](atom::release, const std::string& pool, const std::string& holder,
           const std::string& cap) {
      auto& st = self->state;
      if (!is_member(self, cap, "a holder's release"))
        return;
      if (auto it = st.lenders.find(holder); it != st.lenders.end()) {
        st.holders.holds(holder, {}, pool, std::nullopt, true);
        st.frame_holders.holds(holder, {}, pool, std::nullopt, true);
      }
    },
    [self](atom::profile, const std::string& id, const std::string& token)
      -> caf::result<replica_actor> { return on_profile(self, id, token); },
    [self](atom::replica_state, replica_info& info) { on_replica_state(self, info); },
    [self](atom::enroll, const std::string& role, const caf::actor& handle,
           const std::string& cap) {
      if (handle && is_member(self, cap, "enrolling the role '" + role + "'"))
        on_enroll_role(self, role, handle);
    },
    [self](atom::enroll, const std::string& pool, const replica_actor& replica,
           const std::string& cap) {
      auto& st = self->state;
      if (!replica || !is_member(self, cap, "enrolling a replica of pool '" + pool + "'")
          || st.standalone_replicas.contains(replica.address()))
        return;
      st.standalone_replicas[replica.address()] = {pool, std::nullopt, replica};
      self->monitor(replica);
      self->send(replica, atom::subscribe_v, caf::actor_cast<replica_watcher_actor>(self));
    },
    [self](atom::in_use, const std::string& pool) { return on_in_use(self, pool); },
    [self](atom::join, member_info& info, member_holdings& running, const node_agent_actor& agent,
           const std::string& cap) -> caf::result<uint64_t> {
      if (!is_member(self, cap, "a join (node " + info.name + ")"))
        return not_a_member("joining the cluster");
      return on_join(self, info, running, agent);
    },
    [self](atom::heartbeat, const std::string& name) -> uint64_t {
      auto it = self->state.members.find(name);
      if (it == self->state.members.end() || it->second.agent.address() != self->current_sender())
        return 0;
      it->second.last_heartbeat = clock::now();
      return self->state.membership_epoch;
    },
    [self](atom::mesh) {
      std::vector<node_view> out;
      for (auto& n : view_of(self->state).nodes)
        if (!n.mesh.empty())
          out.push_back(std::move(n));
      return out;
    },
    [self](atom::tick) {
      if (from_itself(self))
        on_tick(self);
    },
    [self](atom::recovered) {
      if (from_itself(self))
        on_recovered(self);
    },
    [self](atom::submit, experiment_spec& spec, const std::string& token)
      -> caf::result<std::string> { return on_submit(self, spec, token); },
    [self](atom::scale, const std::string& run, uint32_t n, const std::string& token)
      -> caf::result<std::string> { return on_scale(self, run, n, token); },
    [self](atom::stop, const std::string& run, const std::string& token)
      -> caf::result<std::string> { return on_stop(self, run, token); },
    [self](atom::cluster_view) { return view_of(self->state); },
    [self](atom::replica_down, const std::string& id, const std::string& cap) {
      if (is_member(self, cap, "a replica's end (" + id + ")"))
        on_replica_down(self, id);
    },
    [self](atom::progress, const std::string& run, const step_report& step,
           const std::string& cap) {
      if (!is_member(self, cap, "a trainer's progress"))
        return;
      if (auto it = self->state.runs.find(run); it != self->state.runs.end())
        it->second.last_step = step;
      publish_view(self);
    },
    [self](atom::trained, const std::string& run, const std::string& outcome,
           const std::string& cap) {
      if (is_member(self, cap, "a trainer's end"))
        on_trained(self, run, outcome);
    },
  };
}

} // namespace stitch
