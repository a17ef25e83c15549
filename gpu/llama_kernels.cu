// CUDA side of gpu/llama.hpp: the decoder step as cuBLAS GEMMs and kernels.
// The kernels compute what runtime/engine/model.cpp computes, element for
// element; on fp32 weights only reduction orders differ (block reductions,
// cuBLAS's tiles). On bf16 weights the GEMMs' activations are also rounded
// to bf16 (the CPU widens the weights and keeps fp32 activations).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/cuda_check.cuh"
#include "gpu/dynamic_library.hpp"
#include "gpu/llama.hpp"

namespace stitch::gpu {

namespace {

// --- cuBLAS, loaded at run time ----------------------------------------------

struct cublas_api {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
  std::string error;
};

const cublas_api& cublas() {
  static cublas_api api;
  static std::once_flag once;
  std::call_once(once, [] {
    auto lib = open_library("cuBLAS", "STITCH_CUBLAS",
                            {"libcublas.so.13", "libcublas.so.12", "libcublas.so"});
    api.create = reinterpret_cast<decltype(api.create)>(lib.symbol("cublasCreate_v2"));
    api.destroy = reinterpret_cast<decltype(api.destroy)>(lib.symbol("cublasDestroy_v2"));
    api.set_stream = reinterpret_cast<decltype(api.set_stream)>(lib.symbol("cublasSetStream_v2"));
    api.set_math_mode =
      reinterpret_cast<decltype(api.set_math_mode)>(lib.symbol("cublasSetMathMode"));
    api.sgemm = reinterpret_cast<decltype(api.sgemm)>(lib.symbol("cublasSgemm_v2"));
    api.gemm_ex = reinterpret_cast<decltype(api.gemm_ex)>(lib.symbol("cublasGemmEx"));
    api.error = lib.error;
  });
  return api;
}

status cuda_check(cudaError_t err, const char* what) {
  return cuda::check(err, what);
}

status blas_check(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS)
    return {};
  return make_error(errc::engine_unavailable, std::string{"cuBLAS "} + what + " failed (status "
                                                + std::to_string(static_cast<int>(st)) + ")");
}

// --- kernels -----------------------------------------------------------------

constexpr unsigned block = 256;

__device__ __forceinline__ float load(const void* p, size_t i, bool bf16) {
  if (bf16)
    return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffU, v, o);
  const unsigned warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0)
    shared[warp] = v;
  __syncthreads();
  float total = 0;
  if (threadIdx.x < 32) {
    total = threadIdx.x < blockDim.x / 32 ? shared[threadIdx.x] : 0.0F;
    for (int o = 16; o > 0; o >>= 1)
      total += __shfl_xor_sync(0xffffffffU, total, o);
    if (threadIdx.x == 0)
      shared[0] = total;
  }
  __syncthreads();
  total = shared[0];
  __syncthreads();
  return total;
}

__device__ float block_max(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffU, v, o));
  const unsigned warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0)
    shared[warp] = v;
  __syncthreads();
  float top = -INFINITY;
  if (threadIdx.x < 32) {
    top = threadIdx.x < blockDim.x / 32 ? shared[threadIdx.x] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1)
      top = fmaxf(top, __shfl_xor_sync(0xffffffffU, top, o));
    if (threadIdx.x == 0)
      shared[0] = top;
  }
  __syncthreads();
  top = shared[0];
  __syncthreads();
  return top;
}

__global__ void embed_kernel(const int32_t* tokens, const void* embed, bool bf16, uint32_t hidden,
                             float* x) {
  const size_t b = blockIdx.x;
  const size_t row = static_cast<size_t>(tokens[b]) * hidden;
  for (uint32_t d = threadIdx.x; d < hidden; d += blockDim.x)
    x[b * hidden + d] = load(embed, row + d, bf16);
}

/// HF RMSNorm of row blockIdx.x: out = w * (x / sqrt(mean(x^2) + eps)).
__global__ void rms_norm_kernel(const float* x, const void* w, bool bf16, uint32_t n, float eps,
                                float* out) {
  __shared__ float shared[32];
  const float* row = x + static_cast<size_t>(blockIdx.x) * n;
  float sum = 0;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
    sum += row[i] * row[i];
  sum = block_sum(sum, shared);
  const float scale = 1.0F / sqrtf(sum / static_cast<float>(n) + eps);
  float* o = out + static_cast<size_t>(blockIdx.x) * n;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
    o[i] = load(w, i, bf16) * (row[i] * scale);
}

__global__ void to_bf16_kernel(const float* in, size_t n, __nv_bfloat16* out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(blockDim.x) * gridDim.x)
    out[i] = __float2bfloat16(in[i]);
}

