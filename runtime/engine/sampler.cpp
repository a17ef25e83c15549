#include "runtime/engine/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/engine/model.hpp"

namespace stitch::engine {

namespace {

uint64_t mix64(uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// Counter-based uniform in [0, 1): a hash of (seed, counter), no state.
double uniform(uint64_t seed, uint64_t counter) noexcept {
  uint64_t z = mix64(seed + 0x9e3779b97f4a7c15ULL);
  z = mix64(z ^ (counter * 0xd1b54a32d192ed03ULL + 0x8cb92ba72f3d8dd7ULL));
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

} // namespace

status validate(const sampling_options& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0.0 || o.temperature > 100.0) {
    return make_error(errc::invalid_argument, "sampling: temperature must be in [0, 100]");
  }
  if (!std::isfinite(o.top_p) || o.top_p <= 0.0 || o.top_p > 1.0) {
    return make_error(errc::invalid_argument, "sampling: top_p must be in (0, 1]");
  }
  for (const auto& s : o.stop) {
    if (s.empty()) {
      return make_error(errc::invalid_argument, "sampling: empty stop string");
    }
  }
  return {};
}

result<sampled_token> sample(std::span<const float> logits, const sampling_options& o,
                             uint64_t counter) {
  if (logits.empty()) {
    return make_error(errc::invalid_argument, "sampling: empty logits");
  }
  for (float l : logits) {
    if (!std::isfinite(l)) {
      return make_error(errc::invalid_argument, "sampling: non-finite logits");
    }
  }
  const bool greedy = o.temperature == 0.0;
  const double inv_t = greedy ? 1.0 : 1.0 / o.temperature;
  const size_t vocab = logits.size();
  size_t best = 0;
  for (size_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) {
      best = i;
    }
  }
  const double top = logits[best] * inv_t;
  std::vector<double> weight(vocab);
  double total = 0.0;
  for (size_t i = 0; i < vocab; ++i) {
    weight[i] = std::exp(logits[i] * inv_t - top);
    total += weight[i];
  }
  const double log_total = top + std::log(total);

  size_t chosen = best;
  if (!greedy) {
    std::vector<uint32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0U);
    size_t keep = vocab;
    if (o.top_k > 0 || o.top_p < 1.0) {
      std::stable_sort(order.begin(), order.end(),
                       [&](uint32_t a, uint32_t b) { return weight[a] > weight[b]; });
      if (o.top_k > 0) {
        keep = std::min<size_t>(keep, o.top_k);
      }
      if (o.top_p < 1.0) {
        double kept_mass = 0.0;
        for (size_t i = 0; i < keep; ++i) {
          kept_mass += weight[order[i]];
        }
        double cumulative = 0.0;
        size_t nucleus = 0;
        while (nucleus < keep && cumulative < o.top_p * kept_mass) {
          cumulative += weight[order[nucleus]];
          ++nucleus;
        }
        keep = std::max<size_t>(nucleus, 1);
      }
    }
    double mass = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      mass += weight[order[i]];
    }
    double target = uniform(o.seed, counter) * mass;
    chosen = order[keep - 1];
    double cumulative = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += weight[order[i]];
      if (target < cumulative) {
        chosen = order[i];
        break;
      }
    }
  }
  return sampled_token{static_cast<int32_t>(chosen),
                       static_cast<float>(logits[chosen] * inv_t - log_total)};
}

result<generation_output> generate(const weights& w, const model_config& config,
                                   const tokenizer& tok, std::string_view prompt,
                                   const sampling_options& options) {
  if (!(config == w.config)) {
    return make_error(errc::invalid_argument, "generate: config does not match the weights");
  }
  // Not owned: the caller keeps `w` alive for the call.
  std::shared_ptr<const weights> fixed{std::shared_ptr<const weights>{}, &w};
  return generate([&] { return fixed; }, tok, prompt, options);
}

decoder::decoder(const model_config& config, const tokenizer& tok, const sampling_options& options)
    : config_(config), tok_(&tok), options_(options), seq_(std::make_unique<sequence>(config)) {}

