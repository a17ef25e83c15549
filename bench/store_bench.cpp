// store_bench: publish and read-back throughput of the embedded RocksDB store,
// as ratios to the raw sequential write+fsync and read bandwidth of the same
// disk, measured in the same run. Report-only (see bench/README.md).
//
//   store_bench [--mb N] [--dir PATH] [--json]

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "runtime/store/materialize.hpp"
#include "runtime/store/publisher.hpp"
#include "runtime/store/rocksdb_store.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "store_bench: %s\n", what.c_str());
  std::exit(1);
}

/// Sequential write of `bytes` in 8 MiB blocks, then fsync: bytes/s.
double raw_write(const std::filesystem::path& file, uint64_t bytes) {
  std::vector<char> block(8 << 20, 'x');
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    die("cannot create " + file.string());
  auto t0 = clock_type::now();
  for (uint64_t done = 0; done < bytes; done += block.size())
    if (::write(fd, block.data(), block.size()) != static_cast<ssize_t>(block.size()))
      die("write failed");
  ::fsync(fd);
  double s = seconds_since(t0);
  ::close(fd);
  return static_cast<double>(bytes) / s;
}

/// Sequential read after dropping the file's cached pages: bytes/s.
double raw_read(const std::filesystem::path& file) {
  int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0)
    die("cannot open " + file.string());
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  std::vector<char> block(8 << 20);
  uint64_t total = 0;
  auto t0 = clock_type::now();
  for (ssize_t n; (n = ::read(fd, block.data(), block.size())) > 0;)
    total += static_cast<uint64_t>(n);
  double s = seconds_since(t0);
  ::close(fd);
  return static_cast<double>(total) / s;
}

stitch::store::tensor_set make_weights(uint64_t bytes, size_t count) {
  stitch::store::tensor_set w;
  std::mt19937_64 rng{7};
  const uint64_t each = bytes / count / 4 * 4;
  for (size_t i = 0; i < count; ++i) {
    auto& t = w["model.layers." + std::to_string(i) + ".mlp.up_proj.weight"];
    t.name = "model.layers." + std::to_string(i) + ".mlp.up_proj.weight";
    t.type = stitch::safetensors::dtype::f32;
    t.shape = {each / 4};
    t.bytes.resize(each);
    auto* words = reinterpret_cast<uint64_t*>(t.bytes.data());
    for (uint64_t k = 0; k < each / 8; ++k)
      words[k] = rng();
  }
  return w;
}

} // namespace

int main(int argc, char** argv) {
  uint64_t mb = 1024;
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "stitch-store-bench";
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--mb" && i + 1 < argc)
      mb = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--dir" && i + 1 < argc)
      dir = argv[++i];
    else if (a == "--json")
      json = true;
    else {
      std::fprintf(stderr, "usage: store_bench [--mb N] [--dir PATH] [--json]\n");
      return 2;
    }
  }
  if (mb < 8)
    mb = 8;
  const uint64_t bytes = mb << 20;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);

  const double write_bw = raw_write(dir / "raw", bytes);
  const double read_bw = raw_read(dir / "raw");
  std::filesystem::remove(dir / "raw", ec);

  auto opened = stitch::store::open_rocksdb_store((dir / "db").string());
  if (!opened)
    die(to_string(opened.error()));
  auto& db = **opened;
  stitch::store::publisher pub{db};

  auto weights = make_weights(bytes, 16);
  auto t0 = clock_type::now();
  auto full = pub.publish({"default", "bench", 0, true, false}, weights);
  const double full_s = seconds_since(t0);
  if (!full)
    die("full publish: " + to_string(full.error()));

  // 1% of the bytes change, spread over every tensor.
  std::mt19937_64 rng{11};
  for (auto& [name, t] : weights)
    for (uint64_t k = 0; k < t.bytes.size() / 100; ++k)
      t.bytes[rng() % t.bytes.size()] ^= std::byte{0x5a};
  t0 = clock_type::now();
  auto delta = pub.publish({"default", "bench", 1, false, false}, weights);
  const double delta_s = seconds_since(t0);
  if (!delta)
    die("delta publish: " + to_string(delta.error()));

  t0 = clock_type::now();
  auto back = stitch::store::materialize(db, "default", {"bench", 1});
  const double export_s = seconds_since(t0);
  if (!back)
    die("read-back: " + to_string(back.error()));

  const double b = static_cast<double>(bytes);
  const double full_bw = b / full_s, delta_bw = b / delta_s, export_bw = b / export_s;
  if (json) {
    std::printf("{\"mb\":%llu,\"raw_write_gbps\":%.3f,\"raw_read_gbps\":%.3f,"
                "\"full_publish_gbps\":%.3f,\"full_publish_ratio\":%.3f,"
                "\"delta_publish_gbps\":%.3f,\"delta_publish_ratio\":%.3f,"
                "\"delta_stored_bytes\":%llu,\"export_gbps\":%.3f,\"export_ratio\":%.3f}\n",
                static_cast<unsigned long long>(mb), write_bw / 1e9, read_bw / 1e9, full_bw / 1e9,
                full_bw / write_bw, delta_bw / 1e9, delta_bw / write_bw,
                static_cast<unsigned long long>(delta->stored_bytes), export_bw / 1e9,
                export_bw / read_bw);
  } else {
    std::printf("store_bench: %llu MiB model, RocksDB store in %s\n",
                static_cast<unsigned long long>(mb), dir.c_str());
    std::printf("%-28s %9s %9s\n", "measure", "GB/s", "ratio");
    std::printf("%-28s %9.3f %9s\n", "raw write+fsync", write_bw / 1e9, "1.00");
    std::printf("%-28s %9.3f %9s\n", "raw read (cache dropped)", read_bw / 1e9, "1.00");
    std::printf("%-28s %9.3f %9.2f  (vs raw write)\n", "publish full anchor", full_bw / 1e9,
                full_bw / write_bw);
    std::printf("%-28s %9.3f %9.2f  (vs raw write; model bytes/s, %llu bytes stored)\n",
                "publish 1%-dense delta", delta_bw / 1e9, delta_bw / write_bw,
                static_cast<unsigned long long>(delta->stored_bytes));
    std::printf("%-28s %9.3f %9.2f  (vs raw read; anchor + delta rebuilt, verified)\n",
                "export read-back", export_bw / 1e9, export_bw / read_bw);
  }
  opened->reset();
  std::filesystem::remove_all(dir, ec);
  return 0;
}
