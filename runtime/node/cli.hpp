#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/error.hpp"

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

struct host_port {
  std::string host;
  uint16_t port = 0;
};

/// Parses `HOST:PORT` (`[::1]:PORT` for IPv6); port 0 means "pick a free one".
result<host_port> parse_host_port(std::string_view text);

/// True for 127.0.0.0/8, ::1 and localhost.
bool is_loopback(std::string_view host);

/// The effective settings of a node: defaults, then `STITCH_<SECTION>__<KEY>`
/// environment variables, then `--set` overrides.
struct node_settings {
  std::filesystem::path data_dir = "./stitch-data";
  host_port coordinator{"127.0.0.1", 4242};
  /// Empty: `rocksdb:<data_dir>/store`.
  std::string store_uri;
  /// Built-in engine replicas of pool `default` (`replicas`).
  uint32_t replicas = 2;
  /// `model.preset`: the built-in model the replicas run.
  std::string model_preset = "tiny";
  host_port gateway{"127.0.0.1", 8080};
  host_port status{"127.0.0.1", 8081};
  /// Replica i serves on this port + i (port 0: each picks a free one).
  host_port replica_listen{"127.0.0.1", 8100};
  std::string commit_mode = "in_place";
  /// Seconds.
  double drain_timeout = 300;
  double backstop = 5;
  /// `http.body_limit` in bytes.
  uint64_t body_limit = uint64_t{16} << 20;
  /// `gateway.affinity_headers`: session headers, first present wins.
  std::vector<std::string> affinity_headers = {"X-Session-Id", "Modal-Session-ID"};
  /// `admin.token` (also `STITCH_TOKEN`).
  std::string admin_token;

  std::string effective_store_uri() const;
};

/// Resolves the settings; every unknown key or bad value is reported, one
/// problem per line, in the error.
result<node_settings> resolve_settings(const node_options& opts);

/// The effective settings as TOML (`--print-config`).
std::string to_toml(const node_settings& s);

} // namespace stitch::node
