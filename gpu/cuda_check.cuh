#pragma once

// For the .cu files of gpu/ only: a CUDA runtime result as a status that
// carries CUDA's own text and names the call.
#include <cuda_runtime.h>

#include <string>

#include "runtime/core/error.hpp"

namespace stitch::gpu::cuda {

inline status check(cudaError_t err, const char* call) {
  if (err == cudaSuccess)
    return {};
  cudaGetLastError(); // clears a sticky launch error so later calls are not blamed
  return make_error(errc::engine_unavailable,
                    std::string{"CUDA "} + call + " failed: " + cudaGetErrorString(err));
}

} // namespace stitch::gpu::cuda
