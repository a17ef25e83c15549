#include "gpu/dynamic_library.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

namespace stitch::gpu {

void* dynamic_library::symbol(const char* name) {
  void* p = handle ? dlsym(handle, name) : nullptr;
  if (!p && error.empty())
    error = std::string{"the loaded library lacks "} + name;
  return p;
}

dynamic_library open_library(const char* what, const char* env,
                             std::initializer_list<const char*> names) {
  std::vector<std::string> tried_names;
  if (const char* path = std::getenv(env); path && *path)
    tried_names.emplace_back(path);
  for (const char* n : names)
    tried_names.emplace_back(n);
  dynamic_library lib;
  std::string tried;
  for (const auto& n : tried_names) {
    lib.handle = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib.handle)
      return lib;
    const char* why = dlerror();
    tried += (tried.empty() ? "" : "; ") + (why ? std::string{why} : n);
  }
  lib.error = std::string{"cannot load "} + what + " (" + tried
              + "); put its folder on LD_LIBRARY_PATH or its path in " + env;
  return lib;
}

} // namespace stitch::gpu
