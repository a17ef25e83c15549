// proxy_bench: what a replica driving an external engine adds to a request.
// The engine is a fixed upstream that answers instantly: nginx (Debian's
// nginx-light), started by the bench with a generated config on a free port,
// answering SGLang's routes with canned bodies (`/generate`, the weight-update
// calls the adapter makes to activate a version). The same `/generate`
// requests go straight to nginx, through one replica with the SGLang
// adapter, and through gateway + replica, in the same run: p50 latency on one
// keep-alive connection, then requests/s on 16. Prints each path's added p50
// and its throughput as a ratio to direct.
//
//   proxy_bench [--requests N] [--connections C] [--json]
//
// Targets (issue 14): added p50 <= 0.1 ms at c1 through the replica;
// throughput >= 0.25 of direct at c16.

#include <caf/all.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "bench/http_load.hpp"
#include "bench/replica_rig.hpp"
#include "runtime/engine/external_engine.hpp"

using namespace stitch;
namespace fs = std::filesystem;

namespace {

const std::string body = R"({"text":"hi","sampling_params":{"max_new_tokens":1,"temperature":0},)"
                         R"("weight_version":{"min_version":0,"exact_version":null}})";

/// The canned SGLang server.
std::string nginx_config(const fs::path& dir, uint16_t port) {
  const std::string d = dir.string();
  std::string c;
  c += "daemon off;\nmaster_process off;\nworker_processes 1;\n";
  c += "pid " + d + "/nginx.pid;\nerror_log " + d + "/error.log warn;\n";
  c += "events { worker_connections 4096; }\n";
  c += "http {\n  access_log off;\n  keepalive_requests 10000000;\n";
  for (const char* t : {"client_body", "proxy", "fastcgi", "uwsgi", "scgi"})
    c += std::string{"  "} + t + "_temp_path " + d + "/" + t + ";\n";
  c += "  server {\n    listen 127.0.0.1:" + std::to_string(port) + ";\n";
  c += "    default_type application/json;\n";
  c += "    location = /health { return 200 ''; }\n";
  c +=
    R"(    location = /generate { return 200 '{"text":"x","output_ids":[120],"meta_info":{"id":"a","finish_reason":{"type":"length","length":1},"prompt_tokens":3,"completion_tokens":1,"cached_tokens":0,"weight_version":"bench/weight_v000000"}}'; })"
    "\n";
  c +=
    R"(    location = /get_model_info { return 200 '{"model_path":"bench","weight_version":"bench/weight_v000000"}'; })"
    "\n";
  c +=
    R"(    location = /update_weights_from_disk { return 200 '{"success":true,"message":"Succeeded to update model weights.","num_paused_requests":0}'; })"
    "\n";
  c +=
    R"(    location = /pause_generation { return 200 '{"message":"Generation paused successfully.","status":"ok"}'; })"
    "\n";
  c +=
    R"(    location = /continue_generation { return 200 '{"message":"Generation continued successfully.","status":"ok"}'; })"
    "\n";
  c += R"(    location / { return 404 '{"detail":"Not Found"}'; })"
       "\n  }\n}\n";
  return c;
}

pid_t start_nginx(const fs::path& dir, uint16_t port) {
  {
    std::ofstream out{dir / "nginx.conf"};
    out << nginx_config(dir, port);
  }
  std::string conf = (dir / "nginx.conf").string();
  std::string prefix = dir.string() + "/";
  std::string errors = (dir / "error.log").string();
  pid_t pid = ::fork();
  if (pid == 0) {
    for (const char* bin : {"/usr/sbin/nginx", "nginx"})
      ::execlp(bin, bin, "-c", conf.c_str(), "-p", prefix.c_str(), "-e", errors.c_str(), nullptr);
    std::fprintf(stderr, "proxy_bench: cannot run nginx (install nginx-light)\n");
    ::_exit(127);
  }
  return pid;
}

bool answers(uint16_t port, const std::string& target) {
  transport::http_client c{transport::http_endpoint{"http", "127.0.0.1", port}};
  transport::http_request h;
  h.target = target;
  auto r = c.send(h);
  return r && r->status == 200;
}

} // namespace