/// Rotary ("rotate_half") of every head of row b at positions[b]; one thread
/// per (row, head, pair). Angles in double, as the CPU computes them.
__global__ void rope_kernel(float* rows, uint32_t width, uint32_t heads, uint32_t head_dim,
                            const uint32_t* positions, uint32_t count, double theta) {
  const uint32_t half = head_dim / 2;
  const size_t total = static_cast<size_t>(count) * heads * half;
  for (size_t t = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<size_t>(blockDim.x) * gridDim.x) {
    const uint32_t i = t % half;
    const uint32_t head = (t / half) % heads;
    const uint32_t b = t / (static_cast<size_t>(half) * heads);
    double inv_freq = 1.0 / pow(theta, static_cast<double>(2 * i) / head_dim);
    double angle = static_cast<double>(positions[b]) * inv_freq;
    const float c = static_cast<float>(cos(angle));
    const float s = static_cast<float>(sin(angle));
    float* h = rows + static_cast<size_t>(b) * width + static_cast<size_t>(head) * head_dim;
    const float x1 = h[i];
    const float x2 = h[i + half];
    h[i] = x1 * c - x2 * s;
    h[i + half] = x2 * c + x1 * s;
  }
}

/// Writes row b's key and value at (slot, position) of one layer's cache.
__global__ void kv_append_kernel(const float* k, const float* v, const uint32_t* slots,
                                 const uint32_t* positions, uint32_t kv_width,
                                 uint32_t max_positions, float* keys, float* values) {
  const size_t b = blockIdx.x;
  const size_t at = (static_cast<size_t>(slots[b]) * max_positions + positions[b]) * kv_width;
  for (uint32_t d = threadIdx.x; d < kv_width; d += blockDim.x) {
    keys[at + d] = k[b * kv_width + d];
    values[at + d] = v[b * kv_width + d];
  }
}

/// Attention of row blockIdx.x, head blockIdx.y over positions 0..pos.
__global__ void attention_kernel(const float* q, const float* keys, const float* values,
                                 const uint32_t* slots, const uint32_t* positions, uint32_t heads,
                                 uint32_t kv_heads, uint32_t head_dim, uint32_t max_positions,
                                 float* scores, float* out) {
  __shared__ float shared[32];
  const uint32_t b = blockIdx.x;
  const uint32_t head = blockIdx.y;
  const uint32_t kv_head = head / (heads / kv_heads);
  const uint32_t kv_width = kv_heads * head_dim;
  const uint32_t len = positions[b] + 1;
  const size_t base = static_cast<size_t>(slots[b]) * max_positions * kv_width
                      + static_cast<size_t>(kv_head) * head_dim;
  const float* qh =
    q + static_cast<size_t>(b) * heads * head_dim + static_cast<size_t>(head) * head_dim;
  float* s = scores + (static_cast<size_t>(b) * heads + head) * max_positions;
  const float scale = 1.0F / sqrtf(static_cast<float>(head_dim));
  float top = -INFINITY;
  for (uint32_t p = threadIdx.x; p < len; p += blockDim.x) {
    const float* kp = keys + base + static_cast<size_t>(p) * kv_width;
    float dot = 0;
    for (uint32_t d = 0; d < head_dim; ++d)
      dot += qh[d] * kp[d];
    s[p] = dot * scale;
    top = fmaxf(top, s[p]);
  }
  top = block_max(top, shared);
  float total = 0;
  for (uint32_t p = threadIdx.x; p < len; p += blockDim.x) {
    s[p] = expf(s[p] - top);
    total += s[p];
  }
  total = block_sum(total, shared); // its barriers also publish s[]
  float* o = out + static_cast<size_t>(b) * heads * head_dim + static_cast<size_t>(head) * head_dim;
  for (uint32_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0;
    for (uint32_t p = 0; p < len; ++p)
      acc += (s[p] / total) * values[base + static_cast<size_t>(p) * kv_width + d];
    o[d] = acc;
  }
}

__global__ void add_kernel(float* x, const float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(blockDim.x) * gridDim.x)
    x[i] += y[i];
}

__global__ void swiglu_kernel(float* gate, const float* up, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(blockDim.x) * gridDim.x) {
    const float g = gate[i];
    gate[i] = g / (1.0F + expf(-g)) * up[i];
  }
}

unsigned grid_for(size_t n) {
  size_t g = (n + block - 1) / block;
  return static_cast<unsigned>(g < 4096 ? (g == 0 ? 1 : g) : 4096);
}

} // namespace

// --- the runner --------------------------------------------------------------

