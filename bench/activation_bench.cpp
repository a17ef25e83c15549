// activation_bench: stage time and pause time of weight updates on the
// built-in engine, for models of about 16 MB, 128 MB and 1 GB. The pause is
// the time the engine is stopped (pause -> commit -> resume); staging (fetch,
// decode, apply, verify, prepare) runs while serving. Target: pause <= 1 ms at
// every size and flat across sizes. Also prints generation throughput of the
// built-in engine for the tiny and small presets.
//
//   activation_bench [--max-mb N] [--json]

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/engine/builtin_engine.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/store/publisher.hpp"
#include "runtime/store/rocksdb_store.hpp"
#include "runtime/store/store_tensor_source.hpp"

namespace {

using namespace stitch;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "activation_bench: %s\n", what.c_str());
  std::exit(1);
}

engine::model_config sized(uint32_t hidden, uint32_t layers) {
  engine::model_config c;
  c.hidden_size = hidden;
  c.intermediate_size = hidden * 11 / 4;
  c.num_hidden_layers = layers;
  c.num_attention_heads = hidden / 64;
  c.num_key_value_heads = hidden / 128;
  c.vocab_size = 258;
  c.max_position_embeddings = 512;
  return c;
}

struct row {
  double mb;
  double stage_s;
  double pause_s;
};

row measure(const engine::model_config& config, const std::filesystem::path& dir) {
  auto opened = store::open_rocksdb_store((dir / "db").string());
  if (!opened)
    die(to_string(opened.error()));
  auto& db = **opened;
  store::publisher pub{db};
  auto w0 = engine::random_init(config, 1);
  if (!w0)
    die(to_string(w0.error()));
  if (auto r = pub.publish({"default", "bench", 0, true, false}, *w0); !r)
    die(to_string(r.error()));
  // A training step: a sliver of every tensor changes.
  auto w1 = *w0;
  for (auto& [name, t] : w1)
    for (size_t i = 0; i < t.bytes.size(); i += 997)
      t.bytes[i] ^= std::byte{1};
  if (auto r = pub.publish({"default", "bench", 1, false, false}, w1); !r)
    die(to_string(r.error()));
  uint64_t bytes = 0;
  for (const auto& [name, t] : *w0)
    bytes += t.bytes.size();

  engine::builtin_engine e{config};
  store::store_tensor_source src{db, "default"};
  if (auto ok = e.reset_to_boot({"bench", 0}, src); !ok)
    die(to_string(ok.error()));
  chain_plan plan;
  plan.target = {"bench", 1};
  plan.deltas = {{"bench", 1}};
  for (const auto& [name, t] : w1)
    plan.touched.insert(name);
  plan.activation_needed = true;
  auto t0 = clock_type::now();
  if (auto ok = e.stage(plan, false, src); !ok)
    die(to_string(ok.error()));
  const double stage_s = seconds_since(t0);
  t0 = clock_type::now();
  (void) e.pause();
  auto committed = e.commit();
  (void) e.resume();
  const double pause_s = seconds_since(t0);
  if (!committed)
    die(to_string(committed.error()));
  return {static_cast<double>(bytes) / (1 << 20), stage_s, pause_s};
}

double tokens_per_second(const char* name) {
  auto config = engine::preset(name);
  auto w = engine::random_init(*config, 3);
  auto weights = engine::build_weights(*config, *w);
  if (!weights)
    die(to_string(weights.error()));
  engine::sampling_options o;
  o.max_tokens = 128;
  o.stop_at_eos = false;
  auto t0 = clock_type::now();
  auto out = engine::generate(**weights, *config, engine::tokenizer{}, "bench", o);
  const double s = seconds_since(t0);
  if (!out)
    die(to_string(out.error()));
  return static_cast<double>(out->tokens.size() + out->prompt_tokens) / s;
}

} // namespace

int main(int argc, char** argv) {
  double max_mb = 1100;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--max-mb" && i + 1 < argc)
      max_mb = std::strtod(argv[++i], nullptr);
    else if (a == "--json")
      json = true;
    else {
      std::fprintf(stderr, "usage: activation_bench [--max-mb N] [--json]\n");
      return 2;
    }
  }
  const auto dir = std::filesystem::temp_directory_path() / "stitch-activation-bench";
  std::vector<std::pair<uint32_t, uint32_t>> shapes{{256, 5}, {512, 11}, {1024, 22}};
  std::vector<row> rows;
  for (auto [hidden, layers] : shapes) {
    auto config = sized(hidden, layers);
    if (static_cast<double>(config.parameter_count()) * 4 / (1 << 20) > max_mb)
      continue;
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    std::filesystem::create_directories(dir);
    rows.push_back(measure(config, dir));
    std::filesystem::remove_all(dir, ec);
  }
  const double tiny = tokens_per_second("tiny");
  const double small = tokens_per_second("small");
  double max_pause = 0, min_pause = 1e9;
  for (const auto& r : rows) {
    max_pause = std::max(max_pause, r.pause_s);
    min_pause = std::min(min_pause, r.pause_s);
  }
  if (json) {
    std::printf("{\"rows\":[");
    for (size_t i = 0; i < rows.size(); ++i)
      std::printf("%s{\"mb\":%.1f,\"stage_s\":%.4f,\"pause_us\":%.1f,\"pause_stage_ratio\":%.2e}",
                  i ? "," : "", rows[i].mb, rows[i].stage_s, rows[i].pause_s * 1e6,
                  rows[i].pause_s / rows[i].stage_s);
    std::printf("],\"max_pause_us\":%.1f,\"tiny_tokens_per_s\":%.0f,\"small_tokens_per_s\":%.0f}\n",
                max_pause * 1e6, tiny, small);
  } else {
    std::printf("%10s %12s %12s %14s\n", "model MB", "stage s", "pause us", "pause/stage");
    for (const auto& r : rows)
      std::printf("%10.1f %12.3f %12.1f %14.2e\n", r.mb, r.stage_s, r.pause_s * 1e6,
                  r.pause_s / r.stage_s);
    std::printf("target pause <= 1000 us at every size: %s; largest/smallest pause: %.2f\n",
                max_pause <= 1e-3 ? "met" : "NOT met", rows.empty() ? 0.0 : max_pause / min_pause);
    std::printf("generation (greedy, 1 request): tiny %.0f tokens/s, small %.0f tokens/s\n", tiny,
                small);
  }
  return 0;
}
