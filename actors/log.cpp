#include "actors/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <map>
#include <memory>
#include <mutex>

namespace stitch::log {

namespace {

struct registry {
  std::mutex mutex;
  std::string node = "local";
  std::shared_ptr<spdlog::sinks::stderr_sink_mt> sink =
    std::make_shared<spdlog::sinks::stderr_sink_mt>();
  std::map<std::string, std::shared_ptr<spdlog::logger>, std::less<>> loggers;
};

registry& reg() {
  static registry r;
  return r;
}

std::shared_ptr<spdlog::logger> logger_for(std::string_view role) {
  auto& r = reg();
  std::lock_guard guard{r.mutex};
  if (auto it = r.loggers.find(role); it != r.loggers.end())
    return it->second;
  auto l = std::make_shared<spdlog::logger>(r.node + "/" + std::string{role}, r.sink);
  l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %l [%n] %v");
  r.loggers.emplace(std::string{role}, l);
  return l;
}

} // namespace

void set_node(std::string name) {
  auto& r = reg();
  std::lock_guard guard{r.mutex};
  r.node = std::move(name);
  r.loggers.clear();
}

void info(std::string_view role, std::string_view message) {
  logger_for(role)->info("{}", message);
}

void warn(std::string_view role, std::string_view message) {
  logger_for(role)->warn("{}", message);
}

void error(std::string_view role, std::string_view message) {
  logger_for(role)->error("{}", message);
}

} // namespace stitch::log
