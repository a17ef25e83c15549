#pragma once

#include <string>
#include <vector>

namespace stitch::node {

/// The options of `stitch-node` (DESIGN §7), as parsed from the command line.
struct node_options {
  std::string config_path;
  std::string data_dir = "./stitch-data";
  std::vector<std::string> overrides;
  bool print_config = false;
};

/// Exit codes shared by `stitch-node` and `stitch` (DESIGN §7).
enum exit_code : int { exit_ok = 0, exit_runtime_failure = 1, exit_usage = 2 };

/// Checks one `--set KEY=VALUE` override: a dotted key and a value. Returns
/// an empty string when valid, the problem otherwise.
std::string check_override(const std::string& assignment);

} // namespace stitch::node
