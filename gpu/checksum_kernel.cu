// The DESIGN §1 checksum's chunk digests on the device (gpu/cuda_backend.hpp),
// through the block decomposition of gpu/xxh3_blocks.hpp: one thread block
// per 1 MiB chunk. Eight producer warps sum the stripe terms of the chunk's
// 1 KiB blocks, 64 blocks a round: each thread one block's 16-byte column
// (16 coalesced loads, two lanes' terms, no shuffles). A ninth warp runs the
// lanes' scramble chains over the last round's sums while the producers read
// the next round, so the only sequential part of XXH3 overlaps the memory
// traffic instead of following it; then it adds the tail and merges.
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

constexpr unsigned producer_warps = 8;
constexpr unsigned threads = (producer_warps + 1) * 32;
/// Threads per block's column pairs: a block's 16-byte columns.
constexpr unsigned pairs = x::stripe_len / 16;
constexpr size_t round_blocks = producer_warps * 32 / pairs; // 64
constexpr size_t key_words = x::stripes_per_block * x::lanes;
constexpr size_t shared_bytes = (key_words + 2 * round_blocks * x::lanes) * sizeof(uint64_t);
static_assert(shared_bytes <= 48 * 1024);

__constant__ unsigned char secret[x::secret_size];

__global__ void __launch_bounds__(threads, 4)
  chunk_digest_kernel(const unsigned char* __restrict__ data, size_t bytes,
                      uint64_t* __restrict__ digests) {
  __shared__ uint64_t keys[key_words];
  __shared__ uint64_t sums[2][round_blocks * x::lanes];
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
  const bool aligned16 = reinterpret_cast<uintptr_t>(in) % 16 == 0;
  const size_t full = x::full_blocks(len);
  const size_t rounds = (full + round_blocks - 1) / round_blocks;
  const unsigned warp = threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  // The chain warp's lanes 0..7 each carry one accumulator.
  uint64_t acc = lane < x::lanes ? x::initial_acc(lane) : 0;
  const uint64_t scramble_key = lane < x::lanes ? x::scramble_key(secret, lane) : 0;
  // Round r is summed into sums[r % 2] while the chain runs over round r - 1.
  for (size_t r = 0; r <= rounds; ++r) {
    if (warp < producer_warps) {
      const size_t local = warp * (32 / pairs) + lane / pairs;
      const size_t b = r * round_blocks + local;
      if (r < rounds && b < full) {
        const size_t k = lane % pairs;
        uint64_t even = 0;
        uint64_t odd = 0;
        x::pair_block_sums(in + b * x::block_len, keys, k, aligned16, even, odd);
        sums[r % 2][local * x::lanes + 2 * k] = even;
        sums[r % 2][local * x::lanes + 2 * k + 1] = odd;
      }
    } else if (r > 0 && lane < x::lanes) {
      const size_t first = (r - 1) * round_blocks;
      const size_t n = full - first < round_blocks ? full - first : round_blocks;
      const uint64_t* round = sums[(r - 1) % 2];
      for (size_t j = 0; j < n; ++j)
        acc = x::chain_step(acc, round[j * x::lanes + lane], scramble_key);
    }
    __syncthreads();
  }
  if (warp == producer_warps) {
    if (lane < x::lanes)
      acc = x::lane_tail(acc, in, len, secret, lane);
    uint64_t all[x::lanes];
    for (int i = 0; i < static_cast<int>(x::lanes); ++i)
      all[i] = __shfl_sync(0xffffffffU, acc, i);
    if (lane == 0)
      digests[chunk] = x::merge(all, secret, len);
  }
}

/// Once per process and device: the secret into constant memory, and a
/// memory pool for the digests that keeps what it had. (The device's default
/// pool hands its memory back at every synchronize, and mapping it again cost
/// each checksum more than hashing 1 GiB on an H200 takes; this one holds
/// only the digests of the checksums in flight, 8 bytes per MiB.)
result<cudaMemPool_t> prepare() {
  constexpr int max_devices = 64;
  static std::mutex mutex;
  static cudaMemPool_t pools[max_devices] = {};
  int device = 0;
  if (auto ok = check(cudaGetDevice(&device), "cudaGetDevice"); !ok)
    return std::move(ok).error();
  if (device < 0 || device >= max_devices)
    return make_error(errc::invalid_argument,
                      "device checksum on device " + std::to_string(device));
  std::lock_guard guard{mutex};
  if (pools[device])
    return pools[device];
  if (auto ok = check(cudaMemcpyToSymbol(secret, xxh3_default_secret.b, x::secret_size),
                      "cudaMemcpyToSymbol");
      !ok)
    return std::move(ok).error();
  // The copy runs on the legacy stream, which the kernel's non-blocking
  // stream does not wait for: done before any kernel reads the secret.
  if (auto ok = check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); !ok)
    return std::move(ok).error();
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  if (auto ok = check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate"); !ok)
    return std::move(ok).error();
  uint64_t keep = UINT64_MAX;
  if (auto ok = check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
                      "cudaMemPoolSetAttribute");
      !ok) {
    cudaMemPoolDestroy(pool);
    return std::move(ok).error();
  }
  pools[device] = pool;
  return pool;
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
  auto pool = prepare();
  if (!pool)
    return std::move(pool).error();
  auto s = static_cast<cudaStream_t>(stream);
  void* out = nullptr;
  if (auto ok = check(cudaMallocFromPoolAsync(&out, chunks * sizeof(uint64_t), *pool, s),
                      "cudaMallocFromPoolAsync");
      !ok)
    return ok;
  chunk_digest_kernel<<<static_cast<unsigned>(chunks), threads, 0, s>>>(
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
