// Throughput of the weight codecs against memcpy measured in the same run:
// xor/overwrite apply, the xxh3 tree checksum (one thread and the pool) and
// zstd on a realistic sparse xor delta. Report-only: always exits 0.
//
//   codec_bench [--mb N] [--reps R] [--json]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpu/checksum.hpp"
#include "gpu/cpu_parallel.hpp"
#include "runtime/core/checksum.hpp"
#include "runtime/core/delta_codec.hpp"

namespace {

struct options {
  size_t mb = 256;
  int reps = 3;
  bool json = false;
};

struct row {
  std::string name;
  double gbps = 0;
  double ratio = 0;
  std::string note;
};

/// Best wall time of `reps` runs of `fn`, in seconds.
double best_seconds(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto start = std::chrono::steady_clock::now();
    fn();
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count());
  }
  return best;
}

void fill_random(std::vector<std::byte>& buf, uint64_t seed) {
  std::mt19937_64 rng{seed};
  for (size_t i = 0; i + 8 <= buf.size(); i += 8) {
    uint64_t word = rng();
    std::memcpy(buf.data() + i, &word, 8);
  }
}

/// An xor delta where about 1% of the 8-byte words changed.
void fill_sparse_delta(std::vector<std::byte>& buf, uint64_t seed) {
  std::memset(buf.data(), 0, buf.size());
  std::mt19937_64 rng{seed};
  for (size_t i = 0; i + 8 <= buf.size(); i += 8) {
    if (rng() % 100 == 0) {
      uint64_t word = rng() | 1;
      std::memcpy(buf.data() + i, &word, 8);
    }
  }
}

/// The XOR of a bf16 optimizer step at a small learning rate: about 30% of
/// the elements move by a few units in the last place (their low byte
/// changes a little), 3% by more (the high byte too).
void fill_bf16_step(std::vector<std::byte>& buf, uint64_t seed) {
  std::memset(buf.data(), 0, buf.size());
  std::mt19937_64 rng{seed};
  for (size_t i = 0; i + 2 <= buf.size(); i += 2) {
    const uint64_t r = rng() % 100;
    if (r < 30)
      buf[i] = static_cast<std::byte>(1 + rng() % 7);
    if (r < 3)
      buf[i + 1] = static_cast<std::byte>(1 + rng() % 3);
  }
}

/// `dst` as the room a delta decodes into (same size as `x`).
std::span<std::byte> delta_scratch(std::vector<std::byte>& dst, const std::vector<std::byte>& x) {
  return std::span{dst}.first(x.size());
}

bool parse_args(int argc, char** argv, options& opt) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--json") {
      opt.json = true;
    } else if ((arg == "--mb" || arg == "--reps") && i + 1 < argc) {
      long value = std::strtol(argv[++i], nullptr, 10);
      if (value <= 0 || value > 65536)
        return false;
      if (arg == "--mb")
        opt.mb = static_cast<size_t>(value);
      else
        opt.reps = static_cast<int>(value);
    } else {
      return false;
    }
  }
  return true;
}

} // namespace

