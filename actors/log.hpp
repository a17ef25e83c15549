#pragma once

#include <string>
#include <string_view>

namespace stitch::log {

/// Names this process's node in every log line (`stitch-node` sets it once).
void set_node(std::string name);

/// One line on stderr: time, level, `[node/role]`, message (spdlog).
void info(std::string_view role, std::string_view message);
void warn(std::string_view role, std::string_view message);
void error(std::string_view role, std::string_view message);

} // namespace stitch::log
