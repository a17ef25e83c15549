#pragma once

#include <caf/fwd.hpp>

#include <cstdio>
#include <string>

#include "actors/messages.hpp"
#include "runtime/core/error.hpp"
#include "runtime/node/cli.hpp"

namespace stitch::node {

struct publish_command {
  host_port coordinator;
  publish_args args;
  std::string directory;
  /// Stream the tensors even when the node could read the directory itself.
  bool stream = false;
};

/// `stitch publish`: hands the directory's path to the publisher when the
/// node is on this machine, or streams its tensors in chunks of at most
/// `max_chunk_bytes`. Prints what was (or, with --dry-run, would be) published.
result<publish_summary> run_publish(caf::actor_system& sys, const publish_command& cmd,
                                    std::FILE* out);

struct export_command {
  host_port coordinator;
  std::string pool = "default";
  std::string version;
  std::string out_dir;
};

/// `stitch export`: rebuilds a version from the store actor's chunks and
/// writes a standard HF directory.
status run_export(caf::actor_system& sys, const export_command& cmd, std::FILE* out);

struct status_command {
  host_port coordinator;
  bool json = false;
};

/// `stitch status [--json]`: the cluster as the status actor sees it — the
/// pools' pointers and every replica's applied version and sync state.
status run_status(caf::actor_system& sys, const status_command& cmd, std::FILE* out);

struct init_model_command {
  std::string preset = "tiny";
  uint64_t seed = 0;
  std::string out_dir;
};

/// `stitch init-model`: writes a deterministic random-init boot checkpoint of
/// the built-in model (safetensors shards, index and `config.json`).
status run_init_model(const init_model_command& cmd, std::FILE* out);

} // namespace stitch::node