int main(int argc, char** argv) {
  options opt;
  if (!parse_args(argc, argv, opt)) {
    std::fprintf(stderr, "usage: codec_bench [--mb N] [--reps R] [--json]\n");
    return 2;
  }
  const size_t n = opt.mb << 20;
  std::vector<std::byte> src(n), dst(n), delta(n);
  fill_random(src, 1);
  fill_sparse_delta(delta, 2);
  std::memcpy(dst.data(), src.data(), n);
  auto& pool = stitch::gpu::shared_pool();
  volatile uint64_t sink = 0;
  auto gbps = [&](double seconds) { return static_cast<double>(n) / seconds / 1e9; };

  std::vector<row> rows;
  double memcpy_gbps =
    gbps(best_seconds(opt.reps, [&] { std::memcpy(dst.data(), src.data(), n); }));
  rows.push_back({"memcpy", memcpy_gbps, 1.0, ""});
  auto add = [&](std::string name, double seconds, std::string note = "") {
    double g = gbps(seconds);
    rows.push_back({std::move(name), g, g / memcpy_gbps, std::move(note)});
  };

  add("xor_apply", best_seconds(opt.reps, [&] { (void) stitch::delta::xor_apply(dst, delta); }));
  add("xor_apply_parallel",
      best_seconds(opt.reps, [&] { (void) stitch::gpu::parallel_xor_apply(dst, delta, pool); }),
      std::to_string(pool.size()) + " threads");
  add("overwrite_apply",
      best_seconds(opt.reps, [&] { (void) stitch::delta::overwrite_apply(dst, src); }));
  add("xxh3", best_seconds(opt.reps, [&] { sink = sink + stitch::checksum::tree_checksum(src); }),
      "tree checksum, 1 thread");
  add("xxh3_parallel",
      best_seconds(opt.reps, [&] { sink = sink + stitch::gpu::parallel_tree_checksum(src, pool); }),
      std::to_string(pool.size()) + " threads");

  for (int level : {1, 3}) {
    std::vector<std::byte> packed;
    double c = best_seconds(opt.reps, [&] {
      auto out = stitch::delta::compress(delta, level);
      if (out)
        packed = std::move(*out);
    });
    double ratio = static_cast<double>(n) / static_cast<double>(std::max<size_t>(packed.size(), 1));
    char note[64];
    std::snprintf(note, sizeof note, "1%% words changed, %.1fx smaller", ratio);
    add("zstd" + std::to_string(level) + "_compress", c, note);
    double d = best_seconds(opt.reps, [&] {
      if (!stitch::delta::decompress_into(packed, dst))
        std::fprintf(stderr, "decompress failed\n");
    });
    add("zstd" + std::to_string(level) + "_decompress", d);
  }

  // The two delta encodings on two shapes of delta: bytes stored, and the
  // time to compress, and to decode and apply (what export and staging pay).
  std::vector<std::byte> bf16_step(n);
  fill_bf16_step(bf16_step, 3);
  for (auto [shape, x] : {std::pair{"words1", &delta}, std::pair{"bf16", &bf16_step}}) {
    std::vector<std::byte> packed;
    double c = best_seconds(opt.reps, [&] {
      auto out = stitch::delta::compress(*x, 1);
      if (out)
        packed = std::move(*out);
    });
    char note[96];
    std::snprintf(note, sizeof note, "xor: %zu bytes stored", packed.size());
    add(std::string{"xor_"} + shape + "_compress", c, note);
    add(std::string{"xor_"} + shape + "_apply", best_seconds(opt.reps, [&] {
          if (!stitch::delta::decompress_into(packed, delta_scratch(dst, *x)))
            std::fprintf(stderr, "decompress failed\n");
          (void) stitch::delta::xor_apply(src, dst);
        }));
    std::vector<std::byte> runs(stitch::delta::sparse_encode_bound(n));
    std::vector<std::byte> sparse;
    c = best_seconds(opt.reps, [&] {
      const size_t listed = stitch::delta::sparse_encode(*x, runs);
      auto out =
        stitch::delta::compress(std::span{runs}.first(listed), 1, stitch::delta::finder::literals);
      if (out)
        sparse = std::move(*out);
    });
    std::snprintf(note, sizeof note, "xor-sparse: %zu bytes stored", sparse.size());
    add(std::string{"sparse_"} + shape + "_compress", c, note);
    add(std::string{"sparse_"} + shape + "_apply", best_seconds(opt.reps, [&] {
          auto z = stitch::delta::stream_decompressor::start(
            UINT64_MAX, [&, at = size_t{0}](std::span<std::byte> into) mutable {
              const size_t k = std::min(into.size(), sparse.size() - at);
              std::memcpy(into.data(), sparse.data() + at, k);
              at += k;
              return stitch::result<size_t>{k};
            });
          if (!z)
            return;
          stitch::delta::sparse_applier a{
            n, [&](std::span<std::byte> into) { return z->read_some(into); }, 256 << 10};
          if (!a.apply(src) || !a.finish())
            std::fprintf(stderr, "sparse apply failed\n");
        }));
  }

  auto ratio_of = [&](std::string_view name) {
    for (const auto& r : rows)
      if (r.name == name)
        return r.ratio;
    return 0.0;
  };
  constexpr double target = 0.7;
  bool xor_met = ratio_of("xor_apply") >= target;
  bool xxh3_met = ratio_of("xxh3") >= target;

  if (opt.json) {
    std::printf("{\"mb\":%zu,\"reps\":%d,\"threads\":%zu", opt.mb, opt.reps, pool.size());
    for (const auto& r : rows)
      std::printf(",\"%s_gbps\":%.3f,\"%s_ratio\":%.3f", r.name.c_str(), r.gbps, r.name.c_str(),
                  r.ratio);
    std::printf(",\"target_ratio\":%.2f,\"xor_apply_target_met\":%s,\"xxh3_target_met\":%s}\n",
                target, xor_met ? "true" : "false", xxh3_met ? "true" : "false");
  } else {
    std::printf("codec_bench: %zu MiB buffers, best of %d\n", opt.mb, opt.reps);
    std::printf("%-24s %9s %9s  %s\n", "measure", "GB/s", "x memcpy", "note");
    for (const auto& r : rows)
      std::printf("%-24s %9.2f %9.2f  %s\n", r.name.c_str(), r.gbps, r.ratio, r.note.c_str());
    std::printf("target xor_apply >= %.1f x memcpy: %s\n", target, xor_met ? "met" : "NOT met");
    std::printf("target xxh3      >= %.1f x memcpy: %s\n", target, xxh3_met ? "met" : "NOT met");
  }
  return sink == 42 ? 0 : 0;
}
