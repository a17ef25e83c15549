#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "gpu/host_buffer.hpp"
#include "gpu/llama.hpp"
#include "gpu/stager.hpp"
#include "runtime/core/engine_port.hpp"
#include "runtime/engine/device_model.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "runtime/engine/weights.hpp"
#include "runtime/pipeline/host_tensors.hpp"

namespace stitch::engine {

/// The built-in engine behind the Engine port: the Llama-architecture model of
/// this folder on the CPU. Staging builds the target's tensors into a shadow
/// (an anchor read straight into staging buffers, or the serving tensors
/// shared, with only the tensors a delta changes copied and patched; every
/// touched tensor's checksum verified) and prepares its weights as views of
/// them; commit swaps a pointer, so the pause does not grow with model size. Requests
/// read the served weights at every step, so one in flight across an in_place
/// commit continues on the new weights.
///
/// Continuous batching: `generate` hands its request to one decode loop, which
/// steps every active request together, one token each; requests join at the
/// next step and leave when done. `step` is batch invariant and sampling is
/// counter based, so a request's tokens and logprobs do not depend on what
/// shares its batch. Thread-safe.
///
/// On a CUDA device (`options::device`, made with `create`): the host stage
/// above still lands every byte in (pinned) staging buffers, kept for peers;
/// the device copy is built beside it by the staging pipeline (anchors and
/// peers' tensors copied in, delta pieces applied by kernels into copies of
/// the served device tensors, every touched tensor's checksum computed on the
/// device), and the forward pass runs there (`gpu::llama_runner`, one KV
/// slot per request in the batch). Commit still swaps one pointer. The
/// device memory all of it needs is decided and checked up front.
class builtin_engine final : public engine_port {
public:
  struct options {
    /// Requests stepped together at most; more wait for a free slot.
    size_t max_batch = 64;
    /// Where the forward pass runs (`engine.device`).
    engine_device device = engine_device::cpu;
    /// The CUDA device (the replica's first GPU slot).
    int gpu = 0;
    /// Tests, on `create` with `device` cpu: stage the device copy exactly as
    /// on CUDA, but into host memory (gpu/'s stand-in for a device), and
    /// compute on the CPU: the device staging path runs without a GPU.
    bool device_copy_on_host = false;
    /// On a device, an anchor's tensors are read in pieces of this size,
    /// each copied to the device while the next is read.
    size_t device_read_piece = size_t{32} << 20;
  };

  /// Decode-loop counters (for tests and metrics).
  struct batch_stats {
    uint64_t steps = 0;
    uint64_t sequences_stepped = 0;
    size_t largest_batch = 0;
  };

  explicit builtin_engine(model_config config);
  /// A CPU engine (`opts.device` must be cpu: use `create` for a device).
  builtin_engine(model_config config, options opts);
  /// An engine on `opts.device`: on CUDA, refused with the reason when the
  /// build or the machine has no such device, when the model is not one the
  /// CUDA forward pass runs, or when its memory budget does not fit.
  static result<std::shared_ptr<builtin_engine>> create(model_config config, options opts);
  ~builtin_engine() override;
  builtin_engine(const builtin_engine&) = delete;
  builtin_engine& operator=(const builtin_engine&) = delete;

  status prefetch(const chain_plan& plan) override;
  status stage(const chain_plan& plan, bool onto_shadow, tensor_source& source) override;
  void discard_shadow() override;
  void relabel(const version_ref& ref) override;
  status commit() override;
  status pause() override;
  status resume() override;
  status flush_cache() override;
  status reset_to_boot(const version_ref& ref, tensor_source& source) override;
  result<engine_reply> forward(const engine_call& call, const event_sink& on_event,
                               const std::function<bool()>& cancelled) override;
  result<generation_result> generate(const generation_request& request,
                                     const std::function<bool()>& cancelled) override;
  std::string stamp_request(std::string_view route, std::string_view body,
                            const version_ref& served) override;
  std::string stamp_response(std::string_view route, std::string_view body, const stamps& s,
                             std::string_view run_id) override;
  engine_health health() override;
  std::optional<std::string> route_refusal(std::string_view method,
                                           std::string_view route) const override;
  std::optional<host_weights> host_view() override;
  engine_device_usage device_usage() override;
  bool reports_version_spans() const override { return true; }

