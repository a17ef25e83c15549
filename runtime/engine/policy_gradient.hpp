#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/pipeline/host_tensors.hpp"

namespace stitch::engine {

/// One rollout as a trainer consumes it: what was generated, the logprobs the
/// behaviour policy (the replica's weights) gave its tokens, the reward, and
/// the version that produced it (its start stamp).
struct rollout_sample {
  std::string prompt;
  std::vector<int32_t> tokens;
  std::vector<float> behaviour_logprobs;
  double reward = 0;
  uint64_t version = 0;
  /// The version that produced each token (the answer's
  /// `weight_version_spans`); empty: every token came from `version`.
  std::vector<uint64_t> token_versions;
  /// Mixtures of experts: the experts the rollout routed each fed position
  /// to (the answer's `routed_experts`, `[position][layer][k]`); the trainer
  /// replays them. Empty: the trainer routes with its own router.
  std::vector<int32_t> routed_experts;
};

struct pg_options {
  /// Step size on the output head.
  double learning_rate = 0.5;
  /// Truncated importance weight: min(clip, pi/mu) for stale samples.
  double clip = 2.0;
  /// The sampling temperature the logprobs were taken at.
  double temperature = 1.0;
  /// Stale tokens count less: a token produced by the version `d` behind
  /// `current_version` is weighted by `staleness_decay^d` on top of its
  /// importance weight (1 = no decay). Per token, so a generation that
  /// crossed an activation weighs its older tokens less than its newer ones.
  double staleness_decay = 1.0;
  uint64_t current_version = 0;
  /// Mixtures of experts: step size on the last layer's router
  /// (`mlp.gate`), whose gradient flows through the mixing weights of the
  /// experts used (the replayed ones when the sample has routing). 0 trains
  /// the output head alone.
  double router_learning_rate = 0.0;
};

struct pg_stats {
  double mean_reward = 0;
  double mean_importance_weight = 0;
  size_t tokens = 0;
  /// Versions behind `current_version`, averaged over tokens.
  double mean_token_staleness = 0;
  /// Tokens whose version differs from their sample's start version (they
  /// came after an in_place activation the generation crossed).
  size_t crossed_tokens = 0;
  /// Mixtures of experts: (position, layer) routing choices replayed, and
  /// how many of them the trainer's own router would have chosen otherwise
  /// (as a set of experts).
  uint64_t routing_decisions = 0;
  uint64_t routing_disagreements = 0;
};

/// One policy-gradient step that trains the output head (`lm_head`) and, for a
/// mixture of experts with `router_learning_rate`, the last layer's router:
/// REINFORCE with the batch's mean reward as baseline, each token weighted by
/// the truncated importance ratio min(clip, pi_current / pi_behaviour), so
/// samples produced by older versions still count but cannot blow up the
/// update. The gradient is written by hand: d log pi(a | h) / d W[v] =
/// (1[v = a] - p_v) h / T, with h the final normalized hidden state; the
/// router's is carried back through the final norm into the mixing weights.
/// A sample with routing is teacher-forced with that routing replayed (its
/// length must match the sample). fp32 checkpoints only (bf16 is refused by
/// name). `weights` is updated in place.
result<pg_stats> policy_gradient_step(pipeline::tensor_set& weights, const model_config& config,
                                      std::span<const rollout_sample> batch,
                                      const pg_options& options = {});

} // namespace stitch::engine
