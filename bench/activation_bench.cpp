// activation_bench: stage time and pause time of weight updates on the
// built-in engine, for models of about 16 MB, 128 MB and 1 GB. The pause is
// the time the engine is stopped (pause -> commit -> resume); staging (fetch,
// decode, apply, verify, prepare) runs while serving. Targets: pause <= 1 ms
// at every size and flat across sizes; a cold replica's stage of the anchor
// from the local store at least 0.5 x the disk's sequential read, measured in
// the same run. Also prints generation throughput of the built-in engine for
// the tiny and small presets.
//
//   activation_bench [--max-mb N | --mb N] [--json]

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/engine/builtin_engine.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/pipeline/publisher.hpp"
#include "runtime/pipeline/store_tensor_source.hpp"
#include "runtime/store/rocksdb_store.hpp"

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
  /// A cold replica: the anchor staged from the store and activated.
  double anchor_stage_s;
  /// Sequential read of as many bytes, page cache dropped.
  double read_s;
  /// The next version (a sliver of every tensor changed) staged while serving.
  double stage_s;
  double pause_s;
};

/// Asks the kernel to drop the cached pages of every file under `dir` (the
/// store's shards), so staging reads what a cold replica would.
void drop_cache(const std::filesystem::path& dir) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file())
      continue;
    int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0)
      continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

/// Writes `bytes` to a file, syncs it, drops it from the page cache and reads
/// it back sequentially: the seconds the read took.
double raw_read_seconds(const std::filesystem::path& file, uint64_t bytes) {
  std::vector<char> block(8 << 20, 'x');
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    die("cannot create " + file.string());
  for (uint64_t done = 0; done < bytes; done += block.size())
    if (::write(fd, block.data(), block.size()) != static_cast<ssize_t>(block.size()))
      die("write failed");
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  fd = ::open(file.c_str(), O_RDONLY);
  auto t0 = clock_type::now();
  for (ssize_t n; (n = ::read(fd, block.data(), block.size())) > 0;)
    ;
  const double s = seconds_since(t0);
  ::close(fd);
  std::filesystem::remove(file);
  return s;
}

row measure(const engine::model_config& config, const std::filesystem::path& dir) {
  auto opened = store::open_rocksdb_store((dir / "db").string());
  if (!opened)
    die(to_string(opened.error()));
  auto& db = **opened;
  pipeline::publisher pub{db};
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

  // A cold replica, best of three (the disk is shared and noisy).
  pipeline::store_tensor_source src{db, "default"};
  double anchor_stage_s = 1e9;
  double read_s = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    engine::builtin_engine cold{config};
    drop_cache(dir / "db" / "versions");
    auto t_anchor = clock_type::now();
    if (auto ok = cold.reset_to_boot({"bench", 0}, src); !ok)
      die(to_string(ok.error()));
    anchor_stage_s = std::min(anchor_stage_s, seconds_since(t_anchor));
    read_s = std::min(read_s, raw_read_seconds(dir / "raw", bytes));
  }
  engine::builtin_engine e{config};
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
  return {static_cast<double>(bytes) / (1 << 20), anchor_stage_s, read_s, stage_s, pause_s};
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
    if ((a == "--max-mb" || a == "--mb") && i + 1 < argc)
      max_mb = std::strtod(argv[++i], nullptr);
    else if (a == "--json")
      json = true;
    else {
      std::fprintf(stderr, "usage: activation_bench [--max-mb N | --mb N] [--json]\n");
      return 2;
    }
  }
  const auto dir = std::filesystem::temp_directory_path() / "stitch-activation-bench";
  // On a virtual machine whose memory the host backs lazily, the first touch
  // of a page costs far more than later ones: charge that once-per-machine
  // cost to no measured step (a long-running replica's memory is warm).
  {
    const size_t warm = static_cast<size_t>(std::min(max_mb, 1100.0) * 4) << 20;
    auto* p = static_cast<volatile char*>(std::malloc(warm));
    for (size_t i = 0; p && i < warm; i += 4096)
      p[i] = 1;
    std::free(const_cast<char*>(p));
  }
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
  if (rows.empty())
    die("no model fits --max-mb");
  const row& largest = rows.back();
  const double anchor_ratio = largest.read_s / largest.anchor_stage_s;
  if (json) {
    std::printf("{\"rows\":[");
    for (size_t i = 0; i < rows.size(); ++i)
      std::printf("%s{\"mb\":%.1f,\"anchor_stage_s\":%.4f,\"read_s\":%.4f,"
                  "\"anchor_stage_ratio\":%.3f,\"stage_s\":%.4f,\"pause_us\":%.1f,"
                  "\"pause_stage_ratio\":%.2e}",
                  i ? "," : "", rows[i].mb, rows[i].anchor_stage_s, rows[i].read_s,
                  rows[i].read_s / rows[i].anchor_stage_s, rows[i].stage_s, rows[i].pause_s * 1e6,
                  rows[i].pause_s / rows[i].stage_s);
    std::printf("],\"anchor_stage_ratio\":%.3f,\"max_pause_us\":%.1f,"
                "\"pause_flatness_ratio\":%.2f,\"tiny_tokens_per_s\":%.0f,"
                "\"small_tokens_per_s\":%.0f}\n",
                anchor_ratio, max_pause * 1e6, min_pause / max_pause, tiny, small);
  } else {
    std::printf("%10s %14s %12s %12s %12s %12s %14s\n", "model MB", "anchor stage s", "read s",
                "x read", "stage s", "pause us", "pause/stage");
    for (const auto& r : rows)
      std::printf("%10.1f %14.3f %12.3f %12.2f %12.3f %12.1f %14.2e\n", r.mb, r.anchor_stage_s,
                  r.read_s, r.read_s / r.anchor_stage_s, r.stage_s, r.pause_s * 1e6,
                  r.pause_s / r.stage_s);
    std::printf("target pause <= 1000 us at every size: %s; largest/smallest pause: %.2f\n",
                max_pause <= 1e-3 ? "met" : "NOT met", max_pause / min_pause);
    std::printf("target anchor stage >= 0.5 x read (%.0f MB): %s (%.2f)\n", largest.mb,
                anchor_ratio >= 0.5 ? "met" : "NOT met", anchor_ratio);
    std::printf("generation (greedy, 1 request): tiny %.0f tokens/s, small %.0f tokens/s\n", tiny,
                small);
  }
  return 0;
}
