// Variants of gpu/checksum_kernel.cu's chunk digest kernel, timed on one
// device against a plain coalesced read of the same bytes, to find what
// limits the kernel (bench/README.md, gpu_bench's checksum_ratio). Built and
// run by bench/profile/checksum/run.sh on the GPU machine.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "gpu/xxh3_blocks.hpp"

namespace x = stitch::gpu::xxh3;

constexpr size_t chunk_size = size_t{1} << 20;

#define CHECK(call)                                                                                \
  do {                                                                                             \
    cudaError_t check_e_ = (call);                                                                 \
    if (check_e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(check_e_));                       \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

__constant__ unsigned char secret[x::secret_size];

template <unsigned PW, unsigned BATCH, unsigned MINB, bool CHAIN>
__global__ void __launch_bounds__((PW + 1) * 32, MINB)
  digest(const unsigned char* __restrict__ data, size_t bytes, uint64_t* __restrict__ out) {
  constexpr size_t round_blocks = PW * 8;
  __shared__ uint64_t keys[128];
  __shared__ uint64_t sums[2][round_blocks * 8];
  const size_t chunk = blockIdx.x;
  const size_t offset = chunk * chunk_size;
  const size_t rest = bytes - offset;
  const size_t len = rest < chunk_size ? rest : chunk_size;
  for (size_t t = threadIdx.x; t < 128; t += blockDim.x)
    keys[t] = x::stripe_key(secret, (t / 8) * 8, t % 8);
  __syncthreads();
  const unsigned char* in = data + offset;
  const size_t full = x::full_blocks(len);
  const size_t rounds = (full + round_blocks - 1) / round_blocks;
  const unsigned warp = threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  uint64_t acc = lane < 8 ? x::initial_acc(lane) : 0;
  const uint64_t skey = lane < 8 ? x::scramble_key(secret, lane) : 0;
  for (size_t r = 0; r <= rounds; ++r) {
    if (warp < PW) {
      const size_t local = warp * 8 + lane / 4;
      const size_t b = r * round_blocks + local;
      if (r < rounds && b < full) {
        const size_t k = lane % 4;
        const unsigned char* p = in + b * x::block_len + 16 * k;
        uint64_t even = 0, odd = 0;
#pragma unroll
        for (size_t s0 = 0; s0 < 16; s0 += BATCH) {
          ulonglong2 v[BATCH];
#pragma unroll
          for (size_t i = 0; i < BATCH; ++i)
            v[i] = __ldg(reinterpret_cast<const ulonglong2*>(p + (s0 + i) * 64));
#pragma unroll
          for (size_t i = 0; i < BATCH; ++i) {
            uint64_t w[2] = {v[i].x, v[i].y};
            even += x::stripe_term(w, keys[(s0 + i) * 8 + 2 * k], 0);
            odd += x::stripe_term(w, keys[(s0 + i) * 8 + 2 * k + 1], 1);
          }
        }
        sums[r % 2][local * 8 + 2 * k] = even;
        sums[r % 2][local * 8 + 2 * k + 1] = odd;
      }
    } else if (CHAIN && r > 0 && lane < 8) {
      const size_t first = (r - 1) * round_blocks;
      const size_t n = full - first < round_blocks ? full - first : round_blocks;
      const uint64_t* round = sums[(r - 1) % 2];
      for (size_t j = 0; j < n; ++j)
        acc = x::chain_step(acc, round[j * 8 + lane], skey);
    } else if (!CHAIN && r > 0 && lane < 8) {
      acc += sums[(r - 1) % 2][lane];
    }
    __syncthreads();
  }
  if (warp == PW) {
    if (lane < 8)
      acc = x::lane_tail(acc, in, len, secret, lane);
    uint64_t all[8];
    for (int i = 0; i < 8; ++i)
      all[i] = __shfl_sync(0xffffffffU, acc, i);
    if (lane == 0)
      out[chunk] = x::merge(all, secret, len);
  }
}

/// The bytes read once, coalesced, 16 bytes a thread per step (the read limit).
__global__ void read_all(const ulonglong2* __restrict__ data, size_t n, uint64_t* out) {
  uint64_t a = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    ulonglong2 v = __ldg(data + i);
    a ^= v.x ^ v.y;
  }
  if (a == 42)
    out[0] = a;
}

