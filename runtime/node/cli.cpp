#include "runtime/node/cli.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <optional>

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
  auto listen = [&](host_port& into, const std::string& key, const std::string& value,
                    const std::string& origin) {
    auto hp = parse_host_port(value);
    if (!hp)
      problems += origin + " " + key + ": " + hp.error().message + "\n";
    else
      into = *hp;
  };
  auto number = [&](const std::string& key, const std::string& value, const std::string& origin,
                    double min, double max) -> std::optional<double> {
    double v = 0;
    auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc{} || ptr != value.data() + value.size() || !(v >= min && v <= max)) {
      problems += origin + " " + key + ": '" + value + "' is not a number in ["
                  + std::to_string(min) + ", " + std::to_string(max) + "]\n";
      return std::nullopt;
    }
    return v;
  };
  auto apply = [&](const std::string& key, const std::string& value, const std::string& origin) {
    if (key == "coordinator.listen") {
      listen(s.coordinator, key, value, origin);
    } else if (key == "gateway.listen") {
      listen(s.gateway, key, value, origin);
    } else if (key == "status.listen") {
      listen(s.status, key, value, origin);
    } else if (key == "replica.listen") {
      listen(s.replica_listen, key, value, origin);
    } else if (key == "store.uri") {
      if (!value.starts_with("rocksdb:") && !value.starts_with("s3://"))
        problems +=
          origin + " store.uri: '" + value + "' is neither rocksdb:PATH nor s3://bucket/prefix\n";
      else
        s.store_uri = value;
    } else if (key == "replicas") {
      if (auto v = number(key, value, origin, 0, 64); v && *v == static_cast<uint32_t>(*v))
        s.replicas = static_cast<uint32_t>(*v);
      else if (v)
        problems += origin + " replicas: '" + value + "' is not a whole number\n";
    } else if (key == "model.preset") {
      if (value != "tiny" && value != "small" && value != "medium")
        problems += origin + " model.preset: '" + value + "' is not tiny, small or medium\n";
      else
        s.model_preset = value;
    } else if (key == "replica.commit_mode") {
      if (value != "in_place" && value != "quiesce")
        problems += origin + " replica.commit_mode: '" + value + "' is not in_place or quiesce\n";
      else
        s.commit_mode = value;
    } else if (key == "replica.drain_timeout") {
      if (auto v = number(key, value, origin, 0, 86400))
        s.drain_timeout = *v;
    } else if (key == "replica.backstop") {
      if (auto v = number(key, value, origin, 0, 86400))
        s.backstop = *v;
    } else if (key == "http.body_limit") {
      if (auto v = number(key, value, origin, 1024, 1 << 30))
        s.body_limit = static_cast<uint64_t>(*v);
    } else if (key == "gateway.affinity_headers") {
      std::vector<std::string> names;
      std::string_view rest{value};
      while (!rest.empty()) {
        auto comma = rest.find(',');
        auto name = rest.substr(0, comma);
        while (!name.empty() && name.front() == ' ')
          name.remove_prefix(1);
        while (!name.empty() && name.back() == ' ')
          name.remove_suffix(1);
        if (!name.empty())
          names.emplace_back(name);
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
      }
      bool valid = std::all_of(names.begin(), names.end(), [](const std::string& n) {
        return std::all_of(n.begin(), n.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
        });
      });
      if (!valid)
        problems += origin + " gateway.affinity_headers: '" + value
                    + "' is not a comma-separated list of header names\n";
      else
        s.affinity_headers = std::move(names);
    } else if (key == "admin.token") {
      s.admin_token = value;
    } else {
      problems += origin + " " + key + ": unknown key (this build knows coordinator.listen, "
                  + "store.uri, replicas, model.preset, gateway.listen, status.listen, "
                  + "replica.listen, replica.commit_mode, replica.drain_timeout, "
                  + "replica.backstop, http.body_limit, gateway.affinity_headers, admin.token)\n";
    }
  };
  for (const auto& [env, key] :
       {std::pair{"STITCH_COORDINATOR__LISTEN", "coordinator.listen"},
        std::pair{"STITCH_STORE__URI", "store.uri"},
        std::pair{"STITCH_GATEWAY__LISTEN", "gateway.listen"},
        std::pair{"STITCH_STATUS__LISTEN", "status.listen"},
        std::pair{"STITCH_REPLICA__LISTEN", "replica.listen"},
        std::pair{"STITCH_REPLICA__COMMIT_MODE", "replica.commit_mode"},
        std::pair{"STITCH_REPLICA__DRAIN_TIMEOUT", "replica.drain_timeout"},
        std::pair{"STITCH_REPLICA__BACKSTOP", "replica.backstop"},
        std::pair{"STITCH_MODEL__PRESET", "model.preset"},
        std::pair{"STITCH_HTTP__BODY_LIMIT", "http.body_limit"},
        std::pair{"STITCH_ADMIN__TOKEN", "admin.token"}, std::pair{"STITCH_TOKEN", "admin.token"}})
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
  out += "data_dir = \"" + s.data_dir.string() + "\"\n";
  out += "replicas = " + std::to_string(s.replicas) + "\n\n";
  out += "[coordinator]\nlisten = \"" + s.coordinator.host + ":"
         + std::to_string(s.coordinator.port) + "\"\n\n";
  out += "[store]\nuri = \"" + s.effective_store_uri() + "\"\n\n";
  auto hp = [](const host_port& h) { return h.host + ":" + std::to_string(h.port); };
  out += "[model]\npreset = \"" + s.model_preset + "\"\n\n";
  std::string headers;
  for (const auto& h : s.affinity_headers)
    headers += (headers.empty() ? "\"" : ", \"") + h + "\"";
  out += "[gateway]\nlisten = \"" + hp(s.gateway) + "\"\naffinity_headers = [" + headers + "]\n\n";
  out += "[status]\nlisten = \"" + hp(s.status) + "\"\n\n";
  out += "[replica]\nlisten = \"" + hp(s.replica_listen) + "\"\ncommit_mode = \"" + s.commit_mode
         + "\"\ndrain_timeout = " + std::to_string(s.drain_timeout)
         + "\nbackstop = " + std::to_string(s.backstop) + "\n\n";
  out += "[http]\nbody_limit = " + std::to_string(s.body_limit) + "\n\n";
  out += "[admin]\ntoken = \"" + std::string{s.admin_token.empty() ? "" : "(set)"} + "\"\n";
  return out;
}

} // namespace stitch::node
