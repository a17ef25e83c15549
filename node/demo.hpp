#pragma once

#include <caf/fwd.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

#include "node/cli.hpp"
#include "runtime/core/cluster_plan.hpp"
#include "runtime/core/error.hpp"
#include "runtime/engine/rollout_client.hpp"

namespace stitch::node {

/// `stitch demo` (DESIGN §7): an asynchronous RL run you can watch. A
/// built-in trainer learns a toy task with a verifiable reward (emit lowercase
/// letters) by policy gradient on the output head, publishing every step as a
/// new version; a built-in rollout driver samples through the gateway with
/// `min_version = latest - staleness`, so generation never waits for the
/// newest weights. Prints per step the reward, samples, staleness and the
/// replicas' activation pause, then a summary (one JSON object with --json).
struct demo_command {
  host_port coordinator;
  host_port gateway{"127.0.0.1", 8080};
  /// Start an all-in-one node in this process (ports picked freely).
  bool local = false;
  uint32_t steps = 30;
  uint32_t samples_per_step = 16;
  uint32_t staleness = 2;
  /// A token `d` versions behind the newest counts `staleness_decay^d`
  /// (by the version its span says produced it).
  double staleness_decay = 0.8;
  double learning_rate = 0.5;
  bool json = false;
  std::string token;
  std::string run_id = "demo";
  std::string pool = "default";
  /// The boot checkpoint: built-in model `preset` initialised from `seed`,
  /// published as `boot_version` (the trainer's steps follow it).
  std::string preset = "tiny";
  /// A mixture of experts (`stitch demo --moe`): the `moe-tiny` preset,
  /// rollouts that return their routed experts, a trainer that replays them
  /// and trains the last layer's router too (at `router_learning_rate`), and
  /// a report of how often the trainer's own routing would have differed.
  bool moe = false;
  double router_learning_rate = 2.0;
  uint64_t seed = 7;
  uint64_t boot_version = 0;
  /// The trainer role: when the pool already serves this run (the
  /// coordinator published its boot checkpoint, from a seed or a directory,
  /// or another trainer left it), start from its latest stored version.
  bool resume = false;
  /// Set by another thread: end after the current step (the trainer role).
  const std::atomic<bool>* stop = nullptr;
  /// How long a step's publish is tried again after failures another try may
  /// not meet (the publisher's node down or restarting); 0: not at all.
  std::chrono::seconds publish_retry_for{0};
  /// Where rollouts come from: a rollout driver on another node (the
  /// trainer role, when the cluster has one). Empty: sampled here, through
  /// `gateway`, one thread per rollout.
  std::function<result<std::vector<engine::rollout_result>>(uint64_t min_version, uint32_t count,
                                                            uint64_t seed_base)>
    rollouts;
  /// Called after every step with its report as a JSON object.
  std::function<void(const step_report&)> on_step;
};

status run_demo(caf::actor_system& sys, const demo_command& cmd, std::FILE* out);

} // namespace stitch::node
