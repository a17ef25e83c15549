// The DESIGN §1 checksum's chunk digests on the device (gpu/cuda_backend.hpp),
// through the block decomposition of gpu/xxh3_blocks.hpp: one thread block
// per 1 MiB chunk; its threads compute the 16 stripe terms of every 1 KiB
// block in parallel and sum them with warp shuffles into shared memory, then
// eight threads run the lanes' scramble chains and one merges them.
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "gpu/cuda_backend.hpp"
#include "gpu/cuda_check.cuh"
#include "gpu/xxh3_blocks.hpp"
#include "runtime/core/checksum.hpp"

namespace stitch::gpu::cuda {

namespace {

namespace x = xxh3;

constexpr unsigned threads = 512;
constexpr size_t max_full_blocks = (checksum::chunk_size - 1) / x::block_len;
constexpr size_t key_words = x::stripes_per_block * x::lanes;
constexpr size_t shared_bytes = (key_words + max_full_blocks * x::lanes) * sizeof(uint64_t);

__constant__ unsigned char secret[x::secret_size];

__global__ void __launch_bounds__(threads)
  chunk_digest_kernel(const unsigned char* data, size_t bytes, uint64_t* digests) {
  extern __shared__ uint64_t smem[];
  uint64_t* keys = smem;
  uint64_t* sums = smem + key_words;
  const size_t chunk = blockIdx.x;
  const size_t offset = chunk * checksum::chunk_size;
  const size_t rest = bytes - offset;
  const size_t len = rest < checksum::chunk_size ? rest : checksum::chunk_size;
  if (len <= x::midsize_max) {
    if (threadIdx.x == 0)
      digests[chunk] = 0; // the host hashes short chunks
    return;
  }
  for (size_t t = threadIdx.x; t < key_words; t += blockDim.x)
    keys[t] = x::stripe_key(secret, (t / x::lanes) * 8, t % x::lanes);
  __syncthreads();
  const unsigned char* in = data + offset;
  const size_t tasks = x::full_blocks(len) * x::stripes_per_block;
  const size_t rounded = (tasks + 31) / 32 * 32;
  for (size_t t = threadIdx.x; t < rounded; t += blockDim.x) {
    uint64_t term[x::lanes] = {};
    const size_t s = t % x::stripes_per_block;
    if (t < tasks) {
      uint64_t w[x::lanes];
      x::load_stripe(in + (t / x::stripes_per_block) * x::block_len + s * x::stripe_len, w);
      for (size_t i = 0; i < x::lanes; ++i)
        term[i] = x::stripe_term(w, keys[s * x::lanes + i], i);
    }
    // Sum over the 16 threads of a block (a half warp): xor offsets 8..1.
    for (int o = 8; o > 0; o >>= 1)
      for (size_t i = 0; i < x::lanes; ++i)
        term[i] += __shfl_xor_sync(0xffffffffU, term[i], o);
    if (t < tasks && s == 0)
      for (size_t i = 0; i < x::lanes; ++i)
        sums[(t / x::stripes_per_block) * x::lanes + i] = term[i];
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    uint64_t acc = 0;
    if (threadIdx.x < x::lanes)
      acc = x::lane_finish(sums, in, len, secret, threadIdx.x);
    uint64_t all[x::lanes];
    for (int i = 0; i < static_cast<int>(x::lanes); ++i)
      all[i] = __shfl_sync(0xffffffffU, acc, i);
    if (threadIdx.x == 0)
      digests[chunk] = x::merge(all, secret, len);
  }
}

/// Once per process and device: the secret into constant memory, the
/// kernel's shared memory above the default 48 KiB.
status prepare() {
  static std::mutex mutex;
  static int prepared_mask = 0;
  int device = 0;
  if (auto ok = check(cudaGetDevice(&device), "cudaGetDevice"); !ok)
    return ok;
  std::lock_guard guard{mutex};
  if (device < 31 && (prepared_mask & (1 << device)))
    return {};
  if (auto ok = check(cudaMemcpyToSymbol(secret, xxh3_default_secret.b, x::secret_size),
                      "cudaMemcpyToSymbol");
      !ok)
    return ok;
  // The copy runs on the legacy stream, which the kernel's non-blocking
  // stream does not wait for: done before any kernel reads the secret.
  if (auto ok = check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); !ok)
    return ok;
  if (auto ok =
        check(cudaFuncSetAttribute(chunk_digest_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(shared_bytes)),
              "cudaFuncSetAttribute");
      !ok)
    return ok;
  if (device < 31)
    prepared_mask |= 1 << device;
  return {};
}

} // namespace

status chunk_digests(const void* data, size_t bytes, uint64_t* digests, void* stream) {
  const size_t chunks = checksum::chunk_count(bytes);
  if (chunks == 0)
    return {};
  if (reinterpret_cast<uintptr_t>(data) % 8 != 0)
    return make_error(errc::invalid_argument, "device checksum of bytes not 8-byte aligned");
  cudaPointerAttributes attrs{};
  if (auto ok = check(cudaPointerGetAttributes(&attrs, data), "cudaPointerGetAttributes"); !ok)
    return ok;
  // The bytes' device, for this call only.
  int caller_device = 0;
  if (auto ok = check(cudaGetDevice(&caller_device), "cudaGetDevice"); !ok)
    return ok;
  if (auto ok = check(cudaSetDevice(attrs.device), "cudaSetDevice"); !ok)
    return ok;
  struct restore {
    int device;
    ~restore() { cudaSetDevice(device); }
  } back{caller_device};
  if (auto ok = prepare(); !ok)
    return ok;
  auto s = static_cast<cudaStream_t>(stream);
  void* out = nullptr;
  if (auto ok = check(cudaMallocAsync(&out, chunks * sizeof(uint64_t), s), "cudaMallocAsync"); !ok)
    return ok;
  chunk_digest_kernel<<<static_cast<unsigned>(chunks), threads, shared_bytes, s>>>(
    static_cast<const unsigned char*>(data), bytes, static_cast<uint64_t*>(out));
  status launched = check(cudaGetLastError(), "checksum kernel launch");
  status copied =
    launched
      ? check(cudaMemcpyAsync(digests, out, chunks * sizeof(uint64_t), cudaMemcpyDeviceToHost, s),
              "cudaMemcpyAsync of the digests")
      : status{};
  cudaFreeAsync(out, s);
  status synced = check(cudaStreamSynchronize(s), "cudaStreamSynchronize after the checksum");
  if (!launched)
    return launched;
  if (!copied)
    return copied;
  return synced;
}

} // namespace stitch::gpu::cuda
