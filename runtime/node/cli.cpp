#include "runtime/node/cli.hpp"

#include <charconv>
#include <cstdlib>

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
  auto fail = [&] {
    return make_error(errc::invalid_argument,
                      "'" + std::string{text} + "' is not of the form HOST:PORT");
  };
  host_port out;
  std::string_view port;
  if (text.starts_with('[')) {
    auto close = text.find("]:");
    if (close == std::string_view::npos)
      return fail();
    out.host = std::string{text.substr(1, close - 1)};
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos || text.find(':') != colon)
      return fail();
    out.host = std::string{text.substr(0, colon)};
    port = text.substr(colon + 1);
  }
  unsigned value = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (out.host.empty() || port.empty() || ec != std::errc{} || ptr != port.data() + port.size()
      || value > 65535)
    return fail();
  out.port = static_cast<uint16_t>(value);
  return out;
}

bool is_loopback(std::string_view host) {
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

std::string node_settings::effective_store_uri() const {
  if (!store_uri.empty())
    return store_uri;
  return "rocksdb:" + (data_dir / "store").string();
}

result<node_settings> resolve_settings(const node_options& opts) {
  node_settings s;
  s.data_dir = opts.data_dir;
  std::string problems;
  auto apply = [&](const std::string& key, const std::string& value, const std::string& origin) {
    if (key == "coordinator.listen") {
      auto hp = parse_host_port(value);
      if (!hp)
        problems += origin + " coordinator.listen: " + hp.error().message + "\n";
      else
        s.coordinator = *hp;
    } else if (key == "store.uri") {
      if (!value.starts_with("rocksdb:") && !value.starts_with("s3://"))
        problems +=
          origin + " store.uri: '" + value + "' is neither rocksdb:PATH nor s3://bucket/prefix\n";
      else
        s.store_uri = value;
    } else {
      problems += origin + " " + key + ": unknown key (this build knows coordinator.listen and "
                  + "store.uri)\n";
    }
  };
  for (const auto& [env, key] : {std::pair{"STITCH_COORDINATOR__LISTEN", "coordinator.listen"},
                                 std::pair{"STITCH_STORE__URI", "store.uri"}})
    if (const char* v = std::getenv(env))
      apply(key, v, std::string{"environment "} + env + ":");
  for (const auto& assignment : opts.overrides) {
    if (auto problem = check_override(assignment); !problem.empty()) {
      problems += problem + "\n";
      continue;
    }
    auto eq = assignment.find('=');
    apply(assignment.substr(0, eq), assignment.substr(eq + 1), "--set");
  }
  if (!opts.config_path.empty())
    problems += "--config: role config files are not supported by this build yet\n";
  if (!problems.empty()) {
    problems.pop_back();
    return make_error(errc::invalid_argument, problems);
  }
  return s;
}

std::string to_toml(const node_settings& s) {
  std::string out;
  out += "data_dir = \"" + s.data_dir.string() + "\"\n\n";
  out += "[coordinator]\nlisten = \"" + s.coordinator.host + ":"
         + std::to_string(s.coordinator.port) + "\"\n\n";
  out += "[store]\nuri = \"" + s.effective_store_uri() + "\"\n";
  return out;
}

} // namespace stitch::node
