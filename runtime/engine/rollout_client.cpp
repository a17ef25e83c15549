#include "runtime/engine/rollout_client.hpp"

#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "runtime/core/base64.hpp"
#include "transport/http_client.hpp"

namespace stitch::engine {

namespace {

using json = nlohmann::json;

constexpr const char* prompt = "write letters: ";

/// Reads a 200 answer of `/generate` into `r`; false when a field is missing
/// or of the wrong type.
bool read_answer(const json& j, uint64_t min_version, rollout_result& r) {
  if (!j.is_object() || !j.contains("output_ids") || !j["output_ids"].is_array()
      || !j.contains("meta_info") || !j["meta_info"].is_object())
    return false;
  const auto& meta = j["meta_info"];
  if (!meta.contains("weight_version_start") || !meta["weight_version_start"].is_number_unsigned()
      || !meta.contains("output_token_logprobs") || !meta["output_token_logprobs"].is_array())
    return false;
  r.sample.prompt = prompt;
  for (const auto& t : j["output_ids"]) {
    if (!t.is_number_integer())
      return false;
    r.sample.tokens.push_back(t.get<int32_t>());
  }
  for (const auto& lp : meta["output_token_logprobs"]) {
    if (!lp.is_array() || lp.empty() || !lp[0].is_number())
      return false;
    r.sample.behaviour_logprobs.push_back(lp[0].get<float>());
  }
  if (r.sample.behaviour_logprobs.size() != r.sample.tokens.size())
    return false;
  r.sample.version = meta["weight_version_start"].get<uint64_t>();
  // Which version made which token: spans covering the output in order.
  if (meta.contains("weight_version_spans")) {
    const auto& spans = meta["weight_version_spans"];
    if (!spans.is_array())
      return false;
    for (const auto& sp : spans) {
      if (!sp.is_object() || !sp.contains("version") || !sp["version"].is_number_unsigned()
          || !sp.contains("first_token") || !sp["first_token"].is_number_unsigned()
          || !sp.contains("last_token") || !sp["last_token"].is_number_unsigned())
        return false;
      auto first = sp["first_token"].get<uint64_t>();
      auto last = sp["last_token"].get<uint64_t>();
      if (first != r.sample.token_versions.size() || last < first || last >= r.sample.tokens.size())
        return false;
      r.sample.token_versions.resize(last + 1, sp["version"].get<uint64_t>());
    }
    if (r.sample.token_versions.size() != r.sample.tokens.size())
      return false;
  }
  if (meta.contains("routed_experts")) {
    // SGLang's shape: base64 of little-endian int32 ids.
    const auto& routed = meta["routed_experts"];
    if (!routed.is_string())
      return false;
    auto bytes = base64_decode(routed.get<std::string>());
    if (!bytes || bytes->size() % 4 != 0)
      return false;
    r.sample.routed_experts.resize(bytes->size() / 4);
    for (size_t i = 0; i < r.sample.routed_experts.size(); ++i) {
      uint32_t v = 0;
      for (size_t b = 0; b < 4; ++b)
        v |= uint32_t{static_cast<unsigned char>((*bytes)[i * 4 + b])} << (8 * b);
      r.sample.routed_experts[i] = static_cast<int32_t>(v);
    }
  }
  r.sample.reward = lowercase_reward(r.sample.tokens);
  r.violation = r.sample.version < min_version;
  return true;
}

} // namespace

double lowercase_reward(const std::vector<int32_t>& tokens) {
  if (tokens.empty())
    return 0;
  size_t good = 0;
  for (int32_t t : tokens)
    good += (t >= 'a' && t <= 'z') ? 1 : 0;
  return static_cast<double>(good) / static_cast<double>(tokens.size());
}

rollout_result rollout_once(const rollout_target& gateway, uint64_t min_version, uint64_t seed,
                            const std::atomic<bool>* stop) {
  rollout_result r;
  transport::http_client client{transport::http_endpoint{"http", gateway.host, gateway.port}};
  json body;
  body["text"] = prompt;
  body["sampling_params"] = {{"temperature", 1.0}, {"max_new_tokens", 8}, {"sampling_seed", seed}};
  body["return_logprob"] = true;
  if (gateway.routed_experts)
    body["return_routed_experts"] = true;
  body["weight_version"] = {{"min_version", min_version}, {"exact_version", nullptr}};
  std::string text = body.dump(); // the request only views its body
  transport::http_request req;
  req.method = "POST";
  req.target = "/generate";
  req.body = text;
  req.headers = {{"Content-Type", "application/json"}, {"X-Stitch-Pool", gateway.pool}};
  for (int attempt = 0; attempt < 3000; ++attempt) {
    if (stop && stop->load()) {
      r.error = "stopped";
      return r;
    }
    auto got = client.send(req);
    if (!got) {
      r.error = to_string(got.error());
      return r;
    }
    if (got->status == 409 || got->status == 503) {
      std::this_thread::sleep_for(std::chrono::milliseconds{10});
      continue;
    }
    auto j = json::parse(got->body, nullptr, false);
    if (got->status != 200 || !read_answer(j, min_version, r)) {
      r = rollout_result{};
      r.error = "HTTP " + std::to_string(got->status) + ": " + got->body.substr(0, 200);
      return r;
    }
    r.ok = true;
    return r;
  }
  r.error = "no replica satisfied min_version " + std::to_string(min_version) + " in time";
  return r;
}

std::vector<rollout_result> rollout_batch(const rollout_target& gateway, uint64_t min_version,
                                          uint32_t count, uint64_t seed_base,
                                          const std::atomic<bool>* stop) {
  std::vector<rollout_result> results(count);
  std::vector<std::thread> drivers;
  drivers.reserve(count);
  for (uint32_t i = 0; i < count; ++i)
    drivers.emplace_back(
      [&, i] { results[i] = rollout_once(gateway, min_version, seed_base + i, stop); });
  for (auto& t : drivers)
    t.join();
  return results;
}

} // namespace stitch::engine
