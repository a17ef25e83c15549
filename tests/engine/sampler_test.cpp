#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <iostream>

#include "runtime/engine/sampler.hpp"

namespace stitch::engine {
namespace {

std::shared_ptr<const weights> tiny_weights(uint64_t seed) {
  auto c = *preset("tiny");
  return *build_weights(c, *random_init(c, seed));
}

double log_softmax_at(const std::vector<float>& logits, double t, size_t i) {
  double top = -1e300;
  for (float l : logits) {
    top = std::max(top, l / t);
  }
  double total = 0;
  for (float l : logits) {
    total += std::exp(l / t - top);
  }
  return logits[i] / t - top - std::log(total);
}

TEST(sampler, greedy_is_argmax_with_its_log_softmax) {
  std::vector<float> logits{0.5F, 2.0F, -1.0F, 2.0F};
  auto s = sample(logits, sampling_options{}, 0);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->token, 1);
  EXPECT_NEAR(s->logprob, log_softmax_at(logits, 1.0, 1), 1e-6);
}

TEST(sampler, logprob_is_of_the_temperature_scaled_distribution) {
  std::vector<float> logits{0.1F, 1.0F, 0.3F, -0.2F, 0.9F};
  sampling_options o;
  o.temperature = 0.7;
  o.seed = 99;
  for (uint64_t counter = 0; counter < 20; ++counter) {
    auto s = sample(logits, o, counter);
    ASSERT_TRUE(s);
    EXPECT_NEAR(s->logprob, log_softmax_at(logits, 0.7, static_cast<size_t>(s->token)), 1e-6);
  }
}

TEST(sampler, top_k_and_top_p_cut_the_tail) {
  std::vector<float> logits{0.0F, 5.0F, 4.9F, 1.0F, 0.5F};
  sampling_options o;
  o.temperature = 1.0;
  o.top_k = 2;
  for (uint64_t counter = 0; counter < 200; ++counter) {
    o.seed = counter;
    int32_t t = sample(logits, o, counter)->token;
    EXPECT_TRUE(t == 1 || t == 2) << t;
  }
  o.top_k = 0;
  o.top_p = 0.01;
  for (uint64_t counter = 0; counter < 50; ++counter) {
    EXPECT_EQ(sample(logits, o, counter)->token, 1);
  }
}

TEST(sampler, draws_follow_the_distribution) {
  std::vector<float> logits{0.0F, std::log(3.0F)};
  sampling_options o;
  o.temperature = 1.0;
  o.seed = 5;
  int ones = 0;
  for (uint64_t counter = 0; counter < 4000; ++counter) {
    ones += sample(logits, o, counter)->token;
  }
  EXPECT_NEAR(ones / 4000.0, 0.75, 0.03);
}

TEST(sampler, bad_input_is_refused) {
  sampling_options o;
  EXPECT_FALSE(sample({}, o, 0));
  std::vector<float> nan{1.0F, NAN};
  EXPECT_FALSE(sample(nan, o, 0));
  o.temperature = -1;
  EXPECT_FALSE(validate(o));
  o.temperature = 1;
  o.top_p = 0;
  EXPECT_FALSE(validate(o));
  o.top_p = 1;
  o.stop = {""};
  EXPECT_FALSE(validate(o));
}

TEST(generate, greedy_is_deterministic) {
  auto w = tiny_weights(1);
  tokenizer tok;
  sampling_options o;
  o.max_tokens = 24;
  o.stop_at_eos = false;
  auto a = generate(*w, w->config, tok, "Hello", o);
  auto b = generate(*w, w->config, tok, "Hello", o);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->logprobs, b->logprobs);
  EXPECT_EQ(a->tokens.size(), 24u);
  EXPECT_EQ(a->logprobs.size(), 24u);
  EXPECT_EQ(a->finish_reason, "length");
  EXPECT_EQ(a->prompt_tokens, 6u);
  EXPECT_EQ(a->text, tok.decode(a->tokens));
}

TEST(generate, same_seed_same_tokens_and_logprobs) {
  auto w = tiny_weights(2);
  tokenizer tok;
  sampling_options o;
  o.temperature = 1.0;
  o.max_tokens = 32;
  o.stop_at_eos = false;
  o.seed = 1234;
  auto a = generate(*w, w->config, tok, "seeded", o);
  auto b = generate(*w, w->config, tok, "seeded", o);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->logprobs, b->logprobs);
  o.seed = 4321;
  auto c = generate(*w, w->config, tok, "seeded", o);
  ASSERT_TRUE(c);
  EXPECT_NE(a->tokens, c->tokens);
  for (float lp : a->logprobs) {
    EXPECT_LT(lp, 0.0F);
    EXPECT_TRUE(std::isfinite(lp));
  }
}

TEST(generate, stop_strings_cut_the_text) {
  auto w = tiny_weights(3);
  tokenizer tok;
  sampling_options o;
  o.temperature = 1.0;
  o.seed = 77;
  o.max_tokens = 40;
  o.stop_at_eos = false;
  auto full = generate(*w, w->config, tok, "stop", o);
  ASSERT_TRUE(full);
  ASSERT_GE(full->text.size(), 10u);
  std::string stop = full->text.substr(6, 2);
  size_t cut = full->text.find(stop);
  o.stop = {stop};
  auto stopped = generate(*w, w->config, tok, "stop", o);
  ASSERT_TRUE(stopped);
  EXPECT_EQ(stopped->finish_reason, "stop");
  EXPECT_EQ(stopped->text, full->text.substr(0, cut));
  EXPECT_EQ(stopped->tokens.size(), cut + 2);
}

TEST(generate, context_limit_ends_with_length) {
  auto c = *preset("tiny");
  c.max_position_embeddings = 8;
  auto w = *build_weights(c, *random_init(c, 1));
  tokenizer tok;
  sampling_options o;
  o.max_tokens = 100;
  o.stop_at_eos = false;
  auto out = generate(*w, c, tok, "abc", o);
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_EQ(out->finish_reason, "length");
  EXPECT_EQ(out->tokens.size(), 5u);
  EXPECT_FALSE(generate(*w, c, tok, "much too long", o));
}

TEST(generate, tiny_greedy_throughput) {
  auto w = tiny_weights(4);
  tokenizer tok;
  sampling_options o;
  o.max_tokens = 256;
  o.stop_at_eos = false;
  auto start = std::chrono::steady_clock::now();
  auto out = generate(*w, w->config, tok, "speed", o);
  auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(out);
  std::cout << "tiny greedy: " << static_cast<double>(out->tokens.size()) / seconds
            << " tokens/s\n";
}

} // namespace
} // namespace stitch::engine
