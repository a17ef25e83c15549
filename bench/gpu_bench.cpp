// The GPU figures of DESIGN §8, each a ratio to a limit measured in the same
// run on the same device:
//   - host-to-device staging (the pipeline from pageable memory through its
//     pinned ring, and from registered staging buffers) vs cudaMemcpy from
//     pinned memory;
//   - xor-apply and checksum on the device vs device-to-device memcpy, as
//     memory traffic (xor reads two bytes and writes one per byte; the
//     checksum reads one; a copy reads one and writes one);
//   - NCCL broadcast (with one GPU, a self-broadcast) vs that memcpy;
//   - the activation pause of the CUDA engine for a ~1 GB and a ~16 GB bf16
//     model (O(1): a pointer swap), and its decode tokens/s.
// With --hf-dir DIR it instead writes a small checkpoint there, serves it
// with the CUDA engine and records greedy tokens and logprobs for
// bench/gpu_hf_check.py to compare with Hugging Face transformers.
// Without a device it says why and exits 0. Run by bench/gpu_check.sh.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu/device.hpp"
#include "gpu/device_memory.hpp"
#include "gpu/nccl_group.hpp"
#include "gpu/stager.hpp"
#include "runtime/engine/builtin_engine.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/engine/tokenizer.hpp"
#include "runtime/engine/weights.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/materialize.hpp"
#include "runtime/pipeline/publisher.hpp"
#include "runtime/pipeline/store_tensor_source.hpp"
#include "store/memory_store.hpp"

namespace {

using namespace stitch;
using clock_type = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "gpu_bench: %s\n", what.c_str());
  std::exit(1);
}

template <class T>
T must(result<T> r, const char* what) {
  if (!r)
    die(std::string{what} + ": " + r.error().message);
  return std::move(*r);
}

