// The device side of the built-in engine that needs no GPU: the
// runner's shape and what a version must match, the pointer table, and the
// memory budget decided before anything is allocated.
#include "runtime/engine/device_model.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <future>
#include <thread>

#include "gpu/device.hpp"
#include "runtime/engine/builtin_engine.hpp"
#include "runtime/engine/device_fanout.hpp"
#include "runtime/engine/model.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/engine/weights.hpp"

namespace stitch::engine {
namespace {

model_config tiny() {
  auto c = preset("tiny");
  EXPECT_TRUE(c);
  return *c;
}

TEST(device_model, the_shape_follows_the_config_and_a_mixture_of_experts_is_refused) {
  auto c = tiny();
  auto s = llama_shape_of(c);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->hidden, c.hidden_size);
  EXPECT_EQ(s->kv_width(), c.kv_width());
  EXPECT_EQ(s->bf16, c.torch_dtype == weight_dtype::bfloat16);
  auto moe = preset("moe-tiny");
  ASSERT_TRUE(moe);
  auto refused = llama_shape_of(*moe);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("engine.device = cpu"), std::string::npos);
}

TEST(device_model, a_version_fits_the_runner_only_with_its_sizes) {
  auto c = tiny();
  auto built = *llama_shape_of(c);
  EXPECT_TRUE(fits_runner(built, c));
  auto other = c;
  other.rope_theta = 500000;
  other.rms_norm_eps = 1e-6;
  EXPECT_TRUE(fits_runner(built, other)) << "settings read per version";
  other.max_position_embeddings = c.max_position_embeddings / 2;
  EXPECT_TRUE(fits_runner(built, other)) << "fewer positions fit the KV slots";
  auto wider = c;
  wider.intermediate_size += 8;
  auto no = fits_runner(built, wider);
  ASSERT_FALSE(no);
  EXPECT_NE(no.error().message.find("intermediate_size"), std::string::npos);
  auto longer = c;
  longer.max_position_embeddings *= 2;
  EXPECT_FALSE(fits_runner(built, longer));
  auto narrower = c;
  narrower.torch_dtype =
    c.torch_dtype == weight_dtype::bfloat16 ? weight_dtype::float32 : weight_dtype::bfloat16;
  auto dtype = fits_runner(built, narrower);
  ASSERT_FALSE(dtype);
  EXPECT_NE(dtype.error().message.find("torch_dtype"), std::string::npos);
}

TEST(device_model, the_pointer_table_names_every_tensor_and_a_missing_one_is_refused) {
  auto c = tiny();
  std::map<std::string, std::shared_ptr<const gpu::device_buffer>> buffers;
  for (const auto& spec : expected_tensors(c)) {
    auto b = gpu::device_buffer::allocate(gpu::host_device, 16);
    ASSERT_TRUE(b);
    buffers[spec.name] = std::make_shared<gpu::device_buffer>(std::move(*b));
  }
  auto bound = bind_device_weights(c, buffers);
  ASSERT_TRUE(bound) << bound.error().message;
  const auto& p = (*bound)->pointers;
  EXPECT_EQ(p.embed_tokens, buffers.at("model.embed_tokens.weight")->data());
  EXPECT_EQ(p.lm_head, buffers.at("lm_head.weight")->data());
  ASSERT_EQ(p.layers.size(), c.num_hidden_layers);
  EXPECT_EQ(
    p.layers.back().down_proj,
    buffers.at("model.layers." + std::to_string(c.num_hidden_layers - 1) + ".mlp.down_proj.weight")
      ->data());
  EXPECT_EQ(p.rope_theta, c.rope_theta);
  buffers.erase("model.layers.0.self_attn.k_proj.weight");
  auto missing = bind_device_weights(c, buffers);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("model.layers.0.self_attn.k_proj.weight"),
            std::string::npos);
}

TEST(device_model, the_budget_counts_weights_twice_and_names_every_part_when_it_does_not_fit) {
  auto c = tiny();
  auto b = device_budget_for(c, 8, 32 << 20);
  const uint64_t element = c.torch_dtype == weight_dtype::bfloat16 ? 2 : 4;
  EXPECT_EQ(b.weights, c.parameter_count() * element);
  EXPECT_EQ(b.shadow, b.weights);
  EXPECT_EQ(b.workspace, gpu::llama_runner::workspace_bytes(*llama_shape_of(c), 8));
  EXPECT_GT(device_budget_for(c, 64, 0).workspace, device_budget_for(c, 8, 0).workspace)
    << "KV caches grow with the slots";
  EXPECT_EQ(b.total(), b.weights + b.shadow + b.workspace + b.staging);
  EXPECT_TRUE(check_budget(b, b.total(), "CUDA device 0 (test)"));
  auto refused = check_budget(b, b.total() - 1, "CUDA device 0 (test)");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, errc::limit_exceeded);
  for (const char* part : {"weights", "shadow", "KV cache", "staging", "CUDA device 0 (test)"})
    EXPECT_NE(refused.error().message.find(part), std::string::npos) << part;
}

TEST(device_model, the_runner_refuses_a_shape_it_cannot_run) {
  gpu::llama_shape s = *llama_shape_of(tiny());
  s.kv_heads = s.heads + 1;
  EXPECT_FALSE(gpu::validate(s));
  s = *llama_shape_of(tiny());
  s.vocab = 0;
  EXPECT_FALSE(gpu::validate(s));
}

std::shared_ptr<const device_weights> some_weights() {
  auto w = std::make_shared<device_weights>();
  auto b = gpu::device_buffer::allocate(gpu::host_device, 8);
  EXPECT_TRUE(b);
  w->buffers["t"] = std::make_shared<gpu::device_buffer>(std::move(*b));
  return w;
}

