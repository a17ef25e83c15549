#include "gpu/llama.hpp"

#include <algorithm>
#include <string>

namespace stitch::gpu {

status validate(const llama_shape& s) {
  auto bad = [](std::string what) { return make_error(errc::invalid_argument, std::move(what)); };
  if (s.hidden == 0 || s.intermediate == 0 || s.layers == 0 || s.heads == 0 || s.kv_heads == 0
      || s.vocab == 0 || s.max_positions == 0)
    return bad("a llama shape needs every dimension above 0");
  if (s.hidden % s.heads != 0)
    return bad("hidden " + std::to_string(s.hidden) + " is not a multiple of heads "
               + std::to_string(s.heads));
  if (s.heads % s.kv_heads != 0)
    return bad("heads " + std::to_string(s.heads) + " is not a multiple of kv_heads "
               + std::to_string(s.kv_heads));
  if (s.head_dim() % 2 != 0)
    return bad("head_dim " + std::to_string(s.head_dim()) + " is odd: rotary needs pairs");
  if (!(s.rms_norm_eps > 0) || !(s.rope_theta > 0))
    return bad("rms_norm_eps and rope_theta must be positive");
  return {};
}

uint64_t llama_runner::workspace_bytes(const llama_shape& s, uint32_t slots) noexcept {
  const uint64_t n = slots;
  const uint64_t kv = 2ULL * s.layers * n * s.max_positions * s.kv_width() * sizeof(float);
  const uint64_t activations =
    n * (6ULL * s.hidden + 2ULL * s.kv_width() + 2ULL * s.intermediate + s.vocab) * sizeof(float);
  const uint64_t narrow = s.bf16 ? n * std::max(s.hidden, s.intermediate) * 2ULL : 0;
  const uint64_t scores = n * s.heads * uint64_t{s.max_positions} * sizeof(float);
  const uint64_t indices = n * 3 * sizeof(int32_t);
  return kv + activations + narrow + scores + indices;
}

} // namespace stitch::gpu

#ifndef STITCH_HAVE_CUDA
namespace stitch::gpu {

struct llama_runner::impl {
  llama_shape shape;
  uint32_t slots = 0;
};

llama_runner::llama_runner(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
llama_runner::~llama_runner() = default;

result<std::unique_ptr<llama_runner>> llama_runner::create(int, const llama_shape& shape,
                                                           uint32_t) {
  if (auto ok = validate(shape); !ok)
    return std::move(ok).error();
  return make_error(errc::engine_unavailable,
                    "the CUDA forward pass needs a build with CUDA; this one has none (no nvcc)");
}

const llama_shape& llama_runner::shape() const noexcept {
  return impl_->shape;
}
uint32_t llama_runner::slots() const noexcept {
  return impl_->slots;
}
int llama_runner::device() const noexcept {
  return -1;
}
status llama_runner::step(const llama_tensors&, std::span<const llama_token>, std::span<float>) {
  return make_error(errc::engine_unavailable, "this build of Stitch has no CUDA (no nvcc)");
}

} // namespace stitch::gpu
#endif