struct llama_runner::impl {
  int device = 0;
  llama_shape shape;
  uint32_t slots = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  std::vector<void*> allocations;
  float* keys = nullptr; // [layer][slot][position][kv_width]
  float* values = nullptr;
  float *x = nullptr, *xn = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *attn = nullptr,
        *proj = nullptr, *gate = nullptr, *up = nullptr, *logits = nullptr, *scores = nullptr;
  __nv_bfloat16* narrow = nullptr;
  int32_t* tokens = nullptr;
  uint32_t* slot_ids = nullptr;
  uint32_t* positions = nullptr;
  // Pinned host mirrors of the step's indices and logits.
  int32_t* host_indices = nullptr;
  float* host_logits = nullptr;

  ~impl() {
    if (stream)
      cudaStreamSynchronize(stream);
    cudaSetDevice(device);
    if (blas)
      cublas().destroy(blas);
    for (void* p : allocations)
      cudaFree(p);
    if (host_indices)
      cudaFreeHost(host_indices);
    if (host_logits)
      cudaFreeHost(host_logits);
    if (stream)
      cudaStreamDestroy(stream);
  }

  template <class T>
  status alloc(T*& out, size_t count) {
    void* p = nullptr;
    if (count == 0)
      count = 1;
    cudaError_t err = cudaMalloc(&p, count * sizeof(T));
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return make_error(errc::limit_exceeded, "CUDA device " + std::to_string(device) + " has no "
                                                + std::to_string(count * sizeof(T))
                                                + " bytes free for the forward pass's workspace");
    }
    if (auto ok = cuda_check(err, "cudaMalloc"); !ok)
      return ok;
    allocations.push_back(p);
    out = static_cast<T*>(p);
    return {};
  }

  /// y[b][r] = W[r] . x[b] for `n` rows of `cols` inputs, `rows` outputs.
  status gemm(const void* w, const float* in, size_t n, uint32_t rows, uint32_t cols, float* y) {
    const float alpha = 1.0F;
    const float beta = 0.0F;
    const int m = static_cast<int>(rows);
    const int nn = static_cast<int>(n);
    const int kk = static_cast<int>(cols);
    if (!shape.bf16)
      return blas_check(cublas().sgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, kk, &alpha,
                                       static_cast<const float*>(w), kk, in, kk, &beta, y, m),
                        "SGEMM");
    to_bf16_kernel<<<grid_for(n * cols), block, 0, stream>>>(in, n * cols, narrow);
    return blas_check(cublas().gemm_ex(blas, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, kk, &alpha, w,
                                       CUDA_R_16BF, kk, narrow, CUDA_R_16BF, kk, &beta, y,
                                       CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      "GemmEx (bf16)");
  }
};

