#include "runtime/core/cluster_plan.hpp"

#include <algorithm>
#include <optional>

#include "runtime/core/admission_gate.hpp"
#include "runtime/core/version_ref.hpp"

namespace stitch {

bool member_info::has_role(std::string_view role) const {
  return std::find(roles.begin(), roles.end(), role) != roles.end();
}

status validate(const experiment_spec& spec) {
  std::string problems;
  auto add = [&](const std::string& line) {
    if (!problems.empty())
      problems += "\n";
    problems += line;
  };
  if (auto ok = validate_run_id(spec.run_id); !ok)
    add("run_id: " + ok.error().message);
  if (auto ok = validate_run_id(spec.pool); !ok)
    add("pool: " + ok.error().message);
  if (spec.replicas == 0)
    add("replicas: must be at least 1");
  if (auto mode = parse_commit_mode(spec.commit_mode); !mode)
    add("commit_mode: " + mode.error().message);
  if (spec.boot_preset.empty())
    add("boot.preset: must name a built-in model preset");
  if (spec.trainer.enabled) {
    if (spec.trainer.steps == 0)
      add("trainer.steps: must be at least 1");
    if (spec.trainer.samples_per_step == 0)
      add("trainer.samples_per_step: must be at least 1");
    if (!(spec.trainer.learning_rate > 0) || spec.trainer.learning_rate > 100)
      add("trainer.learning_rate: must be in (0, 100]");
  }
  if (!problems.empty())
    return make_error(errc::invalid_argument, problems);
  return {};
}

result<std::vector<plan_effect>> cluster_plan::join(member_info m, member_holdings running) {
  if (auto ok = validate_run_id(m.name); !ok)
    return make_error(errc::invalid_argument, "node name: " + ok.error().message);
  if (members_.contains(m.name))
    return make_error(errc::conflict, "a node named '" + m.name
                                        + "' is already a member; node names must be unique");
  std::sort(m.slots.begin(), m.slots.end());
  m.slots.erase(std::unique(m.slots.begin(), m.slots.end()), m.slots.end());
  if (!m.has_role("replica"))
    m.slots.clear();
  std::string name = m.name;
  members_.emplace(name, std::move(m));
  auto out = adopt(name, std::move(running));
  auto more = fill();
  out.insert(out.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  return out;
}

namespace {

/// N of a replica id `<run>-r<N>` (nullopt for any other shape).
std::optional<uint64_t> replica_counter(const std::string& run, const std::string& id) {
  const std::string prefix = run + "-r";
  if (id.size() <= prefix.size() || id.size() > prefix.size() + 19 || !id.starts_with(prefix))
    return std::nullopt;
  uint64_t n = 0;
  for (size_t i = prefix.size(); i < id.size(); ++i) {
    if (id[i] < '0' || id[i] > '9')
      return std::nullopt;
    n = n * 10 + static_cast<uint64_t>(id[i] - '0');
  }
  return n;
}

} // namespace

std::vector<plan_effect> cluster_plan::adopt(const std::string& node, member_holdings running) {
  std::vector<plan_effect> out;
  const auto& slots = members_.at(node).slots;
  for (auto& r : running.replicas) {
    r.node = node;
    r.retiring = false;
    auto e = experiments_.find(r.run_id);
    bool fits = e != experiments_.end() && e->second.spec.pool == r.pool
                && !placements_.contains(r.replica_id)
                && std::find(slots.begin(), slots.end(), r.slot) != slots.end()
                && !used_slots(node).contains(r.slot)
                && active_replicas(r.run_id) < e->second.spec.replicas;
    if (!fits) {
      out.push_back({plan_effect::kind::retire_replica, std::move(r), {}, {}});
      continue;
    }
    // Names stay unique: the counter passes every adopted replica's.
    if (auto n = replica_counter(r.run_id, r.replica_id))
      e->second.next_replica = std::max(e->second.next_replica, *n + 1);
    placements_.emplace(r.replica_id, r);
    out.push_back({plan_effect::kind::adopt_replica, std::move(r), {}, {}});
  }
  for (auto& run : running.trainers) {
    auto e = experiments_.find(run);
    if (e != experiments_.end() && e->second.spec.trainer.enabled && !e->second.trainer_done
        && (e->second.trainer_node.empty() || e->second.trainer_node == node)) {
      e->second.trainer_node = node;
      continue;
    }
    out.push_back({plan_effect::kind::stop_trainer, {}, node, std::move(run)});
  }
  return out;
}

std::vector<plan_effect> cluster_plan::leave(std::string_view node) {
  auto it = members_.find(std::string{node});
  if (it == members_.end())
    return {};
  members_.erase(it);
  std::erase_if(placements_, [&](const auto& kv) { return kv.second.node == node; });
  for (auto& [run, e] : experiments_)
    if (e.trainer_node == node)
      e.trainer_node.clear();
  return fill();
}

result<std::vector<plan_effect>> cluster_plan::submit(const experiment_spec& spec) {
  if (auto ok = validate(spec); !ok)
    return std::move(ok).error();
  if (experiments_.contains(spec.run_id))
    return make_error(errc::conflict, "run '" + spec.run_id + "' is already active; stop it first");
  for (const auto& [run, e] : experiments_)
    if (e.spec.pool == spec.pool)
      return make_error(errc::conflict, "pool '" + spec.pool + "' is serving run '" + run
                                          + "'; stop it first (`stitch stop " + run + "`)");
  if (free_slots() < spec.replicas)
    return make_error(errc::limit_exceeded, "cannot place " + std::to_string(spec.replicas)
                                              + " replicas: " + std::to_string(free_slots())
                                              + " replica slots are free across the members");
  if (spec.trainer.enabled && pick_trainer_node().empty())
    return make_error(errc::not_found,
                      "the experiment wants a trainer but no member hosts the role 'trainer'");
  if (spec.trainer.enabled && !has_gateway())
    return make_error(errc::not_found, "the experiment's trainer samples through a gateway but "
                                       "no member hosts the role 'gateway'");
  experiments_.emplace(spec.run_id, experiment{spec, {}, false, 0, false});
  return fill();
}

result<std::vector<plan_effect>> cluster_plan::scale(std::string_view run_name, uint32_t replicas) {
  auto run = resolve_run(run_name);
  if (!run)
    return std::move(run).error();
  if (replicas == 0)
    return make_error(errc::invalid_argument,
                      "replicas: must be at least 1 (`stitch stop " + *run + "` ends the run)");
  auto& e = experiments_.at(*run);
  size_t active = active_replicas(*run);
  if (replicas > active && free_slots() < replicas - active)
    return make_error(errc::limit_exceeded,
                      "cannot scale '" + *run + "' to " + std::to_string(replicas) + ": "
                        + std::to_string(active) + " placed and only "
                        + std::to_string(free_slots()) + " replica slots free");
  e.spec.replicas = replicas;
  std::vector<plan_effect> out;
  if (replicas < active) {
    // Newest first: the replica ids carry an increasing counter.
    std::vector<placement*> mine;
    for (auto& [id, p] : placements_)
      if (p.run_id == *run && !p.retiring)
        mine.push_back(&p);
    std::sort(mine.begin(), mine.end(), [](const placement* a, const placement* b) {
      return a->replica_id.size() != b->replica_id.size()
               ? a->replica_id.size() > b->replica_id.size()
               : a->replica_id > b->replica_id;
    });
    for (size_t i = 0; i < active - replicas; ++i) {
      mine[i]->retiring = true;
      out.push_back({plan_effect::kind::retire_replica, *mine[i], {}, {}});
    }
    return out;
  }
  return fill();
}

result<std::vector<plan_effect>> cluster_plan::stop(std::string_view run_name) {
  auto run = resolve_run(run_name);
  if (!run)
    return std::move(run).error();
  std::vector<plan_effect> out;
  for (auto& [id, p] : placements_)
    if (p.run_id == *run && !p.retiring) {
      p.retiring = true;
      out.push_back({plan_effect::kind::retire_replica, p, {}, {}});
    }
  auto it = experiments_.find(*run);
  if (!it->second.trainer_node.empty() && !it->second.trainer_done)
    out.push_back({plan_effect::kind::stop_trainer, {}, it->second.trainer_node, *run});
  experiments_.erase(it);
  return out;
}

std::vector<plan_effect> cluster_plan::retired(std::string_view replica_id) {
  placements_.erase(std::string{replica_id});
  return fill();
}

std::vector<plan_effect> cluster_plan::replica_lost(std::string_view replica_id) {
  placements_.erase(std::string{replica_id});
  return fill();
}

bool cluster_plan::trainer_ended(std::string_view run, std::string_view node) {
  auto it = experiments_.find(std::string{run});
  if (it == experiments_.end())
    return false;
  if (!node.empty() && it->second.trainer_node != node)
    return false;
  it->second.trainer_done = true;
  return true;
}

std::vector<experiment_record> cluster_plan::records() const {
  std::vector<experiment_record> out;
  for (const auto& [run, e] : experiments_)
    out.push_back({e.spec, e.trainer_done, e.next_replica});
  return out;
}

status cluster_plan::restore(std::vector<experiment_record> records) {
  if (!experiments_.empty())
    return make_error(errc::conflict, "experiments are active already; restore comes first");
  std::map<std::string, experiment> restored;
  std::set<std::string> pools;
  for (auto& r : records) {
    if (auto ok = validate(r.spec); !ok)
      return make_error(errc::corrupt_data,
                        "experiment '" + r.spec.run_id + "': " + ok.error().message);
    if (!pools.insert(r.spec.pool).second || restored.contains(r.spec.run_id))
      return make_error(errc::corrupt_data, "experiment '" + r.spec.run_id
                                              + "' repeats a run or a pool of another record");
    std::string run = r.spec.run_id;
    restored.emplace(std::move(run),
                     experiment{std::move(r.spec), {}, r.trainer_done, r.next_replica, true});
  }
  experiments_ = std::move(restored);
  recovering_ = !experiments_.empty();
  return {};
}

std::vector<plan_effect> cluster_plan::end_recovery() {
  recovering_ = false;
  for (auto& [run, e] : experiments_)
    e.restored = false;
  return fill();
}

const experiment_spec* cluster_plan::spec_of(std::string_view run) const {
  auto it = experiments_.find(std::string{run});
  return it == experiments_.end() ? nullptr : &it->second.spec;
}

result<std::string> cluster_plan::resolve_run(std::string_view run) const {
  if (!run.empty()) {
    if (!experiments_.contains(std::string{run}))
      return make_error(errc::not_found, "no active experiment runs '" + std::string{run} + "'");
    return std::string{run};
  }
  if (experiments_.size() != 1)
    return make_error(errc::invalid_argument,
                      experiments_.empty()
                        ? std::string{"no experiment is active"}
                        : std::to_string(experiments_.size())
                            + " experiments are active; name the run (--run RUN)");
  return experiments_.begin()->first;
}

std::vector<experiment_view> cluster_plan::experiments() const {
  std::vector<experiment_view> out;
  for (const auto& [run, e] : experiments_) {
    experiment_view v{e.spec, {}, e.trainer_node, shortfall_of(e)};
    for (const auto& [id, p] : placements_)
      if (p.run_id == run && !p.retiring)
        v.replicas.push_back(p);
    out.push_back(std::move(v));
  }
  return out;
}

size_t cluster_plan::free_slots() const {
  size_t n = 0;
  for (const auto& [name, m] : members_)
    n += m.slots.size() - used_slots(name).size();
  return n;
}

std::vector<plan_effect> cluster_plan::fill() {
  std::vector<plan_effect> out;
  for (auto& [run, e] : experiments_) {
    // Its nodes are still rejoining with what kept running.
    if (e.restored)
      continue;
    while (active_replicas(run) < e.spec.replicas) {
      auto slot = free_slot();
      if (!slot)
        break;
      placement p;
      p.replica_id = run + "-r" + std::to_string(e.next_replica++);
      p.run_id = run;
      p.pool = e.spec.pool;
      p.node = slot->first;
      p.slot = slot->second;
      placements_.emplace(p.replica_id, p);
      out.push_back({plan_effect::kind::place_replica, std::move(p), {}, {}});
    }
    // A trainer samples through a gateway: with none among the members
    // (the front door died or is cut off), it waits for one to join.
    if (e.spec.trainer.enabled && !e.trainer_done && e.trainer_node.empty() && has_gateway()) {
      e.trainer_node = pick_trainer_node();
      if (!e.trainer_node.empty())
        out.push_back({plan_effect::kind::start_trainer, {}, e.trainer_node, run});
    }
  }
  return out;
}

std::optional<std::pair<std::string, uint32_t>> cluster_plan::free_slot() const {
  std::optional<std::pair<std::string, uint32_t>> best;
  size_t best_free = 0;
  for (const auto& [name, m] : members_) {
    auto used = used_slots(name);
    size_t n = m.slots.size() - used.size();
    if (n > best_free) {
      for (uint32_t s : m.slots)
        if (!used.contains(s)) {
          best = {name, s};
          break;
        }
      best_free = n;
    }
  }
  return best;
}

std::set<uint32_t> cluster_plan::used_slots(const std::string& node) const {
  std::set<uint32_t> used;
  for (const auto& [id, p] : placements_)
    if (p.node == node)
      used.insert(p.slot);
  return used;
}

size_t cluster_plan::active_replicas(const std::string& run) const {
  return static_cast<size_t>(
    std::count_if(placements_.begin(), placements_.end(),
                  [&](const auto& kv) { return kv.second.run_id == run && !kv.second.retiring; }));
}

bool cluster_plan::has_gateway() const {
  return std::any_of(members_.begin(), members_.end(),
                     [](const auto& kv) { return kv.second.has_role("gateway"); });
}

std::string cluster_plan::pick_trainer_node() const {
  std::map<std::string, size_t> load;
  for (const auto& [name, m] : members_)
    if (m.has_role("trainer"))
      load[name] = 0;
  for (const auto& [run, e] : experiments_)
    if (load.contains(e.trainer_node))
      ++load[e.trainer_node];
  std::string best;
  size_t best_load = SIZE_MAX;
  for (const auto& [name, n] : load)
    if (n < best_load) {
      best = name;
      best_load = n;
    }
  return best;
}

std::string cluster_plan::shortfall_of(const experiment& e) const {
  std::string out;
  size_t active = active_replicas(e.spec.run_id);
  if (e.restored && active < e.spec.replicas)
    return "recovering after a coordinator restart: " + std::to_string(active) + " of "
           + std::to_string(e.spec.replicas) + " replica(s) rejoined so far";
  if (active < e.spec.replicas)
    out = std::to_string(e.spec.replicas - active) + " replica(s) waiting for a free slot";
  if (e.spec.trainer.enabled && !e.trainer_done && e.trainer_node.empty())
    out += std::string{out.empty() ? "" : "; "}
           + (has_gateway() ? "trainer waiting for a node with the role 'trainer'"
                            : "trainer waiting for a node with the role 'gateway' to sample "
                              "through");
  return out;
}

} // namespace stitch
