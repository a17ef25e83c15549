#include "config/node_config.hpp"

#include "runtime/core/version_ref.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <sstream>

#include <toml++/toml.h>

namespace stitch::config {

namespace {

enum class kind { text, listen, integer, number, text_list, integer_list, boolean };

/// A setting's value, parsed.
struct value {
  std::string text;
  double number = 0;
  listen_address address;
  std::vector<std::string> texts;
  std::vector<double> numbers;
  bool flag = false;
};

struct entry {
  std::string key;
  kind k;
  double min = 0;
  double max = 0;
  std::vector<std::string> choices;
  std::function<void(node_config&, const value&)> set;
  std::function<std::string(const node_config&)> show;
};

std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string show_number(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

std::string show_address(const listen_address& a) {
  bool v6 = a.host.find(':') != std::string::npos;
  return toml_string((v6 ? "[" + a.host + "]" : a.host) + ":" + std::to_string(a.port));
}

const std::vector<entry>& schema() {
  static const std::vector<entry> entries = [] {
    std::vector<entry> e;
    auto text = [&](std::string key, std::string node_config::*field,
                    std::vector<std::string> choices = {}) {
      e.push_back({key, kind::text, 0, 0, std::move(choices),
                   [field](node_config& c, const value& v) { c.*field = v.text; },
                   [field](const node_config& c) { return toml_string(c.*field); }});
    };
    // A closed set: the TOML text is one of `options`' names, the field its enum.
    auto choice = [&]<class E>(std::string key, E node_config::*field,
                               std::vector<std::pair<std::string, E>> options) {
      std::vector<std::string> names;
      for (const auto& o : options)
        names.push_back(o.first);
      e.push_back({key, kind::text, 0, 0, std::move(names),
                   [field, options](node_config& c, const value& v) {
                     for (const auto& [name, x] : options)
                       if (name == v.text)
                         c.*field = x;
                   },
                   [field, options](const node_config& c) {
                     for (const auto& [name, x] : options)
                       if (x == c.*field)
                         return toml_string(name);
                     return toml_string("");
                   }});
    };
    auto path = [&](std::string key, std::filesystem::path node_config::*field) {
      e.push_back({key,
                   kind::text,
                   0,
                   0,
                   {},
                   [field](node_config& c, const value& v) { c.*field = v.text; },
                   [field](const node_config& c) { return toml_string((c.*field).string()); }});
    };
    auto listen = [&](std::string key, listen_address node_config::*field) {
      e.push_back({key,
                   kind::listen,
                   0,
                   0,
                   {},
                   [field](node_config& c, const value& v) { c.*field = v.address; },
                   [field](const node_config& c) { return show_address(c.*field); }});
    };
    auto flag = [&](std::string key, bool node_config::*field) {
      e.push_back(
        {key,
         kind::boolean,
         0,
         0,
         {},
         [field](node_config& c, const value& v) { c.*field = v.flag; },
         [field](const node_config& c) { return std::string{c.*field ? "true" : "false"}; }});
    };
    auto number = [&](std::string key, double node_config::*field, double min, double max) {
      e.push_back({key,
                   kind::number,
                   min,
                   max,
                   {},
                   [field](node_config& c, const value& v) { c.*field = v.number; },
                   [field](const node_config& c) { return show_number(c.*field); }});
    };
    e.push_back({"name",
                 kind::text,
                 0,
                 0,
                 {},
                 [](node_config& c, const value& v) { c.name = v.text; },
                 [](const node_config& c) { return toml_string(c.name); }});
    path("data_dir", &node_config::data_dir);
    e.push_back({"roles", kind::text_list, 0, 0,
                 std::vector<std::string>(std::begin(known_roles), std::end(known_roles)),
                 [](node_config& c, const value& v) { c.roles = v.texts; },
                 [](const node_config& c) {
                   std::string out = "[";
                   for (size_t i = 0; i < c.roles.size(); ++i)
                     out += (i ? ", " : "") + toml_string(c.roles[i]);
                   return out + "]";
                 }});
    e.push_back({"gpus",
                 kind::integer_list,
                 0,
                 1023,
                 {},
                 [](node_config& c, const value& v) {
                   c.gpus.clear();
                   for (double n : v.numbers)
                     c.gpus.push_back(static_cast<uint32_t>(n));
                 },
                 [](const node_config& c) {
                   std::string out = "[";
                   for (size_t i = 0; i < c.gpus.size(); ++i)
                     out += (i ? ", " : "") + std::to_string(c.gpus[i]);
                   return out + "]";
                 }});
    e.push_back(
      {"replicas",
       kind::integer,
       0,
       64,
       {},
       [](node_config& c, const value& v) { c.replicas = static_cast<uint32_t>(v.number); },
       [](const node_config& c) { return std::to_string(c.replicas); }});
    listen("coordinator.listen", &node_config::coordinator_listen);
    text("coordinator.address", &node_config::coordinator_address);
    number("coordinator.heartbeat_timeout", &node_config::heartbeat_timeout, 0.2, 600);
    listen("cluster.listen", &node_config::cluster_listen);
    flag("cluster.insecure", &node_config::cluster_insecure);
    text("store.uri", &node_config::store_uri);
    e.push_back(
      {"store.retain_versions",
       kind::integer,
       0,
       1'000'000,
       {},
       [](node_config& c, const value& v) { c.retain_versions = static_cast<uint32_t>(v.number); },
       [](const node_config& c) { return std::to_string(c.retain_versions); }});
    e.push_back({"publisher.memory_limit",
                 kind::integer,
                 0,
                 double(uint64_t{1} << 50),
                 {},
                 [](node_config& c, const value& v) {
                   c.publisher_memory_limit = static_cast<uint64_t>(v.number);
                 },
                 [](const node_config& c) { return std::to_string(c.publisher_memory_limit); }});
    text("publisher.listen", &node_config::publisher_listen);
    flag("publisher.tls", &node_config::publisher_tls);
    choice("publisher.delta_encoding", &node_config::publisher_delta_encoding,
           {{"xor-sparse", delta_encoding::xor_sparse}, {"xor", delta_encoding::xor_bytes}});
    number("publisher.session_idle_timeout", &node_config::session_idle_timeout, 1, 86400);
    e.push_back(
      {"io.buffer_bytes",
       kind::integer,
       double(uint64_t{1} << 20),
       double(uint64_t{4} << 30),
       {},
       [](node_config& c, const value& v) { c.io_buffer_bytes = static_cast<uint64_t>(v.number); },
       [](const node_config& c) { return std::to_string(c.io_buffer_bytes); }});
    choice("transfer.peers", &node_config::transfer_peers,
           {{"ucx", peer_transfer::ucx}, {"off", peer_transfer::off}});
    text("model.preset", &node_config::model_preset,
         {"tiny", "small", "medium", "moe-tiny", "moe-small"});
    choice("engine.kind", &node_config::engine_kind,
           {{"builtin", engine_kind::builtin},
            {"sglang", engine_kind::sglang},
            {"vllm", engine_kind::vllm}});
    choice("engine.device", &node_config::engine_device,
           {{"cpu", engine_device::cpu}, {"cuda", engine_device::cuda}});
    e.push_back(
      {"engine.max_batch",
       kind::integer,
       1,
       4096,
       {},
       [](node_config& c, const value& v) { c.engine_max_batch = static_cast<uint64_t>(v.number); },
       [](const node_config& c) { return std::to_string(c.engine_max_batch); }});
    text("engine.url", &node_config::engine_url);
    text("engine.launch", &node_config::engine_launch);
    path("engine.staging_dir", &node_config::engine_staging_dir);
    number("engine.request_timeout", &node_config::engine_request_timeout, 1, 86400);
    number("engine.update_timeout", &node_config::engine_update_timeout, 1, 86400);
    number("engine.ready_timeout", &node_config::engine_ready_timeout, 1, 86400);
    e.push_back(
      {"engine.partial_reload_max_bytes",
       kind::integer,
       0,
       double(uint64_t{1} << 40),
       {},
       [](node_config& c, const value& v) {
         c.engine_partial_reload_max_bytes = static_cast<uint64_t>(v.number);
       },
       [](const node_config& c) { return std::to_string(c.engine_partial_reload_max_bytes); }});
    text("replica.pool", &node_config::pool);
    listen("replica.listen", &node_config::replica_listen);
    choice("replica.commit_mode", &node_config::commit_mode,
           {{"in_place", commit_mode::in_place}, {"quiesce", commit_mode::quiesce}});
    number("replica.drain_timeout", &node_config::drain_timeout, 0, 86400);
    number("replica.backstop", &node_config::backstop, 0, 86400);
    listen("gateway.listen", &node_config::gateway_listen);
    e.push_back({"gateway.affinity_headers",
                 kind::text_list,
                 0,
                 0,
                 {},
                 [](node_config& c, const value& v) { c.affinity_headers = v.texts; },
                 [](const node_config& c) {
                   std::string out = "[";
                   for (size_t i = 0; i < c.affinity_headers.size(); ++i)
                     out += (i ? ", " : "") + toml_string(c.affinity_headers[i]);
                   return out + "]";
                 }});
    listen("status.listen", &node_config::status_listen);
    e.push_back(
      {"http.body_limit",
       kind::integer,
       1024,
       double(uint64_t{1} << 30),
       {},
       [](node_config& c, const value& v) { c.body_limit = static_cast<uint64_t>(v.number); },
       [](const node_config& c) { return std::to_string(c.body_limit); }});
    auto count = [&](std::string key, uint64_t node_config::*field, double max) {
      e.push_back(
        {key,
         kind::integer,
         0,
         max,
         {},
         [field](node_config& c, const value& v) { c.*field = static_cast<uint64_t>(v.number); },
         [field](const node_config& c) { return std::to_string(c.*field); }});
    };
    count("http.max_connections", &node_config::http_max_connections, 1'000'000);
    count("http.max_connections_per_client", &node_config::http_max_connections_per_client,
          1'000'000);
    count("http.body_budget", &node_config::http_body_budget, double(uint64_t{1} << 40));
    text("admin.token", &node_config::admin_token);
    path("admin.token_file", &node_config::admin_token_file);
    text("admin.member_token", &node_config::member_token);
    path("admin.member_token_file", &node_config::member_token_file);
    path("tls.cert", &node_config::tls_cert);
    path("tls.key", &node_config::tls_key);
    path("tls.ca", &node_config::tls_ca);
    return e;
  }();
  return entries;
}

const entry* find_entry(std::string_view key) {
  for (const auto& e : schema())
    if (e.key == key)
      return &e;
  return nullptr;
}

/// Checks a parsed value against the entry's range and choices.
std::string check(const entry& e, const value& v) {
  auto in_range = [&](double n) { return n >= e.min && n <= e.max; };
  switch (e.k) {
    case kind::text:
      if (!e.choices.empty()
          && std::find(e.choices.begin(), e.choices.end(), v.text) == e.choices.end()) {
        std::string all;
        for (const auto& c : e.choices)
          all += (all.empty() ? "" : ", ") + c;
        return quote_untrusted(v.text) + " is not one of " + all;
      }
      if (e.key == "replica.pool") {
        bool ok = !v.text.empty() && v.text.size() <= 64 && v.text != "." && v.text != ".."
                  && std::all_of(v.text.begin(), v.text.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_'
                              || c == '-';
                     });
        if (!ok)
          return quote_untrusted(v.text) + " is not a pool name ([A-Za-z0-9._-]{1,64})";
      }
      if (e.key == "name")
        if (auto ok = validate_run_id(v.text); !ok)
          return quote_untrusted(v.text) + " is not a node name ([A-Za-z0-9._-]{1,64})";
      if (e.key == "engine.url" && !v.text.empty() && !v.text.starts_with("http://")
          && !v.text.starts_with("https://"))
        return quote_untrusted(v.text) + " is not an http:// or https:// URL";
      if (e.key == "store.uri" && !v.text.empty() && !v.text.starts_with("rocksdb:")
          && !v.text.starts_with("s3://"))
        return quote_untrusted(v.text) + " is neither rocksdb:PATH nor s3://bucket/prefix";
      return {};
    case kind::integer:
    case kind::number:
      if (!in_range(v.number))
        return show_number(v.number) + " is outside [" + show_number(e.min) + ", "
               + show_number(e.max) + "]";
      return {};
    case kind::integer_list:
      for (double n : v.numbers)
        if (!in_range(n))
          return show_number(n) + " is outside [" + show_number(e.min) + ", " + show_number(e.max)
                 + "]";
      return {};
    case kind::text_list:
      for (const auto& t : v.texts) {
        if (!e.choices.empty()
            && std::find(e.choices.begin(), e.choices.end(), t) == e.choices.end())
          return quote_untrusted(t) + " is not a known role";
        if (e.key == "gateway.affinity_headers"
            && (t.empty() || !std::all_of(t.begin(), t.end(), [](char c) {
                  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
                })))
          return quote_untrusted(t) + " is not a header name";
      }
      return {};
    case kind::listen:
    case kind::boolean: return {};
  }
  return {};
}

void set_checked(node_config& c, const entry& e, const value& v, std::string_view where,
                 std::string& problems) {
  if (auto why = check(e, v); !why.empty()) {
    problems += std::string{where} + " " + e.key + ": " + why + "\n";
    return;
  }
  e.set(c, v);
}

/// Text (a `--set` or environment value) into a value of the entry's kind.
result<value> from_text(const entry& e, std::string_view text) {
  value v;
  auto parse_number = [&](std::string_view t, bool integral) -> result<double> {
    double n = 0;
    auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), n);
    if (t.empty() || ec != std::errc{} || ptr != t.data() + t.size() || !std::isfinite(n)
        || (integral && n != std::floor(n)))
      return make_error(errc::invalid_argument, quote_untrusted(t) + " is not "
                                                  + (integral ? "a whole number" : "a number"));
    return n;
  };
  auto split = [](std::string_view t) {
    std::vector<std::string> out;
    while (!t.empty()) {
      auto comma = t.find(',');
      auto item = t.substr(0, comma);
      while (!item.empty() && item.front() == ' ')
        item.remove_prefix(1);
      while (!item.empty() && item.back() == ' ')
        item.remove_suffix(1);
      if (!item.empty())
        out.emplace_back(item);
      t = comma == std::string_view::npos ? std::string_view{} : t.substr(comma + 1);
    }
    return out;
  };
  switch (e.k) {
    case kind::text: v.text = std::string{text}; break;
    case kind::listen: {
      auto a = parse_listen_address(text);
      if (!a)
        return std::move(a).error();
      v.address = *a;
      break;
    }
    case kind::integer:
    case kind::number: {
      auto n = parse_number(text, e.k == kind::integer);
      if (!n)
        return std::move(n).error();
      v.number = *n;
      break;
    }
    case kind::text_list: v.texts = split(text); break;
    case kind::boolean:
      if (text != "true" && text != "false")
        return make_error(errc::invalid_argument, quote_untrusted(text) + " is not true or false");
      v.flag = text == "true";
      break;
    case kind::integer_list:
      for (const auto& item : split(text)) {
        auto n = parse_number(item, true);
        if (!n)
          return std::move(n).error();
        v.numbers.push_back(*n);
      }
      break;
  }
  return v;
}