llama_runner::llama_runner(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
llama_runner::~llama_runner() = default;

const llama_shape& llama_runner::shape() const noexcept {
  return impl_->shape;
}
uint32_t llama_runner::slots() const noexcept {
  return impl_->slots;
}
int llama_runner::device() const noexcept {
  return impl_->device;
}

result<std::unique_ptr<llama_runner>> llama_runner::create(int device, const llama_shape& shape,
                                                           uint32_t slots) {
  if (auto ok = validate(shape); !ok)
    return std::move(ok).error();
  if (slots == 0)
    return make_error(errc::invalid_argument, "a forward pass needs at least one KV slot");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();
    return make_error(errc::engine_unavailable, "CUDA device " + std::to_string(device)
                                                  + " is not there (" + std::to_string(count)
                                                  + " visible)");
  }
  const auto& api = cublas();
  if (!api.error.empty())
    return make_error(errc::engine_unavailable, api.error);
  auto p = std::make_unique<impl>();
  p->device = device;
  p->shape = shape;
  p->slots = slots;
  if (auto ok = cuda_check(cudaSetDevice(device), "cudaSetDevice"); !ok)
    return std::move(ok).error();
  if (auto ok = cuda_check(cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking),
                           "cudaStreamCreate");
      !ok)
    return std::move(ok).error();
  if (auto ok = blas_check(api.create(&p->blas), "create"); !ok)
    return std::move(ok).error();
  if (auto ok = blas_check(api.set_stream(p->blas, p->stream), "set stream"); !ok)
    return std::move(ok).error();
  // fp32 stays fp32: the default math mode never rounds inputs to TF32
  // (that takes CUBLAS_TF32_TENSOR_OP_MATH), and bf16 GEMMs keep their
  // tensor cores with fp32 accumulation.
  if (auto ok = blas_check(api.set_math_mode(p->blas, CUBLAS_DEFAULT_MATH), "set math mode"); !ok)
    return std::move(ok).error();
  const size_t n = slots;
  const size_t kv = size_t{shape.layers} * n * shape.max_positions * shape.kv_width();
  auto allocate = [&]() -> status {
    if (auto e = p->alloc(p->keys, kv); !e)
      return e;
    if (auto e = p->alloc(p->values, kv); !e)
      return e;
    if (auto e = p->alloc(p->x, n * shape.hidden); !e)
      return e;
    if (auto e = p->alloc(p->xn, n * shape.hidden); !e)
      return e;
    if (auto e = p->alloc(p->q, n * shape.hidden); !e)
      return e;
    if (auto e = p->alloc(p->attn, n * shape.hidden); !e)
      return e;
    if (auto e = p->alloc(p->proj, n * shape.hidden); !e)
      return e;
    if (auto e = p->alloc(p->k, n * shape.kv_width()); !e)
      return e;
    if (auto e = p->alloc(p->v, n * shape.kv_width()); !e)
      return e;
    if (auto e = p->alloc(p->gate, n * shape.intermediate); !e)
      return e;
    if (auto e = p->alloc(p->up, n * shape.intermediate); !e)
      return e;
    if (auto e = p->alloc(p->logits, n * shape.vocab); !e)
      return e;
    if (auto e = p->alloc(p->scores, n * shape.heads * size_t{shape.max_positions}); !e)
      return e;
    if (shape.bf16)
      if (auto e = p->alloc(p->narrow, n * std::max(shape.hidden, shape.intermediate)); !e)
        return e;
    if (auto e = p->alloc(p->tokens, n); !e)
      return e;
    if (auto e = p->alloc(p->slot_ids, n); !e)
      return e;
    if (auto e = p->alloc(p->positions, n); !e)
      return e;
    return {};
  };
  status ok = allocate();
  if (!ok)
    return std::move(ok).error();
  void* hi = nullptr;
  void* hl = nullptr;
  if (auto c = cuda_check(cudaHostAlloc(&hi, 3 * n * sizeof(int32_t), 0), "cudaHostAlloc"); !c)
    return std::move(c).error();
  p->host_indices = static_cast<int32_t*>(hi);
  if (auto c = cuda_check(cudaHostAlloc(&hl, n * shape.vocab * sizeof(float), 0), "cudaHostAlloc");
      !c)
    return std::move(c).error();
  p->host_logits = static_cast<float*>(hl);
  return std::unique_ptr<llama_runner>{new llama_runner(std::move(p))};
}

