#pragma once

#include <initializer_list>
#include <string>

/// A shared library loaded when first needed (cuBLAS, NCCL), so a build that
/// uses it still starts where it is not installed.
namespace stitch::gpu {

struct dynamic_library {
  void* handle = nullptr;
  /// Why it is not usable (empty when it is).
  std::string error;

  /// The address of `name`, or null (the first missing one goes to `error`).
  void* symbol(const char* name);
};

/// Opens the first of: the path in environment variable `env` (when set),
/// then `names`; `what` ("cuBLAS") names it in the error.
dynamic_library open_library(const char* what, const char* env,
                             std::initializer_list<const char*> names);

} // namespace stitch::gpu
