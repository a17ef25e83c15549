#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>

#include "runtime/core/engine_port.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "runtime/engine/weights.hpp"
#include "runtime/store/host_tensors.hpp"

namespace stitch::engine {

/// The built-in engine behind the Engine port: the Llama-architecture model of
/// this folder on the CPU. Staging rebuilds the target's tensors into a shadow
/// (seeded from an anchor or copied from the serving tensors, deltas applied,
/// every touched tensor's checksum verified) and prepares its weights; commit
/// swaps two pointers, so the pause does not grow with model size. Requests
/// read the served weights at every step, so one in flight across an in_place
/// commit continues on the new weights. Thread-safe.
class builtin_engine final : public engine_port {
public:
  explicit builtin_engine(model_config config);

  status prefetch(const chain_plan& plan) override;
  status stage(const chain_plan& plan, bool onto_shadow, tensor_source& source) override;
  void discard_shadow() override;
  status commit() override;
  status pause() override;
  status resume() override;
  status flush_cache() override;
  status reset_to_boot(const version_ref& ref, tensor_source& source) override;
  result<generation_result> generate(const generation_request& request,
                                     const std::function<bool()>& cancelled) override;
  std::string stamp_response(std::string_view route, std::string_view body, const stamps& s,
                             std::string_view run_id) override;
  engine_health health() override;
  std::vector<std::string> blocked_routes() const override;

  /// The weights served now (null before the first commit).
  std::shared_ptr<const weights> served() const;
  const model_config& config() const noexcept { return config_; }

private:
  struct shadow {
    store::tensor_set tensors;
    std::shared_ptr<const weights> prepared;
  };

  /// Waits while paused, then returns the served weights.
  std::shared_ptr<const weights> current();

  model_config config_;
  tokenizer tokenizer_;
  mutable std::mutex mutex_;
  std::condition_variable resumed_;
  bool paused_ = false;
  std::shared_ptr<const weights> serving_;
  std::shared_ptr<const store::tensor_set> serving_tensors_;
  std::optional<shadow> shadow_;
  /// What the last commit replaced; freed by the next stage, not inside the
  /// pause (freeing a model's memory takes time that grows with its size).
  std::shared_ptr<const weights> retired_weights_;
  std::shared_ptr<const store::tensor_set> retired_tensors_;
};

} // namespace stitch::engine