int main(int argc, char** argv) {
  bench::load_args args{4000, 16, false, 0};
  if (!bench::parse_load_args(argc, argv, "proxy_bench", args))
    return 2;
  const size_t requests = std::max<size_t>(args.requests, 100);
  const size_t connections = args.connections;
  const bool json = args.json;
  auto dir = fs::temp_directory_path() / ("stitch-proxy-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  int rc = 0;
  auto nginx_port = engine::pick_free_port();
  if (!nginx_port) {
    std::fprintf(stderr, "proxy_bench: %s\n", to_string(nginx_port.error()).c_str());
    return 1;
  }
  pid_t nginx = start_nginx(dir, *nginx_port);
  bool up = false;
  for (int i = 0; i < 500 && !up; ++i) {
    up = answers(*nginx_port, "/health");
    if (!up)
      std::this_thread::sleep_for(std::chrono::milliseconds{10});
  }
  if (!up) {
    std::fprintf(stderr, "proxy_bench: nginx did not start (see %s/error.log)\n",
                 dir.string().c_str());
    ::kill(nginx, SIGKILL);
    ::waitpid(nginx, nullptr, 0);
    return 1;
  }
  {
    caf::actor_system_config cfg;
    caf::actor_system sys{bench::bench_config(cfg)};
    engine::external_engine_options eo;
    eo.kind = stitch::engine_kind::sglang;
    eo.url = "http://127.0.0.1:" + std::to_string(*nginx_port);
    eo.staging_dir = dir / "staging";
    auto made = engine::external_engine::make(eo);
    if (!made) {
      std::fprintf(stderr, "proxy_bench: %s\n", to_string(made.error()).c_str());
      return 1;
    }
    bench::replica_rig rig{sys};
    bench::replica_rig::options o;
    o.request_workers = 32;
    auto started = rig.start(
      dir,
      [e = std::shared_ptr<engine_port>{*made}]() -> result<std::shared_ptr<engine_port>> {
        return e;
      },
      std::move(o));
    if (!started) {
      std::fprintf(stderr, "proxy_bench: %s\n", to_string(started.error()).c_str());
      rc = 1;
    } else {
      const uint16_t* rport = &rig.replica_port;
      const uint16_t* gport = &rig.gateway_port;
      auto load = [&](uint16_t port, size_t n, size_t c) {
        return bench::http_load(port, "/generate", body, n, c);
      };
      for (uint16_t p : {*nginx_port, *rport, *gport})
        (void) load(p, 200, 1); // warm every path
      auto n1 = load(*nginx_port, requests, 1);
      auto r1 = load(*rport, requests, 1);
      auto g1 = load(*gport, requests, 1);
      auto per = std::max<size_t>(requests / connections, 50);
      auto nn = load(*nginx_port, per, connections);
      auto rn = load(*rport, per, connections);
      auto gn = load(*gport, per, connections);
      size_t failures =
        n1.failures + r1.failures + g1.failures + nn.failures + rn.failures + gn.failures;
      double replica_added = r1.p50_ms - n1.p50_ms;
      double gateway_added = g1.p50_ms - n1.p50_ms;
      double replica_ratio = rn.rps / nn.rps;
      double gateway_ratio = gn.rps / nn.rps;
      if (json) {
        std::printf(
          "{\"requests\":%zu,\"connections\":%zu,\"direct_p50_ms\":%.4f,\"replica_p50_ms\":%.4f,"
          "\"gateway_p50_ms\":%.4f,\"replica_added_p50_ms\":%.4f,\"gateway_added_p50_ms\":%.4f,"
          "\"direct_rps\":%.1f,\"replica_rps\":%.1f,\"gateway_rps\":%.1f,"
          "\"replica_throughput_ratio\":%.3f,\"gateway_throughput_ratio\":%.3f,\"failures\":%zu}\n",
          requests, connections, n1.p50_ms, r1.p50_ms, g1.p50_ms, replica_added, gateway_added,
          nn.rps, rn.rps, gn.rps, replica_ratio, gateway_ratio, failures);
      } else {
        std::printf("proxy_bench: nginx answering SGLang's /generate instantly\n\n");
        std::printf("| path | p50 ms (1 conn) | p99 ms (1 conn) | req/s (%zu conns) | ratio |\n",
                    connections);
        std::printf("|---|---|---|---|---|\n");
        std::printf("| direct to nginx | %.3f | %.3f | %.0f | 1.00 |\n", n1.p50_ms, n1.p99_ms,
                    nn.rps);
        std::printf("| replica (sglang adapter) | %.3f | %.3f | %.0f | %.2f |\n", r1.p50_ms,
                    r1.p99_ms, rn.rps, replica_ratio);
        std::printf("| gateway + replica | %.3f | %.3f | %.0f | %.2f |\n", g1.p50_ms, g1.p99_ms,
                    gn.rps, gateway_ratio);
        std::printf("\nreplica added p50: %.3f ms (target <= 0.1); gateway + replica: %.3f ms\n",
                    replica_added, gateway_added);
        std::printf("throughput at c%zu: replica %.2f, gateway + replica %.2f of direct (target "
                    ">= 0.25)\n",
                    connections, replica_ratio, gateway_ratio);
        if (failures)
          std::printf("FAILED requests: %zu\n", failures);
      }
      rc = failures == 0 ? 0 : 1;
    }
  }
  ::kill(nginx, SIGTERM);
  ::waitpid(nginx, nullptr, 0);
  std::error_code ec;
  fs::remove_all(dir, ec);
  return rc;
}
