#pragma once

// The built-in rollout driver's client side: one rollout of the demo's toy
// task through a gateway over HTTP, checked against its constraint. Shared by
// the trainer (rollouts in process) and the rollout driver role.

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/engine/policy_gradient.hpp"

namespace stitch::engine {

/// The toy task's verifiable reward: the share of generated tokens that are
/// lowercase letters.
double lowercase_reward(const std::vector<int32_t>& tokens);

struct rollout_target {
  std::string host;
  uint16_t port = 0;
  std::string pool = "default";
  /// Ask for the experts every position was routed to (mixtures of
  /// experts), kept in each sample for the trainer to replay.
  bool routed_experts = false;
};

struct rollout_result {
  bool ok = false;
  rollout_sample sample;
  /// The answer's `weight_version_start` was below the asked `min_version`.
  bool violation = false;
  std::string error;
};

/// One rollout through the gateway with `min_version`, retrying a retryable
/// 409/503 (bounded, about 30 s); `stop` ends the retries early.
rollout_result rollout_once(const rollout_target& gateway, uint64_t min_version, uint64_t seed,
                            const std::atomic<bool>* stop = nullptr);

/// `count` rollouts at once (one thread each), seeds `seed_base + i`.
std::vector<rollout_result> rollout_batch(const rollout_target& gateway, uint64_t min_version,
                                          uint32_t count, uint64_t seed_base,
                                          const std::atomic<bool>* stop = nullptr);

} // namespace stitch::engine
