#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/safetensors.hpp"

namespace stitch::pipeline {

/// One tensor of a model's weights held in host memory.
struct host_tensor {
  std::string name;
  safetensors::dtype type = safetensors::dtype::u8;
  std::vector<uint64_t> shape;
  std::vector<std::byte> bytes;

  friend bool operator==(const host_tensor&, const host_tensor&) = default;
};

/// A model's weights in memory, by tensor name (the key equals `name`).
using tensor_set = std::map<std::string, host_tensor>;

} // namespace stitch::pipeline