  /// The weights served now (null before the first commit).
  std::shared_ptr<const weights> served() const;
  /// Bytes taken from other GPUs of this process (`device_fanout`).
  uint64_t bytes_from_local_gpus() const noexcept { return from_local_gpus_; }
  /// The settings the engine was built with (the node's model preset).
  const model_config& config() const noexcept { return config_; }
  /// The architecture served now: the served version's own config.json when
  /// it has one, else `config()`.
  model_config served_config() const;
  /// Requests submitted and not finished (waiting or stepping).
  size_t requests_in_flight() const;
  batch_stats stats() const;

private:
  struct job;
  /// One `stage` call's steps (builtin_stage.cpp).
  struct stage_job;

  /// Staged weights (they hold their tensors), waiting for `commit`.
  struct shadow {
    std::shared_ptr<const weights> prepared;
    version_ref target;
  };

  /// Waits while paused, then returns the served weights.
  std::shared_ptr<const weights> current();
  /// The same, with the version they are (0 before the first commit).
  std::pair<std::shared_ptr<const weights>, uint64_t> current_with_version();
  /// Runs one request through the decode loop and waits for it.
  result<generation_output> run(decoder d, const std::function<bool()>& cancelled,
                                std::function<void(const decoder&)> on_token);
  /// A seed for a request that names none: distinct across engines.
  uint64_t seed_for(uint64_t request_id) const noexcept;
  void decode_loop();
  /// One step of every active job; finished jobs are answered and dropped.
  void step_batch(std::vector<std::shared_ptr<job>>& active);
  /// The step on the device: KV slots given to jobs that have none (and
  /// taken back from jobs that left), one runner step, positions advanced.
  result<step_logits> step_on_device(const weights& w,
                                     const std::vector<std::shared_ptr<job>>& active);

  /// The device side of an engine made by `create` for CUDA.
  struct device_parts {
    int gpu = 0;
    std::string name;
    device_budget budget;
    uint64_t memory_total = 0;
    /// None when the device copy is staged on the host (tests).
    std::unique_ptr<gpu::llama_runner> runner;
    std::unique_ptr<gpu::device_stager> stager;
    /// The job id holding each KV slot (0: free). Decode loop only.
    std::vector<uint64_t> slot_owner;
    /// One version's host tensors kept page-locked when released, for the
    /// version after next (`gpu::host_allocator`'s recycling).
    gpu::recycling_reservation recycling;
  };
  std::unique_ptr<device_parts> device_;
  /// A CPU engine's released host tensors kept for the next versions:
  /// a fresh mapping's first-touch page faults, not the copy, set the pace
  /// of staging into it (transfer_bench's `stage_fresh_ratio`).
  gpu::recycling_reservation host_recycling_;
  uint64_t next_job_id_ = 1;
  std::atomic<uint64_t> from_local_gpus_{0};

  model_config config_;
  tokenizer tokenizer_;
  mutable std::mutex mutex_;
  std::condition_variable resumed_;
  bool paused_ = false;
  std::shared_ptr<const weights> serving_;
  /// The version `serving_` holds (peers read it by this name).
  std::optional<version_ref> serving_ref_;
  std::optional<shadow> shadow_;
  /// What the last commit replaced; freed by the next stage, not inside the
  /// pause (freeing a model's memory takes time that grows with its size).
  std::shared_ptr<const weights> retired_weights_;

  options opts_;
  uint64_t seed_salt_;
  mutable std::mutex jobs_mutex_;
  std::condition_variable jobs_ready_;
  std::vector<std::shared_ptr<job>> incoming_;
  size_t active_jobs_ = 0;
  bool stopping_ = false;
  batch_stats stats_;
  std::thread loop_;
};

} // namespace stitch::engine