void must(status s, const char* what) {
  if (!s)
    die(std::string{what} + ": " + s.error().message);
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// Best of `reps` timings of `fn` on the device, in seconds (CUDA events
/// around it on `stream`, which `fn` must use).
template <class F>
double device_seconds(gpu::device_stream& stream, int reps, F&& fn) {
  auto a = must(gpu::device_event::create(0), "event");
  auto b = must(gpu::device_event::create(0), "event");
  double best = 1e9;
  for (int i = 0; i < reps; ++i) {
    must(a.record(stream), "record");
    fn();
    must(b.record(stream), "record");
    must(b.synchronize(), "sync");
    best = std::min(best, must(b.elapsed_ms_since(a), "elapsed") / 1000.0);
  }
  return best;
}

template <class F>
double wall_seconds(int reps, F&& fn) {
  double best = 1e9;
  for (int i = 0; i < reps; ++i) {
    auto t0 = clock_type::now();
    fn();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

engine::model_config bf16_model(uint32_t hidden, uint32_t intermediate, uint32_t layers,
                                uint32_t heads, uint32_t kv_heads) {
  engine::model_config c;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.vocab_size = engine::tokenizer::vocab_size;
  c.max_position_embeddings = 256;
  c.torch_dtype = engine::weight_dtype::bfloat16;
  return c;
}

struct engine_figures {
  double gb = 0;
  double anchor_stage_s = 0;
  /// The making of the anchor's host tensors as the engine makes them:
  /// fresh (mapping and page locking), then again from the buffers the
  /// first released (the allocator's recycling, as from a replica's third
  /// version on).
  double anchor_host_alloc_s = 0;
  double anchor_host_realloc_s = 0;
  /// The anchor read from the store into recycled host tensors, their making
  /// included: the host side of the stage, no device.
  double anchor_host_read_s = 0;
  /// Bytes of the stage's tensors that were recycled buffers.
  double stage_recycled_gb = 0;
  double pause_us = 0;
  double tokens_per_s = 0;
};

/// Publishes random weights of `config`, stages them on a CUDA engine as a
/// cold replica would, times the activation, then (with `decode`) runs
/// `batch` greedy requests together.
/// With `on_host`, the engine stages its device copy on gpu/'s host stand-in
/// and computes on the CPU (`--engine-on-host`: this bench's own check on a
/// machine without a GPU).
engine_figures measure_engine(const engine::model_config& config, uint32_t batch, bool decode,
                              bool on_host = false) {
  engine_figures f;
  stitch::testing::memory_store db;
  {
    auto w = must(engine::random_init(config, 5), "random weights");
    for (const auto& [name, t] : w)
      f.gb += static_cast<double>(t.bytes.size()) / 1e9;
    // The run's remembered copy stays in memory (the ~16 GB model's would
    // otherwise go to a scratch file): host memory peaks at three copies.
    pipeline::publisher_options po;
    po.memory_limit = uint64_t{64} << 30;
    pipeline::publisher pub{db, po};
    must(pub.publish({"default", "bench", 0, true, false}, w), "publish");
  }
  engine::builtin_engine::options o;
  o.device = on_host ? stitch::engine_device::cpu : stitch::engine_device::cuda;
  o.device_copy_on_host = on_host;
  o.max_batch = batch;
  auto e = must(engine::builtin_engine::create(config, o), "CUDA engine");
  pipeline::store_tensor_source src{db, "default"};
  chain_plan plan;
  plan.target = {"bench", 0};
  plan.anchor = version_ref{"bench", 0};
  plan.reset_to_boot = true;
  plan.activation_needed = true;
  {
    auto anchor = must(src.manifest_of(*plan.anchor), "manifest");
    auto specs = must(pipeline::read_tensor_specs(anchor), "tensor specs");
    auto make_all = [&] {
      std::vector<std::shared_ptr<engine::tensor_buffer>> made;
      for (auto& info : specs)
        made.push_back(
          must(engine::make_tensor_buffer(info.name, info.type, info.shape), "tensor"));
      return made;
    };
    auto t0 = clock_type::now();
    make_all();
    f.anchor_host_alloc_s = seconds_since(t0);
    // Released as they were made: kept (the engine reserved a version's worth).
    auto t1 = clock_type::now();
    auto kept = make_all();
    f.anchor_host_realloc_s = seconds_since(t1);
    for (size_t i = 0; i < specs.size(); ++i)
      must(src.read(anchor.ref, specs[i].name, 0, kept[i]->bytes.bytes()), "read");
    f.anchor_host_read_s = seconds_since(t1);
  }
  const auto reused_before = gpu::staging_allocator().recycling().reused_bytes;
  auto t0 = clock_type::now();
  must(e->stage(plan, false, src), "stage");
  f.anchor_stage_s = seconds_since(t0);
  f.stage_recycled_gb =
    static_cast<double>(gpu::staging_allocator().recycling().reused_bytes - reused_before) / 1e9;
  auto t1 = clock_type::now();
  must(e->commit(), "commit");
  f.pause_us = seconds_since(t1) * 1e6;
  if (!decode)
    return f;
  const uint32_t tokens = 64;
  auto one = [&](uint32_t i) {
    generation_request r;
    r.id = i + 1;
    r.prompt = "request " + std::to_string(i);
    r.sampling.temperature = 0;
    r.sampling.max_new_tokens = tokens;
    auto out = e->generate(r, {});
    if (!out)
      die("generate: " + out.error().message);
    return out->tokens.size();
  };
  one(0); // warm-up
  auto t2 = clock_type::now();
  std::vector<std::future<size_t>> running;
  for (uint32_t i = 0; i < batch; ++i)
    running.push_back(std::async(std::launch::async, one, i));
  size_t made = 0;
  for (auto& r : running)
    made += r.get();
  f.tokens_per_s = static_cast<double>(made) / seconds_since(t2);
  return f;
}

int hf_check(const std::filesystem::path& dir, bool on_host) {
  auto config = must(engine::preset("small"), "preset");
  auto weights = must(engine::random_init(config, 3), "random weights");
  std::filesystem::remove_all(dir);
  std::map<std::string, std::string> files{{"config.json", engine::render_model_config(config)}};
  must(pipeline::write_hf_directory(dir, weights, default_max_shard_bytes, files),
       "write checkpoint");
  stitch::testing::memory_store db;
  pipeline::publisher pub{db};
  must(pub.publish({"default", "hf", 0, true, false, files}, weights), "publish");
  engine::builtin_engine::options o;
  o.device = on_host ? stitch::engine_device::cpu : stitch::engine_device::cuda;
  o.device_copy_on_host = on_host;
  o.max_batch = 4;
  auto e = must(engine::builtin_engine::create(config, o), "CUDA engine");
  pipeline::store_tensor_source src{db, "default"};
  must(e->reset_to_boot({"hf", 0}, src), "stage");
  nlohmann::json out = nlohmann::json::array();
  for (const char* prompt : {"Stitch moves weights", "a", "policy version 7 says"}) {
    generation_request r;
    r.id = 1;
    r.prompt = prompt;
    r.sampling.temperature = 0;
    r.sampling.max_new_tokens = 24;
    r.return_logprob = true;
    auto got = must(e->generate(r, {}), "generate");
    out.push_back({{"prompt_tokens", engine::tokenizer{}.encode(prompt)},
                   {"tokens", got.tokens},
                   {"logprobs", got.logprobs}});
  }
  std::ofstream{dir / "stitch_cuda.json"} << out.dump();
  std::printf("wrote %s\n", (dir / "stitch_cuda.json").c_str());
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  bool json = false;
  size_t mb = 1024;
  bool big = true;
  std::filesystem::path hf_dir;
  bool engine_on_host = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json")
      json = true;
    else if (a == "--mb" && i + 1 < argc)
      mb = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--no-big")
      big = false;
    else if (a == "--hf-dir" && i + 1 < argc)
      hf_dir = argv[++i];
    else if (a == "--engine-on-host")
      engine_on_host = true;
    else {
      std::fprintf(stderr, "usage: gpu_bench [--mb N] [--no-big] [--json] [--hf-dir DIR] "
                           "[--engine-on-host]\n");
      return 2;
    }
  }
  if (engine_on_host) {
    // The engine parts of this bench without a GPU: they must run to the end.
    if (!hf_dir.empty())
      return hf_check(hf_dir, true);
    auto f = measure_engine(bf16_model(256, 704, 2, 4, 2), 4, true, true);
    std::printf("{\"engine_on_host\":true,\"gb\":%.4f,\"pause_us\":%.1f,\"tokens_per_s\":%.0f}\n",
                f.gb, f.pause_us, f.tokens_per_s);
    return 0;
  }
  if (auto why = gpu::why_no_device(); !why.empty()) {
    if (json)
      std::printf("{\"skipped\":%s}\n", nlohmann::json(why).dump().c_str());
    else
      std::printf("gpu_bench: skipped: %s\n", why.c_str());
    return 0;
  }
  if (!hf_dir.empty())
    return hf_check(hf_dir, false);

  const size_t n = mb << 20;
  auto stream = must(gpu::device_stream::create(0), "stream");
  auto pinned = must(gpu::pinned_buffer::allocate(0, n), "pinned memory");
  std::vector<std::byte> pageable(n, std::byte{7});
  std::memset(pinned.bytes().data(), 3, n);
  auto a = must(gpu::device_buffer::allocate(0, n), "device memory");
  auto b = must(gpu::device_buffer::allocate(0, n), "device memory");
  must(gpu::copy_to_device(b, 0, pageable, stream), "fill");
  must(stream.synchronize(), "sync");

  // Host to device.
  const double peak_s = device_seconds(
    stream, 3, [&] { must(gpu::copy_to_device(a, 0, pinned.bytes(), stream), "copy"); });
  auto stager = must(gpu::device_stager::create(0), "stager");
  const double ring_s = wall_seconds(3, [&] {
    must(stager->write(a, 0, pageable, false), "stage");
    must(stager->finish(), "finish");
  });
  gpu::staging_allocator().add_registrar(std::make_shared<gpu::pinned_registrar>());
  auto staged = must(gpu::staging_allocator().allocate(n), "staging buffer");
  std::memset(staged.data(), 5, n);
  const double registered_s = wall_seconds(3, [&] {
    must(stager->write(a, 0, staged.bytes(), true), "stage");
    must(stager->finish(), "finish");
  });

  // On the device.
  const double copy_s =
    device_seconds(stream, 5, [&] { must(gpu::copy_on_device(a, 0, b, 0, n, stream), "copy"); });
  const double xor_s =
    device_seconds(stream, 5, [&] { must(gpu::xor_on_device(a, 0, b, 0, n, stream), "xor"); });
  const double sum_s =
    wall_seconds(5, [&] { (void) must(gpu::device_tree_checksum(a, 0, n, stream), "checksum"); });
  {
    // The device's digest equals the CPU's, on these very bytes.
    std::vector<std::byte> back(n);
    must(gpu::copy_to_host(back, a, 0, stream), "copy back");
    must(stream.synchronize(), "sync");
    if (must(gpu::device_tree_checksum(a, 0, n, stream), "checksum")
        != checksum::tree_checksum(back))
      die("the device checksum differs from the CPU's");
  }
  double nccl_s = 0;
  std::string nccl_problem;
  if (auto group = gpu::nccl_group::create({0})) {
    const gpu::device_buffer* dst[] = {&a};
    nccl_s = wall_seconds(3, [&] { must((*group)->broadcast(0, b, dst), "broadcast"); });
  } else {
    nccl_problem = group.error().message;
  }
  const double gb = static_cast<double>(n) / 1e9;
  const double copy_traffic = 2 * gb / copy_s;

  // The engine: ~1 GB (with decode) and ~16 GB (pause only).
  auto small = measure_engine(bf16_model(2048, 5632, 11, 16, 4), 16, true);
  engine_figures large;
  if (big)
    large = measure_engine(bf16_model(4096, 14336, 36, 32, 8), 1, false);

  nlohmann::ordered_json j;
  j["device"] = gpu::device_name(0);
  j["mb"] = mb;
  j["h2d_peak_gbs"] = gb / peak_s;
  j["h2d_ring_ratio"] = peak_s / ring_s;
  j["h2d_registered_ratio"] = peak_s / registered_s;
  j["d2d_copy_traffic_gbs"] = copy_traffic;
  j["xor_apply_ratio"] = (3 * gb / xor_s) / copy_traffic;
  j["checksum_ratio"] = (gb / sum_s) / copy_traffic;
  j["checksum_gbs"] = gb / sum_s;
  if (nccl_s > 0)
    j["nccl_broadcast_ratio"] = (2 * gb / nccl_s) / copy_traffic;
  else
    j["nccl_problem"] = nccl_problem;
  j["engine_small_gb"] = small.gb;
  j["engine_small_anchor_stage_s"] = small.anchor_stage_s;
  j["engine_small_stage_vs_host_read_ratio"] = small.anchor_host_read_s / small.anchor_stage_s;
  j["engine_small_host_alloc_s"] = small.anchor_host_alloc_s;
  j["engine_small_host_realloc_s"] = small.anchor_host_realloc_s;
  j["engine_small_stage_recycled_gb"] = small.stage_recycled_gb;
  j["engine_small_pause_us"] = small.pause_us;
  j["decode_tokens_per_s"] = small.tokens_per_s;
  if (big) {
    j["engine_large_gb"] = large.gb;
    j["engine_large_anchor_stage_s"] = large.anchor_stage_s;
    j["engine_large_host_read_s"] = large.anchor_host_read_s;
    j["engine_large_host_alloc_s"] = large.anchor_host_alloc_s;
    j["engine_large_host_realloc_s"] = large.anchor_host_realloc_s;
    j["engine_large_stage_recycled_gb"] = large.stage_recycled_gb;
    j["engine_large_stage_vs_host_read_ratio"] = large.anchor_host_read_s / large.anchor_stage_s;
    j["engine_large_pause_us"] = large.pause_us;
    j["pause_flatness_ratio"] = large.pause_us / std::max(small.pause_us, 1e-3);
  }
  if (json) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  for (auto it = j.begin(); it != j.end(); ++it)
    std::printf("%-30s %s\n", it.key().c_str(), it.value().dump().c_str());
  std::printf("targets: xor_apply_ratio, checksum_ratio >= 0.7; pauses <= 1000 us and flat\n");
  return 0;
}
