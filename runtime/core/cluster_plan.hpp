#pragma once

// The coordinator's domain (DESIGN §2): cluster membership, experiments and
// the placement of their replicas on the GPU slots nodes offer. Pure: events
// in (a node joined or left, submit, scale, stop, a replica retired or failed
// to start), effects out (place or retire a replica on a node, start or stop
// a trainer); the coordinator actor carries the effects out.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/error.hpp"

namespace stitch {

/// A node as it joins: its name, roles and the replica slots it offers (GPU
/// indices; for the built-in engine on CPU a slot is just a place).
struct member_info {
  std::string name;
  std::vector<std::string> roles;
  std::vector<uint32_t> slots;
  /// Where this node's HTTP gateway listens (`host:port`), when it has one.
  std::string gateway_http;
  /// Where other nodes connect to it directly (`host:port`, the node mesh);
  /// empty: they reach it through the hub.
  std::string mesh = {};

  bool has_role(std::string_view role) const;
};

/// The built-in trainer of an experiment (the demo's learner and its rollout
/// driver, DESIGN §2).
struct trainer_spec {
  bool enabled = true;
  uint32_t steps = 30;
  uint32_t samples_per_step = 16;
  /// The rollout driver asks for `min_version = latest - staleness`.
  uint32_t staleness = 2;
  double learning_rate = 0.5;
};

/// What `stitch submit experiment.toml` asks for.
struct experiment_spec {
  std::string run_id;
  std::string pool = "default";
  uint32_t replicas = 1;
  std::string commit_mode = "in_place";
  /// The boot checkpoint, published as version `boot_version` (the run's
  /// anchor): the Hugging Face directory `boot_dir` (read by the publisher's
  /// node) when given, else the built-in model `preset` initialised from
  /// `seed`. The replicas' engines are the built-in `preset` architecture.
  std::string boot_preset = "tiny";
  uint64_t boot_seed = 7;
  std::string boot_dir;
  uint64_t boot_version = 0;
  trainer_spec trainer;
};

/// One step of an experiment's trainer, as it reports it.
struct step_report {
  uint32_t step = 0;
  /// The version the step published.
  uint64_t version = 0;
  double reward = 0;
  uint64_t samples = 0;
  double staleness_mean = 0;
  uint64_t staleness_max = 0;
  /// The largest activation pause a replica reported meanwhile.
  double pause_us = 0;
  /// Samples whose start stamp broke their constraint (must stay 0).
  uint64_t constraint_violations = 0;

  friend bool operator==(const step_report&, const step_report&) = default;
};

/// Checks what a spec alone can get wrong (empty or hostile run id, zero
/// replicas, unknown commit mode); one line per problem.
status validate(const experiment_spec& spec);

/// One replica where the plan put it.
struct placement {
  std::string replica_id;
  std::string run_id;
  std::string pool;
  std::string node;
  uint32_t slot = 0;
  /// Asked to drain and leave; its slot is freed once it is gone.
  bool retiring = false;
};

/// What a node already runs as it (re)joins: after the coordinator restarted,
/// its replicas and trainers kept going, and the plan adopts them.
struct member_holdings {
  /// Replicas of experiments, as they were placed (the node field is ignored:
  /// the joining node's).
  std::vector<placement> replicas;
  /// Runs whose trainer runs on the node.
  std::vector<std::string> trainers;
};

/// What the coordinator persists of an experiment, to recover it after a
/// restart (`cluster_plan::records` / `restore`).
struct experiment_record {
  experiment_spec spec;
  bool trainer_done = false;
  /// The counter that names the run's next replica.
  uint64_t next_replica = 0;
};

/// What the coordinator must do.
struct plan_effect {
  /// adopt_replica: a replica its node runs already (reported as it joined)
  /// is placed where it is; the coordinator takes it in like a placed one.
  enum class kind : uint8_t {
    place_replica,
    retire_replica,
    start_trainer,
    stop_trainer,
    adopt_replica
  };
  kind what = kind::place_replica;
  /// place/retire: the replica.
  placement replica;
  /// start/stop_trainer: the node and run.
  std::string node;
  std::string run_id;
};

struct experiment_view {
  experiment_spec spec;
  /// Replicas placed and not retiring.
  std::vector<placement> replicas;
  /// The node running its trainer (empty: none, or not wanted).
  std::string trainer_node;
  /// Why the plan is short of what was asked (no free slot, no trainer node).
  std::string shortfall;
};

class cluster_plan {
public:
  /// A node joins. A name already present is refused: a restarted node is
  /// seen leaving first (down message or missed heartbeats). What it already
  /// runs is adopted where an active experiment wants it (same run and pool,
  /// a free slot of the node, fewer replicas than asked; a trainer its run
  /// has none for) and retired or stopped otherwise. Then fills what
  /// experiments miss.
  result<std::vector<plan_effect>> join(member_info m, member_holdings running = {});
  /// A node left or died: its replicas and trainer are gone; what they served
  /// is placed elsewhere where slots are free (or when nodes join later).
  std::vector<plan_effect> leave(std::string_view node);