TEST(device_fanout, the_first_stager_fetches_and_the_others_wait_for_its_copy) {
  device_fanout f;
  int a = 0;
  int b = 0;
  int c = 0;
  const version_ref v{"fan-run", 7};
  EXPECT_FALSE(f.join(v, &a, std::chrono::milliseconds{0})) << "a fetches";
  auto waiting =
    std::async(std::launch::async, [&] { return f.join(v, &b, std::chrono::seconds{20}); });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds{100}), std::future_status::timeout)
    << "b waits while a stages";
  auto w = some_weights();
  f.staged(&a, v, 3, w);
  auto got = waiting.get();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->gpu, 3);
  EXPECT_EQ(got->weights, w);
  // A holder is found at once, but never by itself.
  EXPECT_TRUE(f.join(v, &c, std::chrono::milliseconds{0}));
  EXPECT_FALSE(f.find(v, &a));
  // Dropped weights are no longer offered.
  w.reset();
  got.reset();
  EXPECT_FALSE(f.find(v, &b));
}

TEST(device_fanout, a_failed_or_slow_stager_lets_the_others_fetch_themselves) {
  device_fanout f;
  int a = 0;
  int b = 0;
  const version_ref v{"fan-run", 8};
  EXPECT_FALSE(f.join(v, &a, std::chrono::milliseconds{0}));
  auto waiting =
    std::async(std::launch::async, [&] { return f.join(v, &b, std::chrono::seconds{20}); });
  std::this_thread::sleep_for(std::chrono::milliseconds{50});
  f.staged(&a, v, 0, nullptr); // a failed
  EXPECT_FALSE(waiting.get());
  // Now b stages it; a third waits only as long as its patience.
  EXPECT_FALSE(f.join(v, &b, std::chrono::milliseconds{0}));
  int c = 0;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(f.join(v, &c, std::chrono::milliseconds{200}));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds{150});
  // An engine that goes away releases whoever waits for it.
  auto released =
    std::async(std::launch::async, [&] { return f.join(v, &a, std::chrono::seconds{20}); });
  std::this_thread::sleep_for(std::chrono::milliseconds{50});
  f.withdraw(&b);
  EXPECT_FALSE(released.get());
}

/// The CUDA forward pass against the CPU's on the same weights: two
/// sequences stepped together for `steps` tokens, every logit within
/// `tolerance` and the same argmax at every step.
void compare_forward(const model_config& c, uint32_t steps, float tolerance) {
  auto tensors = random_init(c, 11);
  ASSERT_TRUE(tensors);
  auto cpu = build_weights(c, *tensors);
  ASSERT_TRUE(cpu) << cpu.error().message;
  std::map<std::string, std::shared_ptr<const gpu::device_buffer>> buffers;
  auto stream = gpu::device_stream::create(0);
  ASSERT_TRUE(stream) << stream.error().message;
  for (const auto& [name, t] : *tensors) {
    auto b = gpu::device_buffer::allocate(0, t.bytes.size());
    ASSERT_TRUE(b) << b.error().message;
    ASSERT_TRUE(gpu::copy_to_device(*b, 0, t.bytes, *stream));
    buffers[name] = std::make_shared<gpu::device_buffer>(std::move(*b));
  }
  ASSERT_TRUE(stream->synchronize());
  auto dev = bind_device_weights(c, buffers);
  ASSERT_TRUE(dev) << dev.error().message;
  auto runner = gpu::llama_runner::create(0, *llama_shape_of(c), 4);
  ASSERT_TRUE(runner) << runner.error().message;
  sequence a{c};
  sequence b{c};
  std::vector<sequence*> batch{&a, &b};
  float worst = 0;
  for (uint32_t i = 0; i < steps; ++i) {
    std::vector<int32_t> feed{static_cast<int32_t>(1 + i % 200), static_cast<int32_t>(250 - i % 7)};
    std::vector<gpu::llama_token> tokens{{2, a.position, feed[0]}, {0, b.position, feed[1]}};
    auto want = step(**cpu, batch, feed);
    ASSERT_TRUE(want);
    std::vector<float> got(2 * c.vocab_size);
    ASSERT_TRUE((*runner)->step((*dev)->pointers, tokens, got));
    for (size_t s = 0; s < 2; ++s) {
      const auto& w = (*want)[s];
      const float* g = got.data() + s * c.vocab_size;
      for (size_t v = 0; v < c.vocab_size; ++v)
        worst = std::max(worst, std::fabs(w[v] - g[v]));
      EXPECT_EQ(std::max_element(w.begin(), w.end()) - w.begin(),
                std::max_element(g, g + c.vocab_size) - g)
        << "step " << i << " sequence " << s;
    }
  }
  EXPECT_LE(worst, tolerance) << "largest logit difference";
  std::printf("forward pass CPU vs CUDA (%s, %u steps): largest logit difference %.3g\n",
              std::string{to_string(c.torch_dtype)}.c_str(), steps, static_cast<double>(worst));
}

TEST(device_model, the_cuda_forward_pass_matches_the_cpu_on_fp32_weights) {
  if (auto why = gpu::why_no_device(); !why.empty())
    GTEST_SKIP() << "needs a CUDA device: " << why;
  compare_forward(tiny(), 40, 1e-3F);
}

TEST(device_model, the_cuda_forward_pass_matches_the_cpu_on_bf16_weights) {
  if (auto why = gpu::why_no_device(); !why.empty())
    GTEST_SKIP() << "needs a CUDA device: " << why;
  auto c = tiny();
  c.torch_dtype = weight_dtype::bfloat16;
  // bf16 activations into the GEMMs (the CPU widens the weights and keeps
  // fp32 activations): a looser bound.
  compare_forward(c, 40, 5e-2F);
}

} // namespace
} // namespace stitch::engine
