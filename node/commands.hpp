#pragma once

#include <caf/fwd.hpp>

#include <chrono>
#include <cstdio>
#include <string>

#include "actors/cluster_types.hpp"
#include "actors/publisher_actor.hpp"
#include "node/cli.hpp"
#include "runtime/core/error.hpp"
#include "runtime/pipeline/host_tensors.hpp"

#include <optional>

namespace stitch::node {

/// "1.5 MiB".
std::string human_bytes(uint64_t n);

/// Calls `f(out)` with an `out` that discards what is written to it (the
/// report of a command run on someone's behalf).
template <class F>
auto with_quiet_output(F&& f) {
  struct closer {
    std::FILE* file;
    ~closer() {
      if (file)
        std::fclose(file);
    }
  } quiet{std::fopen("/dev/null", "w")};
  return f(quiet.file ? quiet.file : stderr);
}

struct publish_command {
  host_port coordinator;
  publish_args args;
  std::string directory;
  /// Stream the tensors even when the node could read the directory itself.
  bool stream = false;
  /// How long a publisher that is `busy` (its sessions or its pool's queue
  /// all taken; nothing of the publish started) is asked again, once a
  /// second, before the CLI gives up; 0 = not at all.
  std::chrono::seconds retry_budget{60};
};

/// `stitch publish`: hands the directory's path to the publisher when the
/// node is on this machine, or streams its tensors: over the publisher's
/// HTTP surface when it has one this process can reach (`http_publish.hpp`),
/// else as CAF messages in chunks of at most `max_chunk_bytes`. A `busy`
/// publisher is asked again within `retry_budget` (a line on stderr each
/// time). Prints what was (or, with --dry-run, would be) published.
result<pipeline::publish_report> run_publish(caf::actor_system& sys, const publish_command& cmd,
                                             std::FILE* out);

struct export_command {
  host_port coordinator;
  /// Empty: the pool that holds the run (refused when several do).
  std::string pool;
  std::string version;
  std::string out_dir;
  /// Stream the bytes here even when the store's node is on this machine.
  bool stream = false;
  /// fsync the files before the directory appears.
  bool sync = false;
  /// Bytes buffered while streaming.
  uint64_t buffer_bytes = uint64_t{64} << 20;
  std::string token;
};

struct gc_command {
  host_port coordinator;
  /// Empty: every pool.
  std::string pool;
  /// Newest versions kept per run; 0 = the publisher's `store.retain_versions`.
  uint32_t keep = 0;
  bool dry_run = false;
  bool json = false;
  std::string token;
};

/// `stitch gc`: applies retention through the publisher (the same rules as
/// after every publish) and prints each version removed and each kept with
/// the reason (boot, pinned, newest, chain).
status run_gc(caf::actor_system& sys, const gc_command& cmd, std::FILE* out);

/// `stitch export`: writes a version as a standard HF directory, byte for
/// byte what was published. With the store's node on this machine, that node
/// writes it (no bytes cross a connection); otherwise they stream from the
/// store actor, a window of chunks in flight, in memory bounded by
/// `buffer_bytes` whatever the model size.
status run_export(caf::actor_system& sys, const export_command& cmd, std::FILE* out);

struct status_command {
  host_port coordinator;
  bool json = false;
};

/// `stitch status [--json]`: the cluster as the status actor sees it — the
/// pools' pointers and every replica's applied version and sync state.
status run_status(caf::actor_system& sys, const status_command& cmd, std::FILE* out);

struct submit_command {
  host_port coordinator;
  std::string file;
  std::string token;
};

/// `stitch submit experiment.toml`: the coordinator claims the run (publishing
/// its boot checkpoint), places its replicas and trainer, or refuses with the
/// reason.
status run_submit(caf::actor_system& sys, const submit_command& cmd, std::FILE* out);

struct scale_command {
  host_port coordinator;
  /// Empty: the only active experiment.
  std::string run;
  uint32_t replicas = 1;
  std::string token;
};

/// `stitch scale --replicas N [--run R]`: new replicas self-sync and enter
/// rotation when ready; removed ones drain first.
status run_scale(caf::actor_system& sys, const scale_command& cmd, std::FILE* out);

struct stop_command {
  host_port coordinator;
  std::string run;
  std::string token;
};

/// `stitch stop RUN`: the run's replicas drain and leave, its trainer stops.
status run_stop(caf::actor_system& sys, const stop_command& cmd, std::FILE* out);

/// Where a trainer left off: the latest version of `run_id` in `pool` and its
/// weights, when the pool's pointer is at that run, at `min_version` or later.
struct resume_point {
  uint64_t version = 0;
  pipeline::tensor_set weights;
};
result<std::optional<resume_point>>
find_resume_point(caf::actor_system& sys, const host_port& coordinator, const std::string& pool,
                  const std::string& run_id, uint64_t min_version);

struct init_model_command {
  std::string preset = "tiny";
  uint64_t seed = 0;
  std::string out_dir;
};

/// `stitch init-model`: writes a deterministic random-init boot checkpoint of
/// the built-in model (safetensors shards, index and `config.json`).
status run_init_model(const init_model_command& cmd, std::FILE* out);

} // namespace stitch::node