/// A TOML node into a value of the entry's kind.
result<value> from_toml(const entry& e, const toml::node& node) {
  value v;
  auto wrong = [](const char* what) {
    return make_error(errc::invalid_argument, std::string{"must be "} + what);
  };
  switch (e.k) {
    case kind::text:
      if (!node.is_string())
        return wrong("a string");
      v.text = node.value<std::string>().value_or("");
      break;
    case kind::listen: {
      if (!node.is_string())
        return wrong("a \"HOST:PORT\" string");
      auto a = parse_listen_address(node.value<std::string>().value_or(""));
      if (!a)
        return std::move(a).error();
      v.address = *a;
      break;
    }
    case kind::integer:
      if (!node.is_integer())
        return wrong("an integer");
      v.number = static_cast<double>(node.value<int64_t>().value_or(0));
      break;
    case kind::number:
      if (!node.is_number())
        return wrong("a number");
      v.number = node.value<double>().value_or(0);
      break;
    case kind::text_list: {
      const auto* arr = node.as_array();
      if (!arr)
        return wrong("an array of strings");
      for (const auto& item : *arr) {
        if (!item.is_string())
          return wrong("an array of strings");
        v.texts.push_back(item.value<std::string>().value_or(""));
      }
      break;
    }
    case kind::boolean:
      if (!node.is_boolean())
        return wrong("true or false");
      v.flag = node.value<bool>().value_or(false);
      break;
    case kind::integer_list: {
      const auto* arr = node.as_array();
      if (!arr)
        return wrong("an array of integers");
      for (const auto& item : *arr) {
        if (!item.is_integer())
          return wrong("an array of integers");
        v.numbers.push_back(static_cast<double>(item.value<int64_t>().value_or(0)));
      }
      break;
    }
  }
  return v;
}

