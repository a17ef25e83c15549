// CUDA side of gpu/device.hpp. Compiled by nvcc in its own C++ dialect, so it
// speaks plain types and C strings; gpu/device.cpp turns them into statuses.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace stitch::gpu::detail {

namespace {

constexpr int threads_per_block = 256;
constexpr size_t max_blocks = 4096;

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

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

/// Enqueues the kernels; returns nullptr or the CUDA error's text.
const char* cuda_xor_launch(void* dev_base, const void* dev_delta, size_t n,
                            void* stream) noexcept {
  if (n == 0)
    return nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  auto* base = static_cast<unsigned char*>(dev_base);
  const auto* delta = static_cast<const unsigned char*>(dev_delta);
  size_t head = 0;
  if (reinterpret_cast<uintptr_t>(base) % 16 == 0 && reinterpret_cast<uintptr_t>(delta) % 16 == 0) {
    size_t words = n / 16;
    if (words > 0) {
      xor_words<<<blocks_for(words), threads_per_block, 0, s>>>(
        reinterpret_cast<uint4*>(base), reinterpret_cast<const uint4*>(delta), words);
    }
    head = words * 16;
  }
  if (head < n)
    xor_bytes<<<blocks_for(n - head), threads_per_block, 0, s>>>(base + head, delta + head,
                                                                 n - head);
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

/// Host buffers through device 0, synchronously; returns nullptr or an error.
const char* cuda_xor_roundtrip(void* host_base, const void* host_delta, size_t n) noexcept {
  if (n == 0)
    return nullptr;
  void* dev_base = nullptr;
  void* dev_delta = nullptr;
  const char* failure = nullptr;
  auto check = [&](cudaError_t err) {
    if (err != cudaSuccess && failure == nullptr)
      failure = cudaGetErrorString(err);
    return failure == nullptr;
  };
  if (check(cudaSetDevice(0)) && check(cudaMalloc(&dev_base, n)) && check(cudaMalloc(&dev_delta, n))
      && check(cudaMemcpy(dev_base, host_base, n, cudaMemcpyHostToDevice))
      && check(cudaMemcpy(dev_delta, host_delta, n, cudaMemcpyHostToDevice))) {
    if (const char* launch = cuda_xor_launch(dev_base, dev_delta, n, nullptr))
      failure = launch;
    else if (check(cudaDeviceSynchronize()))
      check(cudaMemcpy(host_base, dev_base, n, cudaMemcpyDeviceToHost));
  }
  cudaFree(dev_base);
  cudaFree(dev_delta);
  return failure;
}

} // namespace stitch::gpu::detail
