#pragma once

// A closed-loop HTTP load generator for the benches: `connections` threads,
// each sending `n` requests one after another on its own keep-alive
// connection, timing each.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "transport/http_client.hpp"

namespace stitch::bench {

struct load_stats {
  double p50_ms = 0, p99_ms = 0, rps = 0;
  size_t failures = 0;
};

/// `n` POSTs of `body` to `target` on each of `connections` connections;
/// an answer other than 200 counts as a failure.
inline load_stats http_load(uint16_t port, const std::string& target, const std::string& body,
                            size_t n, size_t connections) {
  using clock_type = std::chrono::steady_clock;
  std::vector<std::vector<double>> lat(connections);
  std::atomic<size_t> failures{0};
  auto t0 = clock_type::now();
  std::vector<std::thread> threads;
  for (size_t c = 0; c < connections; ++c)
    threads.emplace_back([&, c] {
      transport::http_client client{transport::http_endpoint{"http", "127.0.0.1", port}};
      transport::http_request req;
      req.method = "POST";
      req.target = target;
      req.body = body;
      req.headers = {{"Content-Type", "application/json"}};
      lat[c].reserve(n);
      for (size_t i = 0; i < n; ++i) {
        auto s = clock_type::now();
        auto r = client.send(req);
        lat[c].push_back(std::chrono::duration<double, std::milli>(clock_type::now() - s).count());
        if (!r || r->status != 200)
          ++failures;
      }
    });
  for (auto& t : threads)
    t.join();
  double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
  std::vector<double> all;
  for (auto& l : lat)
    all.insert(all.end(), l.begin(), l.end());
  load_stats out;
  if (all.empty())
    return out;
  std::sort(all.begin(), all.end());
  out.p50_ms = all[all.size() / 2];
  out.p99_ms = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  out.rps = static_cast<double>(all.size()) / secs;
  out.failures = failures;
  return out;
}

/// `[--requests N] [--connections C] [--json]`, the load benches' arguments.
struct load_args {
  size_t requests = 0;
  size_t connections = 0;
  bool json = false;
  /// `--idle N`: idle connections held open during a measurement (benches
  /// that take it).
  size_t idle = 0;
};

/// Parses them over the defaults in `args`; false (after printing the usage
/// line of `program`) on anything else.
inline bool parse_load_args(int argc, char** argv, const char* program, load_args& args) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--requests" && i + 1 < argc)
      args.requests = std::strtoul(argv[++i], nullptr, 10);
    else if (a == "--connections" && i + 1 < argc)
      args.connections = std::strtoul(argv[++i], nullptr, 10);
    else if (a == "--json")
      args.json = true;
    else if (a == "--idle" && i + 1 < argc)
      args.idle = std::strtoul(argv[++i], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: %s [--requests N] [--connections C] [--idle N] [--json]\n",
                   program);
      return false;
    }
  }
  args.connections = std::max<size_t>(args.connections, 1);
  return true;
}

} // namespace stitch::bench