result<decoder> decoder::start(const model_config& config, const tokenizer& tok,
                               std::string_view prompt, const sampling_options& options) {
  if (config.vocab_size < tokenizer::vocab_size) {
    return make_error(errc::invalid_argument, "generate: vocab_size "
                                                + std::to_string(config.vocab_size)
                                                + " is smaller than the tokenizer's "
                                                + std::to_string(tokenizer::vocab_size));
  }
  if (auto ok = validate(options); !ok) {
    return std::move(ok).error();
  }
  decoder d{config, tok, options};
  d.prompt_ = tok.encode(prompt);
  if (d.prompt_.size() >= config.max_position_embeddings) {
    return make_error(errc::limit_exceeded, "generate: prompt of "
                                              + std::to_string(d.prompt_.size())
                                              + " tokens does not fit max_position_embeddings "
                                              + std::to_string(config.max_position_embeddings));
  }
  d.out_.prompt_tokens = static_cast<uint32_t>(d.prompt_.size());
  d.out_.finish_reason = "length";
  d.done_ = options.max_tokens == 0 || d.prompt_.empty();
  for (const auto& s : options.stop) {
    d.longest_stop_ = std::max(d.longest_stop_, s.size());
  }
  return d;
}

int32_t decoder::next_token() const noexcept {
  return fed_prompt_ < prompt_.size() ? prompt_[fed_prompt_] : pending_;
}

void decoder::abort() {
  if (!done_) {
    done_ = true;
    out_.finish_reason = "abort";
  }
}

status decoder::on_logits(std::span<const float> logits) {
  if (done_) {
    return make_error(errc::invalid_argument, "generate: logits after the end of the request");
  }
  if (fed_prompt_ < prompt_.size() && ++fed_prompt_ < prompt_.size()) {
    return {}; // still reading the prompt: its logits are not sampled
  }
  auto picked = sample(logits, options_, out_.tokens.size());
  if (!picked) {
    return std::move(picked).error();
  }
  out_.tokens.push_back(picked->token);
  out_.logprobs.push_back(picked->logprob);
  if (options_.stop_at_eos && picked->token == tokenizer::eos) {
    out_.finish_reason = "stop";
    done_ = true;
    return {};
  }
  int32_t fed[] = {picked->token};
  std::string piece = tok_->decode(fed);
  std::string& text = out_.text;
  text += piece;
  if (!piece.empty() && longest_stop_ > 0) {
    // Only a match that ends in the new bytes is new.
    size_t from = text.size() >= piece.size() + longest_stop_ - 1
                    ? text.size() - piece.size() - longest_stop_ + 1
                    : 0;
    size_t cut = std::string::npos;
    for (const auto& s : options_.stop) {
      cut = std::min(cut, text.find(s, from));
    }
    if (cut != std::string::npos) {
      text.resize(cut);
      out_.finish_reason = "stop";
      done_ = true;
      return {};
    }
  }
  if (out_.tokens.size() >= options_.max_tokens
      || seq_->position >= config_.max_position_embeddings) {
    done_ = true;
    return {};
  }
  pending_ = picked->token;
  return {};
}

generation_output decoder::finish() && {
  out_.routed_experts = std::move(seq_->routed_experts);
  return std::move(out_);
}

result<generation_output> generate(const weights_source& current, const tokenizer& tok,
                                   std::string_view prompt, const sampling_options& options,
                                   const std::function<bool()>& cancelled) {
  auto first = current();
  if (!first) {
    return make_error(errc::engine_unavailable, "generate: no weights are served");
  }
  const model_config config = first->config;
  first.reset();
  auto started = decoder::start(config, tok, prompt, options);
  if (!started) {
    return std::move(started).error();
  }
  decoder& d = *started;
  while (!d.done()) {
    if (cancelled && cancelled()) {
      d.abort();
      break;
    }
    auto w = current();
    if (!w) {
      return make_error(errc::engine_unavailable, "generate: the weights went away mid-request");
    }
    if (!(w->config == config)) {
      return make_error(errc::invalid_argument,
                        "generate: the served weights changed shape mid-request");
    }
    sequence* batch[] = {&d.seq()};
    int32_t feed[] = {d.next_token()};
    auto r = step(*w, batch, feed);
    if (!r) {
      return std::move(r).error();
    }
    if (auto ok = d.on_logits((*r)[0]); !ok) {
      return std::move(ok).error();
    }
  }
  return std::move(d).finish();
}

} // namespace stitch::engine
