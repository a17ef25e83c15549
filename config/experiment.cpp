#include "config/experiment.hpp"

#include <fstream>
#include <set>
#include <sstream>

#include <toml++/toml.h>

namespace stitch::config {

namespace {

constexpr uint64_t max_file_bytes = 1 << 20;

struct reader {
  std::string origin;
  std::string problems;
  std::set<std::string> known;

  void problem(const std::string& key, const std::string& what) {
    problems += origin + " " + key + ": " + what + "\n";
  }

  void text(const toml::table& t, const std::string& key, std::string& into) {
    known.insert(key);
    auto node = t.at_path(key);
    if (!node)
      return;
    if (auto v = node.value<std::string>())
      into = *v;
    else
      problem(key, "must be a string");
  }

  template <class Int>
  void integer(const toml::table& t, const std::string& key, Int& into, int64_t min, int64_t max) {
    known.insert(key);
    auto node = t.at_path(key);
    if (!node)
      return;
    auto v = node.as_integer();
    if (!v) {
      problem(key, "must be an integer");
      return;
    }
    if (v->get() < min || v->get() > max) {
      problem(key, "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
      return;
    }
    into = static_cast<Int>(v->get());
  }

  void number(const toml::table& t, const std::string& key, double& into) {
    known.insert(key);
    auto node = t.at_path(key);
    if (!node)
      return;
    if (auto v = node.value<double>(); v && (node.is_floating_point() || node.is_integer()))
      into = *v;
    else
      problem(key, "must be a number");
  }

  void boolean(const toml::table& t, const std::string& key, bool& into) {
    known.insert(key);
    auto node = t.at_path(key);
    if (!node)
      return;
    if (auto v = node.value<bool>(); v && node.is_boolean())
      into = *v;
    else
      problem(key, "must be true or false");
  }

  /// Reports every key of `t` (and its tables) that is not known.
  void unknown(const toml::table& t, const std::string& prefix) {
    for (const auto& [k, v] : t) {
      std::string key = prefix.empty() ? std::string{k.str()} : prefix + "." + std::string{k.str()};
      if (const auto* sub = v.as_table()) {
        if (key == "boot" || key == "trainer")
          unknown(*sub, key);
        else
          problem(key, "unknown table");
      } else if (!known.contains(key)) {
        problem(key, "unknown key");
      }
    }
  }
};

} // namespace

result<experiment_spec> parse_experiment(std::string_view text, std::string_view origin) {
  toml::table t;
  try {
    t = toml::parse(text, std::string{origin});
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << origin << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
          << e.description();
    return make_error(errc::invalid_argument, where.str());
  }
  experiment_spec s;
  reader r{std::string{origin}, {}, {}};
  r.text(t, "run_id", s.run_id);
  r.text(t, "pool", s.pool);
  r.integer(t, "replicas", s.replicas, 1, 4096);
  r.text(t, "commit_mode", s.commit_mode);
  r.text(t, "boot.preset", s.boot_preset);
  r.integer(t, "boot.seed", s.boot_seed, 0, INT64_MAX);
  r.text(t, "boot.dir", s.boot_dir);
  r.integer(t, "boot.version", s.boot_version, 0, INT64_MAX);
  r.boolean(t, "trainer.enabled", s.trainer.enabled);
  r.integer(t, "trainer.steps", s.trainer.steps, 1, 1'000'000);
  r.integer(t, "trainer.samples_per_step", s.trainer.samples_per_step, 1, 4096);
  r.integer(t, "trainer.staleness", s.trainer.staleness, 0, 1'000'000);
  r.number(t, "trainer.learning_rate", s.trainer.learning_rate);
  r.unknown(t, "");
  if (!t.contains("run_id"))
    r.problem("run_id", "missing (every experiment names its run)");
  if (r.problems.empty())
    if (auto ok = validate(s); !ok) {
      std::istringstream lines{ok.error().message};
      for (std::string line; std::getline(lines, line);)
        r.problems += r.origin + " " + line + "\n";
    }
  if (!r.problems.empty()) {
    r.problems.pop_back();
    return make_error(errc::invalid_argument, r.problems);
  }
  return s;
}

result<experiment_spec> load_experiment(const std::string& path) {
  std::ifstream in{path, std::ios::binary};
  if (!in)
    return make_error(errc::not_found, "cannot read the experiment file '" + path + "'");
  std::string text;
  text.resize(max_file_bytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > max_file_bytes)
    return make_error(errc::invalid_argument,
                      "the experiment file '" + path + "' is larger than 1 MiB");
  return parse_experiment(text, path);
}

} // namespace stitch::config
