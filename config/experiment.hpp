#pragma once

#include <string>
#include <string_view>

#include "runtime/core/cluster_plan.hpp"
#include "runtime/core/error.hpp"

namespace stitch::config {

/// Parses an experiment file (`stitch submit experiment.toml`):
///
///     run_id = "exp1"          # required
///     pool = "default"
///     replicas = 2
///     commit_mode = "in_place" # or "quiesce"
///     [boot]                   # the run's anchor: built-in model, seed, version
///     preset = "tiny"
///     seed = 7
///     dir = "/ckpt"            # or: this HF directory (read by the publisher's node)
///     version = 0
///     [trainer]                # the built-in trainer and its rollout driver
///     enabled = true
///     steps = 30
///     samples_per_step = 16
///     staleness = 2            # min_version = latest - staleness
///     learning_rate = 0.5
///
/// Every problem (syntax, unknown key, wrong type, out of range, a missing
/// run_id) is reported in one `invalid_argument`, one line each, naming the
/// key path and `origin`.
result<experiment_spec> parse_experiment(std::string_view toml_text, std::string_view origin);

/// Reads and parses the file at `path`.
result<experiment_spec> load_experiment(const std::string& path);

} // namespace stitch::config