template <class F>
float best_ms(F&& f, int reps = 10) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  float best = 1e9f;
  for (int i = 0; i < reps; ++i) {
    CHECK(cudaEventRecord(a));
    f();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    best = ms < best ? ms : best;
  }
  return best;
}

template <unsigned PW, unsigned BATCH, unsigned MINB, bool CHAIN>
void variant(const char* name, const unsigned char* d, size_t bytes, uint64_t* out,
             std::vector<uint64_t>& reference) {
  const size_t chunks = bytes / chunk_size;
  auto k = digest<PW, BATCH, MINB, CHAIN>;
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, (PW + 1) * 32, 0));
  cudaFuncAttributes attr{};
  CHECK(cudaFuncGetAttributes(&attr, k));
  float ms = best_ms([&] { k<<<chunks, (PW + 1) * 32>>>(d, bytes, out); });
  CHECK(cudaGetLastError());
  std::vector<uint64_t> got(chunks);
  CHECK(cudaMemcpy(got.data(), out, chunks * 8, cudaMemcpyDeviceToHost));
  const char* same = "";
  if (CHAIN) {
    if (reference.empty())
      reference = got;
    else if (got != reference)
      same = " DIFFERENT DIGESTS";
  }
  std::printf("%-28s %6zu MiB  %8.1f us  %7.0f GB/s  regs %3d  blocks/SM %d%s\n", name, bytes >> 20,
              ms * 1000, bytes / (ms * 1e6), attr.numRegs, per_sm, same);
}

int main() {
  CHECK(cudaMemcpyToSymbol(secret, stitch::gpu::xxh3_default_secret.b, x::secret_size));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  for (size_t mb : {size_t{64}, size_t{256}, size_t{1024}, size_t{4096}}) {
    const size_t bytes = mb << 20;
    unsigned char* d = nullptr;
    uint64_t* out = nullptr;
    CHECK(cudaMalloc(&d, bytes));
    CHECK(cudaMalloc(&out, (bytes / chunk_size) * 8));
    CHECK(cudaMemset(d, 0x5A, bytes));
    float copy = 0;
    {
      unsigned char* e = nullptr;
      CHECK(cudaMalloc(&e, bytes));
      copy = best_ms([&] { CHECK(cudaMemcpyAsync(e, d, bytes, cudaMemcpyDeviceToDevice)); });
      CHECK(cudaFree(e));
    }
    float read = best_ms([&] {
      read_all<<<prop.multiProcessorCount * 8, 256>>>(reinterpret_cast<const ulonglong2*>(d),
                                                      bytes / 16, out);
    });
    std::printf("copy traffic %.0f GB/s, plain read %.0f GB/s\n", 2 * bytes / (copy * 1e6),
                bytes / (read * 1e6));
    std::vector<uint64_t> reference;
    variant<8, 8, 4, true>("pw8 batch8 min4 (shipped)", d, bytes, out, reference);
    variant<8, 8, 4, false>("pw8 batch8 min4 no chain", d, bytes, out, reference);
    variant<8, 16, 1, true>("pw8 batch16", d, bytes, out, reference);
    variant<8, 4, 4, true>("pw8 batch4 min4", d, bytes, out, reference);
    variant<16, 8, 2, true>("pw16 batch8 min2", d, bytes, out, reference);
    variant<4, 8, 8, true>("pw4 batch8 min8", d, bytes, out, reference);
    variant<4, 16, 4, true>("pw4 batch16 min4", d, bytes, out, reference);
    variant<2, 16, 8, true>("pw2 batch16 min8", d, bytes, out, reference);
    CHECK(cudaFree(d));
    CHECK(cudaFree(out));
  }
  return 0;
}
