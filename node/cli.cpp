#include "node/cli.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "runtime/core/token.hpp"
#include "transport/capability.hpp"

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

/// A token in `file`: its text without trailing whitespace, at most 4 KiB,
/// printable, not empty. `also_given`: the setting itself (`key`) is set
/// too, which is refused (two sources of one secret).
result<std::string> read_token_file(const std::filesystem::path& file, bool also_given,
                                    std::string_view key) {
  const std::string name = quote_untrusted(file.string());
  if (also_given)
    return make_error(errc::invalid_argument,
                      std::string{key} + " is set too; give the token one way");
  std::ifstream in{file, std::ios::binary};
  if (!in)
    return make_error(errc::invalid_argument, "cannot read " + name);
  std::string text(4097, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > 4096)
    return make_error(errc::invalid_argument, name + " holds more than 4 KiB: not a token");
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.pop_back();
  if (text.empty())
    return make_error(errc::invalid_argument, name + " is empty");
  for (char c : text)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      return make_error(errc::invalid_argument,
                        name + " holds a control character: one token on one line");
  return text;
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
  if (!s.admin_token_file.empty()) {
    if (auto token = read_token_file(s.admin_token_file, !s.admin_token.empty(),
                                     "admin.token (or STITCH_TOKEN)");
        token)
      s.admin_token = std::move(*token);
    else
      problems += "admin.token_file: " + token.error().message + "\n";
  }
  if (!s.member_token_file.empty()) {
    if (auto token =
          read_token_file(s.member_token_file, !s.member_token.empty(), "admin.member_token");
        token)
      s.member_token = std::move(*token);
    else
      problems += "admin.member_token_file: " + token.error().message + "\n";
  }
  // A node with the admin token presents the capability derived from it; a
  // member token given too must be that one (else the node could not talk
  // to its own cluster, or was given another cluster's).
  if (!s.admin_token.empty()) {
    auto derived = transport::member_capability(s.admin_token);
    if (!s.member_token.empty() && !token_matches(derived, s.member_token))
      problems += "admin.member_token: not the member token of admin.token (stitch member-token "
                  "prints it); set one of the two\n";
    s.member_token = std::move(derived);
  }
  config::validate(s, problems);
  if (!problems.empty()) {
    problems.pop_back();
    return make_error(errc::invalid_argument, problems);
  }
  return s;
}

} // namespace stitch::node
