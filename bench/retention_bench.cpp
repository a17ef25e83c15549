// retention_bench: a long run under retention. Publishes N versions (default
// 300) of the small preset (more than 10 MB each; every step changes a few
// percent of every tensor, as a training step would) into a RocksDB store,
// collecting after each publish as the publisher does with
// `store.retain_versions` (default 10). Prints the store's size on disk as a
// ratio to what retention must keep (the newest versions, the anchors their
// chains need and the boot, by their stored bytes); the limit is 1.5.
// Every retained version is then exported and compared with what was
// published, byte for byte.
//
//   retention_bench [--versions N] [--keep K] [--dir PATH] [--json]

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/checksum.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/engine/weights.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/materialize.hpp"
#include "runtime/pipeline/publisher.hpp"
#include "runtime/store/rocksdb_store.hpp"

namespace {

namespace fs = std::filesystem;
using namespace stitch;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "retention_bench: %s\n", what.c_str());
  std::exit(1);
}

uint64_t size_on_disk(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec))
      total += it->file_size(ec);
  return total;
}

/// One training step: a few percent of every tensor's bytes change.
void step(pipeline::tensor_set& w, std::mt19937_64& rng) {
  for (auto& [name, t] : w) {
    const size_t n = t.bytes.size();
    const size_t changes = std::max<size_t>(1, n / 40);
    for (size_t i = 0; i < changes; ++i)
      t.bytes[rng() % n] ^= static_cast<std::byte>(1 + rng() % 255);
  }
}

std::map<std::string, uint64_t> hashes(const pipeline::tensor_set& w) {
  std::map<std::string, uint64_t> out;
  for (const auto& [name, t] : w)
    out[name] = checksum::tree_checksum(t.bytes);
  return out;
}

} // namespace

int main(int argc, char** argv) {
  uint64_t versions = 300;
  size_t keep = 10;
  bool json = false;
  fs::path dir;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--versions" && i + 1 < argc)
      versions = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--keep" && i + 1 < argc)
      keep = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--dir" && i + 1 < argc)
      dir = argv[++i];
    else if (a == "--json")
      json = true;
    else {
      std::fprintf(stderr, "usage: retention_bench [--versions N] [--keep K] [--dir PATH] "
                           "[--json]\n");
      return 2;
    }
  }
  if (versions < 2 || keep < 1)
    die("--versions must be at least 2 and --keep at least 1");
  bool own_dir = dir.empty();
  if (own_dir)
    dir = fs::temp_directory_path() / ("retention_bench-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);

  auto config = engine::preset("small");
  if (!config)
    die(to_string(config.error()));
  auto weights = engine::random_init(*config, 7);
  if (!weights)
    die(to_string(weights.error()));
  uint64_t model_bytes = 0;
  for (const auto& [name, t] : *weights)
    model_bytes += t.bytes.size();

  auto opened = store::open_rocksdb_store((dir / "store").string());
  if (!opened)
    die(to_string(opened.error()));
  auto& db = **opened;
  pipeline::publisher_options po;
  po.scratch_dir = dir / "scratch";
  pipeline::publisher pub{db, po};
  const std::string pool = "default";
  std::mt19937_64 rng{20261130};
  std::map<uint64_t, std::map<std::string, uint64_t>> published;
  std::map<uint64_t, std::pair<uint64_t, bool>> stored; // version -> (stored bytes, full)
  uint64_t deleted_total = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (uint64_t v = 0; v < versions; ++v) {
    if (v > 0)
      step(*weights, rng);
    pipeline::memory_stream source{*weights};
    auto report = pub.publish({pool, "run", v, false, false}, source);
    if (!report)
      die("publish " + std::to_string(v) + ": " + to_string(report.error()));
    published[v] = hashes(*weights);
    stored[v] = {report->stored_bytes, report->kind == version_kind::full};
    retention_request req;
    req.keep_last = keep;
    auto collected = db.retain(pool, req);
    if (!collected)
      die("retain after " + std::to_string(v) + ": " + to_string(collected.error()));
    deleted_total += collected->deleted.size();
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // What retention must keep: the newest `keep`, the anchors their chains
  // need, the boot.
  auto listed = db.list_versions(pool, "run");
  if (!listed)
    die(to_string(listed.error()));
  std::vector<stored_version> all;
  for (const auto& [v, s] : stored)
    all.push_back({v, s.second});
  uint64_t must_bytes = 0;
  size_t must_count = 0;
  for (const auto& verdict : plan_retention(all, 0, keep))
    if (verdict.kept()) {
      must_bytes += stored[verdict.version].first;
      ++must_count;
    }
  const uint64_t on_disk = size_on_disk(dir / "store");
  const double ratio = static_cast<double>(on_disk) / static_cast<double>(must_bytes);

  // Every retained version exports to exactly what was published.
  size_t verified = 0;
  for (const auto& ref : *listed) {
    auto out = dir / "export";
    fs::remove_all(out);
    if (auto ok = pipeline::export_version(db, pool, ref, out); !ok)
      die("export " + to_string(ref) + ": " + to_string(ok.error()));
    auto back = pipeline::load_hf_directory(out);
    if (!back)
      die("reading the export of " + to_string(ref) + ": " + to_string(back.error()));
    if (hashes(*back) != published.at(ref.version))
      die("the export of " + to_string(ref) + " differs from what was published");
    ++verified;
  }
  if (listed->size() != must_count)
    die("the store lists " + std::to_string(listed->size()) + " versions; retention must keep "
        + std::to_string(must_count));

  if (json) {
    std::printf("{\"versions\":%llu,\"keep\":%zu,\"model_bytes\":%llu,\"retained\":%zu,"
                "\"deleted\":%llu,\"store_bytes\":%llu,\"must_keep_bytes\":%llu,"
                "\"size_ratio\":%.3f,\"limit\":1.5,\"verified\":%zu,\"seconds\":%.1f}\n",
                static_cast<unsigned long long>(versions), keep,
                static_cast<unsigned long long>(model_bytes), listed->size(),
                static_cast<unsigned long long>(deleted_total),
                static_cast<unsigned long long>(on_disk),
                static_cast<unsigned long long>(must_bytes), ratio, verified, seconds);
  } else {
    std::printf("retention_bench: %llu versions of %.1f MB, store.retain_versions=%zu, %.1f s\n",
                static_cast<unsigned long long>(versions), model_bytes / 1e6, keep, seconds);
    std::printf("  retained %zu versions (deleted %llu); every one exports byte-identical\n",
                listed->size(), static_cast<unsigned long long>(deleted_total));
    std::printf("  store on disk %.1f MB; what must be kept %.1f MB: ratio %.2f (limit 1.5) %s\n",
                on_disk / 1e6, must_bytes / 1e6, ratio, ratio <= 1.5 ? "ok" : "OVER");
  }
  if (own_dir)
    fs::remove_all(dir);
  return ratio <= 1.5 ? 0 : 1;
}
