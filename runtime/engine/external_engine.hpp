#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/core/engine_kind.hpp"
#include "runtime/core/engine_port.hpp"
#include "runtime/engine/engine_process.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "transport/http_client.hpp"

namespace stitch::engine {

struct external_engine_options {
  /// sglang or vllm (an external engine is never `builtin`).
  engine_kind kind = engine_kind::sglang;
  /// The engine, when it already runs (`engine.url`); with `launch`, empty.
  std::string url;
  /// The engine is started (and supervised) by the replica (`engine.launch`).
  std::optional<launch_options> launch;
  /// Where versions are materialized for the engine to load: this replica's
  /// own folder (`engine.staging_dir`/<replica>).
  std::filesystem::path staging_dir;
  /// A generation (or any pass-through call) may wait this long for each
  /// read of the engine's answer.
  std::chrono::milliseconds request_timeout{600'000};
  /// A weight update (pause, load, resume, verify) may take this long.
  std::chrono::milliseconds update_timeout{600'000};
  /// A launched engine must answer its health route within this long.
  std::chrono::milliseconds ready_timeout{900'000};
  /// Control calls that should answer at once (health, version, pause).
  std::chrono::milliseconds control_timeout{30'000};
  /// How often the engine's health and served version are checked.
  std::chrono::milliseconds monitor_every{2'000};
  /// Shard size of the staged directories.
  uint64_t max_shard_bytes = 5'000'000'000;
  /// A delta whose changed tensors hold at most this many bytes is loaded
  /// alone (a partial reload: SGLang is given a folder of just those
  /// tensors, then each is read back and compared before serving); 0: every
  /// load is a full reload (`engine.partial_reload_max_bytes`).
  uint64_t partial_reload_max_bytes = uint64_t{256} << 20;
  /// Log lines of the adapter (warnings about the engine), with the
  /// replica's name added by the caller.
  std::function<void(std::string_view line)> log;
};

/// The Engine port over an external SGLang or vLLM server, through its HTTP
/// API (the endpoints each dialect uses are listed in `external_dialects.cpp`,
/// with the sources they follow). Targets: SGLang 0.5.6 and later (in_place
/// pauses; 0.4.9 to 0.5.5 with commit_mode quiesce), both the 2025 routes
/// (`/get_model_info`, `/get_weight_version`) and the 2026 ones
/// (`/model_info`); vLLM 0.16 and later with VLLM_SERVER_DEV_MODE=1.
///
/// - `stage` materializes the target version as a Hugging Face directory
///   under the staging folder while the engine keeps serving: a full anchor
///   is streamed from the store; a delta rewrites only the shards holding
///   tensors it changes (the others are hard-linked from the previous
///   staged version), every written tensor verified against the manifest.
///   Replicas of one node stage into sibling folders: a version one of them
///   staged is linked by the others, so the node's staging tmpfs holds one
///   copy of each version. A version whose `config.json` changes the
///   architecture the engine was
///   started with is refused (the engine loads weights, not architectures).
/// - `pause`/`commit`/`resume` are the engine's own pause, weight reload
///   from the staged directory (labelled with the version's identity), and
///   resume; the commit is verified by reading back the version the engine
///   reports. A delta that changes few tensors is a partial reload on SGLang:
///   the engine loads a folder holding only them over the version it serves,
///   and each is read back (`/get_weights_by_name`) and compared with the
///   staged bytes before the engine serves again; anything that makes a
///   partial load inexact falls back to the full reload, saying why
///   (`last_load`).
/// - `forward` passes versioned and other routes to the engine (streams
///   event by event); a caller going away closes the engine connection,
///   which aborts the engine's request.
/// - A monitor checks the engine's health and served version every
///   `monitor_every`: an engine that restarted (a crash of a launched one,
///   restarted with back-off; or an external one restarted by its owner) is
///   taken out of service until the last committed version is loaded into it
///   again and verified. Garbage answers, hangs and closed connections are
///   errors naming the engine, kept in `health()`.
class external_engine final : public engine_port {
public:
  /// Starts nothing yet: a launched engine starts at the first commit, from
  /// the directory staged for it.
  static result<std::shared_ptr<external_engine>> make(external_engine_options options);
  ~external_engine() override;
  external_engine(const external_engine&) = delete;
  external_engine& operator=(const external_engine&) = delete;

  status prefetch(const chain_plan& plan) override;
  status stage(const chain_plan& plan, bool onto_shadow, tensor_source& source) override;
  void discard_shadow() override;
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
  /// Not blocking: what the last calls and the monitor saw.
  engine_health health() override;
  std::optional<std::string> route_refusal(std::string_view method,
                                           std::string_view route) const override;
  std::optional<engine_load_report> last_load() override;

  /// Whether the engine reports the version it serves (SGLang; a vLLM with
  /// its weight-version routes), so the monitor checks it.
  bool verifies_versions() const;
  /// `sglang http://127.0.0.1:30000`, for logs and `server_info`.
  std::string describe() const;
  /// The launched process (null with `url`, or before the first commit).
  engine_process* process();
  /// The directory of the version the engine serves (empty before the first commit).
  std::filesystem::path committed_dir() const;
  /// The identity the engine is told for `ref` (`<run>/v<version>`).
  static std::string weight_version_of(const version_ref& ref);

  struct dialect;

private:
  explicit external_engine(external_engine_options options);

  struct staged {
    version_ref ref;
    std::filesystem::path dir;
    /// The version's config.json (empty when it has none).
    std::string config;
    /// Its architecture differs from the running engine's: a launched
    /// engine is restarted from it instead of reloading weights.
    bool restart = false;
    /// A folder beside `dir` holding only the tensors the plan's deltas
    /// changed over `partial_base` (empty: a full reload, for `full_reason`).
    std::filesystem::path partial_dir;
    version_ref partial_base;
    std::vector<std::string> partial_tensors;
    /// Their digests in the version's manifest (the read back is checked
    /// against them through the staged bytes).
    std::map<std::string, uint64_t> partial_digests;
    uint64_t partial_bytes = 0;
    std::string full_reason;
    /// The version's tensors and their bytes (what a full reload loads).
    uint64_t total_tensors = 0;
    uint64_t total_bytes = 0;
  };

  /// A client for control calls (serialized) or one from the pool.
  transport::http_client& control();
  std::unique_ptr<transport::http_client> take_client();
  void give_client(std::unique_ptr<transport::http_client> c);
  /// The engine's answer to `call`, as it comes.
  result<engine_reply> pass_through(const engine_call& call, const event_sink& on_event,
                                    const std::function<bool()>& cancelled);
  /// vLLM: SGLang's `/generate` through `/v1/completions`, answered in
  /// SGLang's native shape (streams included).
  result<engine_reply> generate_over_completions(const engine_call& call,
                                                 const event_sink& on_event,
                                                 const std::function<bool()>& cancelled);
  /// Writes `next` from `base` (the staged version the plan's deltas start
  /// from): shards without a changed tensor are hard-linked, the others
  /// rewritten with the changed tensors patched and verified.
  status write_delta(const staged& base, const chain_plan& plan, const manifest& target,
                     tensor_source& source, const staged& next);
  /// Links `next` from another replica's staging folder next to this one
  /// (same version, already verified there); false when none has it.
  bool link_sibling_copy(const staged& next);
  /// Empty when the engine answers its health route now, else why not;
  /// the caller holds `control_mutex_`.
  std::string probe_health(std::chrono::milliseconds timeout);
  /// Whether the engine answers its health route now.
  bool answers_health();
  /// The engine's pause and resume calls.
  status pause_engine();
  status resume_engine();
  /// Loads `s` into the engine and checks it reports `s`'s identity;
  /// `partial`: only its changed tensors, over the version the engine
  /// serves (`s.partial_base`), each read back. Records `last_load_`.
  status load_and_verify(const staged& s, bool partial = false);
  /// SGLang: `/update_weights_from_disk` of `dir`, labelled `id`, and the
  /// version it reports afterwards checked.
  status sglang_load(const std::filesystem::path& dir, const std::string& id);
  /// Why `next` (staged for `plan` over `base`) cannot be a partial
  /// reload; empty when it can.
  std::string partial_refusal(const chain_plan& plan, const std::optional<staged>& base,
                              bool onto_shadow, const staged& next,
                              const pipeline::hf_checkpoint& staged_dir) const;
  /// Writes `next.partial_dir` from `next.dir`'s changed tensors, to load
  /// over `base`.
  status write_partial(staged& next, const chain_plan& plan, const version_ref& base,
                       const manifest& target, const pipeline::hf_checkpoint& staged_dir);
  /// Reads each of `s.partial_tensors` back from the engine and compares
  /// it with the staged bytes. A tensor the engine cannot read back (a
  /// model without the route's support) sets `*unanswerable` to why.
  status read_back(const staged& s, std::string* unanswerable);
  /// Starts the launched engine from `dir` and waits until it answers.
  status launch_from(const std::filesystem::path& dir);
  /// `exited`: set when a launched engine's process ended meanwhile.
  status wait_ready(std::chrono::milliseconds limit, bool* exited = nullptr);
  /// Where the engine answers (its port changes when a launch retries).
  transport::http_endpoint endpoint() const;
  void move_to_port(uint16_t port);
  void monitor();
  void note_problem(std::string message);
  void note_lost(std::string why);
  /// Removes staged folders other than the committed and shadow ones.
  void prune_staging();

  external_engine_options opts_;
  const dialect* dialect_ = nullptr;
  mutable std::mutex endpoint_mutex_;
  transport::http_endpoint endpoint_;

  mutable std::mutex mutex_;
  std::optional<staged> committed_;
  std::optional<staged> shadow_;
  /// The identity of the version committed before `committed_`.
  std::string previous_version_;
  /// The architecture (config.json) the engine was started with.
  std::string boot_config_;
  /// The engine serves `committed_` (verified); false after it was seen to
  /// restart, until the monitor reloaded it.
  bool in_sync_ = false;
  bool paused_ = false;
  /// vLLM: whether it has the weight-version routes (`/update_weight_version`,
  /// `/weight_info`); unknown before the first load.
  std::optional<bool> vllm_versions_;
  /// Why partial reloads are off for this engine (it could not read a
  /// tensor back); empty while they are on.
  std::string partial_off_;
  std::optional<engine_load_report> last_load_;
  std::string last_problem_;
  std::unique_ptr<engine_process> process_;
  uint64_t process_starts_seen_ = 0;

  /// Commits, rebuilds and the monitor's re-syncs go one at a time.
  std::mutex sync_mutex_;
  /// Control calls (and the monitor's) go one at a time.
  std::mutex control_mutex_;
  std::unique_ptr<transport::http_client> control_client_;
  std::mutex pool_mutex_;
  std::vector<std::unique_ptr<transport::http_client>> idle_clients_;

  /// Set first thing by the destructor; `closing_` reads it (control calls
  /// poll it and give up).
  std::atomic<bool> closing_flag_{false};
  std::function<bool()> closing_;
  std::mutex monitor_mutex_;
  std::condition_variable monitor_wake_;
  bool stopping_ = false;
  std::thread monitor_;
};

} // namespace stitch::engine