void walk(const toml::table& table, const std::string& prefix, node_config& c,
          std::string_view origin, std::string& problems) {
  for (const auto& [k, node] : table) {
    std::string key = prefix.empty() ? std::string{k.str()} : prefix + "." + std::string{k.str()};
    const entry* e = find_entry(key);
    if (!e && node.is_table()) {
      bool section = false;
      for (const auto& x : schema())
        section |= x.key.starts_with(key + ".");
      if (section) {
        walk(*node.as_table(), key, c, origin, problems);
        continue;
      }
    }
    auto line = node.source().begin.line;
    std::string where = std::string{origin} + ":" + std::to_string(line);
    if (!e) {
      problems += where + " " + key + ": unknown key\n";
      continue;
    }
    auto v = from_toml(*e, node);
    if (!v) {
      problems += where + " " + key + ": " + v.error().message + "\n";
      continue;
    }
    set_checked(c, *e, *v, where, problems);
  }
}

} // namespace

bool is_loopback(std::string_view host) {
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

result<listen_address> parse_listen_address(std::string_view text) {
  auto fail = [&] {
    return make_error(errc::invalid_argument,
                      quote_untrusted(text) + " is not of the form HOST:PORT");
  };
  listen_address out;
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
  unsigned p = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (out.host.empty() || port.empty() || ec != std::errc{} || ptr != port.data() + port.size()
      || p > 65535)
    return fail();
  out.port = static_cast<uint16_t>(p);
  return out;
}

bool node_config::has_role(std::string_view role) const {
  return std::find(roles.begin(), roles.end(), role) != roles.end();
}

std::string node_config::effective_store_uri() const {
  if (!store_uri.empty())
    return store_uri;
  return "rocksdb:" + (data_dir / "store").string();
}

std::filesystem::path node_config::effective_staging_dir() const {
  if (!engine_staging_dir.empty())
    return engine_staging_dir;
  std::error_code ec;
  if (std::filesystem::is_directory("/dev/shm", ec))
    return std::filesystem::path{"/dev/shm"} / ("stitch-" + name);
  return data_dir / "staging";
}

result<node_config> parse_node_config(std::string_view toml_text, std::string_view origin,
                                      bool whole) {
  node_config c;
  std::string problems;
  try {
    auto table = toml::parse(toml_text, std::string{origin});
    walk(table, "", c, origin, problems);
  } catch (const toml::parse_error& err) {
    problems += std::string{origin} + ":" + std::to_string(err.source().begin.line) + ": "
                + std::string{err.description()} + "\n";
  }
  if (whole)
    validate(c, problems);
  if (!problems.empty()) {
    problems.pop_back();
    return make_error(errc::invalid_argument, problems);
  }
  return c;
}

void apply_setting(node_config& into, std::string_view key, std::string_view text,
                   std::string_view origin, std::string& problems) {
  const entry* e = find_entry(key);
  if (!e) {
    problems += std::string{origin} + " " + std::string{key} + ": unknown key\n";
    return;
  }
  auto v = from_text(*e, text);
  if (!v) {
    problems += std::string{origin} + " " + e->key + ": " + v.error().message + "\n";
    return;
  }
  set_checked(into, *e, *v, origin, problems);
}

void validate(const node_config& c, std::string& problems) {
  for (const auto& r : c.roles)
    if (std::find(std::begin(known_roles), std::end(known_roles), r) == std::end(known_roles))
      problems += "roles: " + quote_untrusted(r) + " is not a known role\n";
  if (c.has_role("coordinator") && !c.coordinator_address.empty())
    problems += "coordinator.address: a node with the role 'coordinator' is the coordinator; "
                "remove one of them\n";
  if (!c.has_role("coordinator") && c.coordinator_address.empty())
    problems += "coordinator.address: a node without the role 'coordinator' must name the "
                "coordinator to join (HOST:PORT)\n";
  if (!c.coordinator_address.empty() && !parse_listen_address(c.coordinator_address))
    problems +=
      "coordinator.address: " + quote_untrusted(c.coordinator_address) + " is not HOST:PORT\n";
  if (c.engine_device == engine_device::cuda && c.engine_kind != engine_kind::builtin)
    problems += "engine.device: cuda is where the built-in engine computes; an external engine ("
                + std::string{to_string(c.engine_kind)}
                + ") places itself with {gpu} in engine.launch\n";
  if (c.engine_kind == engine_kind::builtin) {
    if (!c.engine_url.empty() || !c.engine_launch.empty())
      problems += "engine.kind: engine.url and engine.launch drive an external engine; set "
                  "engine.kind to sglang or vllm\n";
  } else if (c.engine_url.empty() == c.engine_launch.empty()) {
    problems += "engine.kind: " + std::string{to_string(c.engine_kind)}
                + " needs exactly one of engine.url (a running server) and engine.launch (a "
                  "command the node starts for each replica)\n";
  } else if (!c.engine_url.empty() && c.has_role("replica") && c.replicas > 1) {
    problems += "engine.url: one engine serves one replica; with replicas = "
                + std::to_string(c.replicas) + " use engine.launch\n";
  }
  int tls = !c.tls_cert.empty() + !c.tls_key.empty() + !c.tls_ca.empty();
  if (tls != 0 && tls != 3)
    problems += "tls: cert, key and ca must be given together\n";
  if (c.publisher_tls && c.tls_cert.empty())
    problems +=
      "publisher.tls: serves HTTPS with the node's [tls] certificate and key; set tls.cert, "
      "tls.key and tls.ca\n";
  // Two listeners on one port (port 0 picks a free one and never clashes).
  std::vector<std::pair<std::string, listen_address>> listeners;
  if (c.has_role("coordinator"))
    listeners.push_back({"coordinator.listen", c.coordinator_listen});
  else
    listeners.push_back({"cluster.listen", c.cluster_listen});
  if (c.has_role("gateway"))
    listeners.push_back({"gateway.listen", c.gateway_listen});
  if (c.has_role("status"))
    listeners.push_back({"status.listen", c.status_listen});
  if (!c.publisher_listen.empty()) {
    if (auto a = parse_listen_address(c.publisher_listen); !a)
      problems += "publisher.listen: " + quote_untrusted(c.publisher_listen)
                  + " is not HOST:PORT (or leave it empty for no publisher HTTP surface)\n";
    else if (c.has_role("publisher"))
      listeners.push_back({"publisher.listen", *a});
  }
  if (c.has_role("replica") && c.replica_listen.port != 0)
    for (uint32_t i = 0; i < c.replicas; ++i) {
      auto a = c.replica_listen;
      if (uint32_t{a.port} + i > 65535) {
        problems += "replica.listen: replica " + std::to_string(i) + " would need port "
                    + std::to_string(uint32_t{a.port} + i) + "\n";
        break;
      }
      a.port = static_cast<uint16_t>(a.port + i);
      listeners.push_back({"replica.listen (replica " + std::to_string(i) + ")", a});
    }
  for (size_t i = 0; i < listeners.size(); ++i)
    for (size_t j = i + 1; j < listeners.size(); ++j)
      if (listeners[i].second.port != 0 && listeners[i].second.port == listeners[j].second.port
          && (listeners[i].second.host == listeners[j].second.host
              || listeners[i].second.host == "0.0.0.0" || listeners[j].second.host == "0.0.0.0"))
        problems += listeners[i].first + " and " + listeners[j].first + ": both on port "
                    + std::to_string(listeners[i].second.port) + "\n";
}

std::string to_toml(const node_config& c) {
  std::string out;
  std::string section;
  for (const auto& e : schema()) {
    auto dot = e.key.find('.');
    std::string s = dot == std::string::npos ? "" : e.key.substr(0, dot);
    std::string leaf = dot == std::string::npos ? e.key : e.key.substr(dot + 1);
    if (s != section) {
      out += "\n[" + s + "]\n";
      section = s;
    }
    std::string shown = e.show(c);
    if (e.key == "admin.token")
      shown = toml_string(c.admin_token.empty() ? "" : "(set)");
    else if (e.key == "admin.member_token")
      shown = toml_string(c.member_token.empty() ? "" : "(set)");
    out += leaf + " = " + shown + "\n";
  }
  return out;
}

std::vector<std::string> setting_keys() {
  std::vector<std::string> out;
  for (const auto& e : schema())
    out.push_back(e.key);
  return out;
}

std::string env_name(std::string_view key) {
  std::string out = "STITCH_";
  for (char ch : key)
    out += ch == '.'
             ? std::string{"__"}
             : std::string(1, static_cast<char>(std::toupper(static_cast<unsigned char>(ch))));
  return out;
}

} // namespace stitch::config