  /// Admits an experiment when it can be placed now: the pool is not serving
  /// another active experiment, enough slots are free, and a trainer node and
  /// a gateway exist when a trainer is wanted. Otherwise refused with the
  /// reason.
  result<std::vector<plan_effect>> submit(const experiment_spec& spec);
  /// Elastic: more replicas are placed on free slots (refused when there are
  /// not enough), fewer retire the newest first (they drain before leaving).
  /// `run` may be empty when exactly one experiment is active.
  result<std::vector<plan_effect>> scale(std::string_view run, uint32_t replicas);
  /// Ends an experiment: every replica retires, the trainer stops.
  result<std::vector<plan_effect>> stop(std::string_view run);

  /// A retiring replica is gone (drained and stopped): its slot is free.
  std::vector<plan_effect> retired(std::string_view replica_id);
  /// A placed replica failed to start or died: it is dropped and re-placed
  /// (on another slot when one is free).
  std::vector<plan_effect> replica_lost(std::string_view replica_id);
  /// A trainer ended (finished or failed): not restarted. With `node`, only
  /// the run's trainer there counts (a stray one a rejoining node was asked
  /// to stop does not end the run's); answers whether it counted.
  bool trainer_ended(std::string_view run, std::string_view node = {});

  /// The active experiments as they are to be persisted.
  std::vector<experiment_record> records() const;
  /// After a restart: the experiments persisted before it, with no replica
  /// placed. Until `end_recovery`, nothing is placed or started for them:
  /// their nodes rejoin and report what kept running (adopted by `join`).
  /// Refused when experiments are active already or a record is invalid.
  status restore(std::vector<experiment_record> records);
  /// The recovery window ended: what the restored experiments still miss is
  /// placed (and trainers started) on free slots.
  std::vector<plan_effect> end_recovery();
  bool recovering() const noexcept { return recovering_; }

  /// The spec of an active experiment (as scaled), or null.
  const experiment_spec* spec_of(std::string_view run) const;

  /// The run `run` names, or the only active one when `run` is empty.
  result<std::string> resolve_run(std::string_view run) const;

  const std::map<std::string, member_info>& members() const noexcept { return members_; }
  std::vector<experiment_view> experiments() const;
  const std::map<std::string, placement>& placements() const noexcept { return placements_; }
  size_t free_slots() const;

private:
  struct experiment {
    experiment_spec spec;
    std::string trainer_node;
    bool trainer_done = false;
    uint64_t next_replica = 0;
    /// Restored and waiting for the recovery window to end.
    bool restored = false;
  };

  /// Adopts what a joining node runs, or retires and stops it.
  std::vector<plan_effect> adopt(const std::string& node, member_holdings running);
  /// Places what experiments miss on free slots, and trainers that lost their node.
  std::vector<plan_effect> fill();
  /// The freest member's lowest free slot.
  std::optional<std::pair<std::string, uint32_t>> free_slot() const;
  std::set<uint32_t> used_slots(const std::string& node) const;
  size_t active_replicas(const std::string& run) const;
  std::string pick_trainer_node() const;
  bool has_gateway() const;
  std::string shortfall_of(const experiment& e) const;

  std::map<std::string, member_info> members_;
  std::map<std::string, experiment> experiments_;
  /// By replica id.
  std::map<std::string, placement> placements_;
  bool recovering_ = false;
};

} // namespace stitch
