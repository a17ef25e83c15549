// gateway_bench: what the gateway adds to a request. One built-in replica
// (tiny model) serves a trivial generation (one token); the same requests go
// straight to the replica's own HTTP endpoint and through the gateway, in the
// same run, first on one keep-alive connection (latency), then on several
// (throughput). Prints the gateway's added p50/p99 latency and the throughput
// ratio gateway / direct. Then the gateway's p50 again while it holds `--idle`
// connections (default 2000) that send nothing, as a ratio to without
// (target <= 1.5).
//
//   gateway_bench [--requests N] [--connections C] [--idle N] [--json]

#include <caf/all.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <vector>

#include "bench/http_load.hpp"
#include "bench/replica_rig.hpp"
#include "runtime/engine/builtin_engine.hpp"
#include "transport/http_client.hpp"

using namespace stitch;
using clock_type = std::chrono::steady_clock;

namespace {

const std::string body = R"({"text":"hi","sampling_params":{"max_new_tokens":1,"temperature":0},)"
                         R"("weight_version":{"min_version":0,"exact_version":null}})";

bench::load_stats load(uint16_t port, size_t n, size_t connections) {
  return bench::http_load(port, "/generate", body, n, connections);
}

} // namespace

int main(int argc, char** argv) {
  bench::load_args args{2000, 4, false, 2000};
  if (!bench::parse_load_args(argc, argv, "gateway_bench", args))
    return 2;
  const size_t requests = std::max<size_t>(args.requests, 20);
  const size_t connections = args.connections;
  const bool json = args.json;
  const size_t idle = args.idle;
  // Both ends of the idle connections are in this process.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    (void) ::setrlimit(RLIMIT_NOFILE, &files);
  }
  auto dir =
    std::filesystem::temp_directory_path() / ("stitch-gateway-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  int rc = 0;
  {
    caf::actor_system_config cfg;
    caf::actor_system sys{bench::bench_config(cfg)};
    bench::replica_rig rig{sys};
    bench::replica_rig::options o;
    // Room for the idle connections below, all from this one address.
    o.gateway_http.server.max_connections = idle + 1024;
    o.gateway_http.server.max_connections_per_client = 0;
    auto started = rig.start(
      dir,
      [config = bench::replica_rig::model()]() -> result<std::shared_ptr<engine_port>> {
        return std::shared_ptr<engine_port>{std::make_shared<engine::builtin_engine>(config)};
      },
      std::move(o));
    if (!started) {
      std::fprintf(stderr, "gateway_bench: %s\n", to_string(started.error()).c_str());
      return 1;
    }
    const uint16_t* dport = &rig.replica_port;
    const uint16_t* gport = &rig.gateway_port;
    const auto& front = rig.gateway_front();
    (void) load(*dport, 50, 1); // warm up both paths
    (void) load(*gport, 50, 1);
    auto d1 = load(*dport, requests, 1);
    auto g1 = load(*gport, requests, 1);
    auto dn = load(*dport, requests / connections, connections);
    auto gn = load(*gport, requests / connections, connections);
    // The gateway holding `idle` connections that send nothing (clients
    // parked on keep-alive, slowloris): what it costs a well-behaved one.
    std::vector<int> parked;
    for (size_t i = 0; i < idle; ++i) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(*gport);
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        if (fd >= 0)
          ::close(fd);
        break;
      }
      parked.push_back(fd);
    }
    for (int i = 0; i < 500 && front.stats().open_connections < parked.size(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds{10});
    const size_t held = front.stats().open_connections;
    auto gi = load(*gport, requests, 1);
    for (int fd : parked)
      ::close(fd);
    const double idle_ratio = gi.p50_ms / g1.p50_ms;
    size_t failures = d1.failures + g1.failures + dn.failures + gn.failures + gi.failures;
    double added_p50 = g1.p50_ms - d1.p50_ms;
    double added_p99 = g1.p99_ms - d1.p99_ms;
    double ratio = gn.rps / dn.rps;
    if (json) {
      std::printf("{\"requests\":%zu,\"connections\":%zu,\"direct_p50_ms\":%.4f,"
                  "\"gateway_p50_ms\":%.4f,\"gateway_added_p50_ms\":%.4f,"
                  "\"gateway_added_p99_ms\":%.4f,\"direct_rps\":%.1f,\"gateway_rps\":%.1f,"
                  "\"throughput_ratio\":%.3f,\"idle_connections\":%zu,"
                  "\"gateway_p50_with_idle_ms\":%.4f,\"idle_p50_ratio\":%.3f,\"failures\":%zu}\n",
                  requests, connections, d1.p50_ms, g1.p50_ms, added_p50, added_p99, dn.rps, gn.rps,
                  ratio, held, gi.p50_ms, idle_ratio, failures);
    } else {
      std::printf("gateway_bench: one built-in replica (tiny), one-token generations\n\n");
      std::printf("| path | p50 ms (1 conn) | p99 ms (1 conn) | req/s (%zu conns) |\n",
                  connections);
      std::printf("|---|---|---|---|\n");
      std::printf("| direct to the replica | %.3f | %.3f | %.0f |\n", d1.p50_ms, d1.p99_ms, dn.rps);
      std::printf("| through the gateway | %.3f | %.3f | %.0f |\n", g1.p50_ms, g1.p99_ms, gn.rps);
      std::printf("\ngateway added p50: %.3f ms (target <= 0.2), p99: %.3f ms\n", added_p50,
                  added_p99);
      std::printf("throughput ratio gateway/direct: %.2f (report-only: load, gateway and "
                  "replica share the cores)\n",
                  ratio);
      std::printf("gateway p50 with %zu idle connections open: %.3f ms, %.2f of without (target "
                  "<= 1.5)\n",
                  held, gi.p50_ms, idle_ratio);
      if (failures)
        std::printf("FAILED requests: %zu\n", failures);
    }
    rc = failures == 0 && held >= parked.size() ? 0 : 1;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}
