#include "runtime/node/cli.hpp"

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

} // namespace stitch::node
