// The `xor` delta encoding applied on the device (gpu/cuda_backend.hpp).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "gpu/cuda_backend.hpp"

namespace stitch::gpu::cuda {

namespace {

constexpr int threads_per_block = 256;
constexpr size_t max_blocks = 8192;

__global__ void xor_words(uint4* base, const uint4* delta, size_t n) {
  size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    uint4 a = base[i];
    uint4 b = delta[i];
    a.x ^= b.x;
    a.y ^= b.y;
    a.z ^= b.z;
    a.w ^= b.w;
    base[i] = a;
  }
}

__global__ void xor_bytes(unsigned char* base, const unsigned char* delta, size_t n) {
  size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    base[i] ^= delta[i];
}

unsigned blocks_for(size_t n) {
  size_t blocks = (n + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned>(blocks < max_blocks ? blocks : max_blocks);
}

} // namespace

status xor_async(int device, void* dst, const void* delta_bytes, size_t n, void* stream) {
  if (n == 0)
    return {};
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    cudaGetLastError();
    return make_error(errc::engine_unavailable,
                      std::string{"CUDA cudaSetDevice failed: "} + cudaGetErrorString(err));
  }
  auto s = static_cast<cudaStream_t>(stream);
  auto* base = static_cast<unsigned char*>(dst);
  const auto* delta = static_cast<const unsigned char*>(delta_bytes);
  size_t head = 0;
  if (reinterpret_cast<uintptr_t>(base) % 16 == 0 && reinterpret_cast<uintptr_t>(delta) % 16 == 0) {
    size_t words = n / 16;
    if (words > 0)
      xor_words<<<blocks_for(words), threads_per_block, 0, s>>>(
        reinterpret_cast<uint4*>(base), reinterpret_cast<const uint4*>(delta), words);
    head = words * 16;
  }
  if (head < n)
    xor_bytes<<<blocks_for(n - head), threads_per_block, 0, s>>>(base + head, delta + head,
                                                                 n - head);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return make_error(errc::decode_failure,
                      std::string{"CUDA xor kernel failed: "} + cudaGetErrorString(err));
  return {};
}

} // namespace stitch::gpu::cuda
