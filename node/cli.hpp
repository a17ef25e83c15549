#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "config/node_config.hpp"
#include "runtime/core/error.hpp"

namespace stitch::node {

/// The options of `stitch-node` (DESIGN §7), as parsed from the command line.
struct node_options {
  std::string config_path;
  /// Empty: the config's `data_dir` (default `./stitch-data`).
  std::string data_dir;
  std::vector<std::string> overrides;
  bool print_config = false;
};

/// Exit codes shared by `stitch-node` and `stitch` (DESIGN §7).
enum exit_code : int { exit_ok = 0, exit_runtime_failure = 1, exit_usage = 2 };

/// Checks one `--set KEY=VALUE` override: a dotted key and a value. Returns
/// an empty string when valid, the problem otherwise.
std::string check_override(const std::string& assignment);

struct host_port {
  std::string host;
  uint16_t port = 0;
};

/// Parses `HOST:PORT` (`[::1]:PORT` for IPv6); port 0 means "pick a free one".
result<host_port> parse_host_port(std::string_view text);

/// True for 127.0.0.0/8, ::1 and localhost.
using config::is_loopback;

/// A token kept in `file` (`admin.token_file`, `stitch --token-file`): its
/// text without trailing whitespace, one printable line of at most 4 KiB.
/// `also_given`: the token was given another way too (`key` names it),
/// which is refused: one secret, one source.
result<std::string> read_token_file(const std::filesystem::path& file, bool also_given,
                                    std::string_view key);

/// The effective config of a node (`config::node_config`): the `--config`
/// file (or the all-in-one defaults), then `STITCH_<SECTION>__<KEY>`
/// environment variables (`STITCH_TOKEN` is `admin.token`), then `--set`
/// overrides, then `--data-dir`. Every problem is reported, one per line.
using node_settings = config::node_config;
result<node_settings> resolve_settings(const node_options& opts);

/// `--print-config` is `config::to_toml` of the resolved settings.
using config::to_toml;

} // namespace stitch::node
