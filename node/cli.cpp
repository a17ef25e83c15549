#include "node/cli.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

namespace stitch::node {

std::string check_override(const std::string& assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos)
    return "override '" + assignment + "' is not of the form KEY=VALUE";
  if (eq == 0)
    return "override '" + assignment + "' has an empty key";
  for (char c : assignment.substr(0, eq)) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'
              || c == '.';
    if (!ok)
      return "override key '" + assignment.substr(0, eq)
             + "' may only contain letters, digits, '_' and '.'";
  }
  return {};
}

result<host_port> parse_host_port(std::string_view text) {
  auto parsed = config::parse_listen_address(text);
  if (!parsed)
    return std::move(parsed).error();
  return host_port{parsed->host, parsed->port};
}

bool is_loopback(std::string_view host) {
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

result<node_settings> resolve_settings(const node_options& opts) {
  node_settings s;
  std::string problems;
  if (!opts.config_path.empty()) {
    std::ifstream in{opts.config_path, std::ios::binary};
    if (!in)
      return make_error(errc::invalid_argument, "--config: cannot read " + opts.config_path);
    std::stringstream text;
    text << in.rdbuf();
    // Checked across keys once the environment and --set have applied. A
    // file with problems of its own is reported with every problem it has.
    auto parsed = config::parse_node_config(text.str(), opts.config_path, false);
    if (!parsed)
      return config::parse_node_config(text.str(), opts.config_path).error();
    s = std::move(*parsed);
  }
  for (const auto& key : config::setting_keys()) {
    auto env = config::env_name(key);
    if (const char* v = std::getenv(env.c_str()))
      config::apply_setting(s, key, v, "environment " + env + ":", problems);
  }
  if (const char* token = std::getenv("STITCH_TOKEN"))
    config::apply_setting(s, "admin.token", token, "environment STITCH_TOKEN:", problems);
  for (const auto& assignment : opts.overrides) {
    if (auto problem = check_override(assignment); !problem.empty()) {
      problems += problem + "\n";
      continue;
    }
    auto eq = assignment.find('=');
    config::apply_setting(s, assignment.substr(0, eq), assignment.substr(eq + 1), "--set",
                          problems);
  }
  if (!opts.data_dir.empty())
    s.data_dir = opts.data_dir;
  config::validate(s, problems);
  if (!problems.empty()) {
    problems.pop_back();
    return make_error(errc::invalid_argument, problems);
  }
  return s;
}

} // namespace stitch::node