status llama_runner::step(const llama_tensors& w, std::span<const llama_token> batch,
                          std::span<float> logits) {
  impl& r = *impl_;
  const llama_shape& s = r.shape;
  const size_t n = batch.size();
  if (n == 0)
    return {};
  if (n > r.slots)
    return make_error(errc::invalid_argument, "a step of " + std::to_string(n)
                                                + " sequences, but the runner has "
                                                + std::to_string(r.slots) + " slots");
  if (w.layers.size() != s.layers)
    return make_error(errc::invalid_argument, "weights of " + std::to_string(w.layers.size())
                                                + " layers for a model of "
                                                + std::to_string(s.layers));
  if (logits.size() != n * s.vocab)
    return make_error(errc::invalid_argument, "logits buffer of the wrong size");
  if (auto ok = cuda_check(cudaSetDevice(r.device), "cudaSetDevice"); !ok)
    return ok;
  cudaStream_t st = r.stream;
  // A step that failed part-way may have left copies from the pinned
  // indices queued: they are done before the indices are rewritten below.
  if (auto ok = cuda_check(cudaStreamSynchronize(st), "the previous step"); !ok)
    return ok;
  std::vector<bool> seen(r.slots, false);
  for (size_t b = 0; b < n; ++b) {
    const auto& t = batch[b];
    if (t.slot >= r.slots || seen[t.slot])
      return make_error(errc::invalid_argument,
                        "step: slot " + std::to_string(t.slot) + " is outside the runner or twice");
    seen[t.slot] = true;
    if (t.position >= s.max_positions)
      return make_error(errc::limit_exceeded, "step: position " + std::to_string(t.position)
                                                + " is at max_position_embeddings");
    if (t.token < 0 || static_cast<uint32_t>(t.token) >= s.vocab)
      return make_error(errc::invalid_argument,
                        "step: token " + std::to_string(t.token) + " is outside the vocabulary");
    r.host_indices[b] = t.token;
    r.host_indices[r.slots + b] = static_cast<int32_t>(t.slot);
    r.host_indices[2 * r.slots + b] = static_cast<int32_t>(t.position);
  }
  auto copy_in = [&](void* dst, const int32_t* src) {
    return cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(int32_t), cudaMemcpyHostToDevice, st),
                      "cudaMemcpyAsync of the step's indices");
  };
  if (auto ok = copy_in(r.tokens, r.host_indices); !ok)
    return ok;
  if (auto ok = copy_in(r.slot_ids, r.host_indices + r.slots); !ok)
    return ok;
  if (auto ok = copy_in(r.positions, r.host_indices + 2 * r.slots); !ok)
    return ok;
  const uint32_t h = s.hidden;
  const uint32_t kvw = s.kv_width();
  const uint32_t hd = s.head_dim();
  const uint32_t im = s.intermediate;
  const float eps = static_cast<float>(w.rms_norm_eps);
  const size_t layer_cache = size_t{r.slots} * s.max_positions * kvw;
  embed_kernel<<<static_cast<unsigned>(n), block, 0, st>>>(r.tokens, w.embed_tokens, s.bf16, h,
                                                           r.x);
  for (uint32_t l = 0; l < s.layers; ++l) {
    const llama_layer_tensors& lw = w.layers[l];
    rms_norm_kernel<<<static_cast<unsigned>(n), block, 0, st>>>(r.x, lw.input_layernorm, s.bf16, h,
                                                                eps, r.xn);
    if (auto ok = r.gemm(lw.q_proj, r.xn, n, h, h, r.q); !ok)
      return ok;
    if (auto ok = r.gemm(lw.k_proj, r.xn, n, kvw, h, r.k); !ok)
      return ok;
    if (auto ok = r.gemm(lw.v_proj, r.xn, n, kvw, h, r.v); !ok)
      return ok;
    rope_kernel<<<grid_for(n * s.heads * hd / 2), block, 0, st>>>(
      r.q, h, s.heads, hd, r.positions, static_cast<uint32_t>(n), w.rope_theta);
    rope_kernel<<<grid_for(n * s.kv_heads * hd / 2), block, 0, st>>>(
      r.k, kvw, s.kv_heads, hd, r.positions, static_cast<uint32_t>(n), w.rope_theta);
    float* keys = r.keys + l * layer_cache;
    float* values = r.values + l * layer_cache;
    kv_append_kernel<<<static_cast<unsigned>(n), block, 0, st>>>(
      r.k, r.v, r.slot_ids, r.positions, kvw, s.max_positions, keys, values);
    attention_kernel<<<dim3(static_cast<unsigned>(n), s.heads), 128, 0, st>>>(
      r.q, keys, values, r.slot_ids, r.positions, s.heads, s.kv_heads, hd, s.max_positions,
      r.scores, r.attn);
    if (auto ok = r.gemm(lw.o_proj, r.attn, n, h, h, r.proj); !ok)
      return ok;
    add_kernel<<<grid_for(n * h), block, 0, st>>>(r.x, r.proj, n * h);
    rms_norm_kernel<<<static_cast<unsigned>(n), block, 0, st>>>(r.x, lw.post_attention_layernorm,
                                                                s.bf16, h, eps, r.xn);
    if (auto ok = r.gemm(lw.gate_proj, r.xn, n, im, h, r.gate); !ok)
      return ok;
    if (auto ok = r.gemm(lw.up_proj, r.xn, n, im, h, r.up); !ok)
      return ok;
    swiglu_kernel<<<grid_for(n * im), block, 0, st>>>(r.gate, r.up, n * im);
    if (auto ok = r.gemm(lw.down_proj, r.gate, n, h, im, r.proj); !ok)
      return ok;
    add_kernel<<<grid_for(n * h), block, 0, st>>>(r.x, r.proj, n * h);
  }
  rms_norm_kernel<<<static_cast<unsigned>(n), block, 0, st>>>(r.x, w.norm, s.bf16, h, eps, r.xn);
  if (auto ok = r.gemm(w.lm_head, r.xn, n, s.vocab, h, r.logits); !ok)
    return ok;
  if (auto ok = cuda_check(cudaGetLastError(), "a forward-pass kernel launch"); !ok)
    return ok;
  if (auto ok = cuda_check(cudaMemcpyAsync(r.host_logits, r.logits, n * s.vocab * sizeof(float),
                                           cudaMemcpyDeviceToHost, st),
                           "cudaMemcpyAsync of the logits");
      !ok)
    return ok;
  if (auto ok = cuda_check(cudaStreamSynchronize(st), "the forward pass"); !ok)
    return ok;
  std::copy(r.host_logits, r.host_logits + n * s.vocab, logits.begin());
  return {};
}

} // namespace stitch::gpu
