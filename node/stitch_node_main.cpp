// stitch-node: hosts the configured roles on one CAF actor system (DESIGN §2).

#include <CLI/CLI.hpp>
#include <caf/actor_system.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "actors/log.hpp"
#include "node/cli.hpp"
#include "node/node.hpp"
#include "node/security_report.hpp"
#include "node/system_config.hpp"
#include "runtime/pipeline/pipeline.hpp"

int main(int argc, char** argv) {
  using namespace stitch::node;
  // A quarter of an HTTP publish's time went to zeroing fresh pages.
  stitch::keep_freed_buffers_in_heap();
  // Control threads preempt bulk work as soon as they wake; bulk threads go
  // back to the default slice (runtime/pipeline/pipeline.hpp).
  stitch::pipeline::run_as_latency_thread();
  CLI::App app{"stitch-node: runs the Stitch roles of this machine on one actor system.\n"
               "With no --config it runs every role in one process on an embedded RocksDB store "
               "under ./stitch-data, with built-in engine replicas.",
               "stitch-node"};
  node_options opts;
  app.add_option("--config", opts.config_path, "TOML role config of this node")
    ->check(CLI::ExistingFile);
  app.add_option("--data-dir", opts.data_dir,
                 "where node state lives (default: the config's data_dir, ./stitch-data)");
  app.add_option("--set", opts.overrides,
                 "override a config key: KEY=VALUE (repeatable), e.g. "
                 "coordinator.listen=127.0.0.1:4242 store.uri=rocksdb:DIR|s3://bucket/prefix");
  app.add_flag("--print-config", opts.print_config, "print the effective config and exit");
  bool check_security = false;
  app.add_flag("--check-security", check_security,
               "print every listener of the effective config: its address, whether callers are "
               "authenticated and traffic encrypted, and what a caller can do; then exit");
  app.set_version_flag("--version", "stitch-node 0.1.0");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? exit_ok : exit_usage;
  }
  auto settings = resolve_settings(opts);
  if (!settings) {
    std::fprintf(stderr, "stitch-node: invalid configuration:\n%s\n",
                 settings.error().message.c_str());
    return exit_usage;
  }
  if (opts.print_config) {
    std::fputs(to_toml(*settings).c_str(), stdout);
    return exit_ok;
  }
  if (check_security) {
    std::fputs(security_report(*settings).c_str(), stdout);
    return security_refusal(*settings).empty() ? exit_ok : exit_runtime_failure;
  }
  // Signals are taken by sigwait below; every thread the actor system starts
  // inherits the blocked mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  stitch::log::set_node(settings->name);
  stitch::system_config cfg;
  if (!settings->tls_cert.empty()) {
    auto bad = stitch::check_tls_files(settings->tls_cert.string(), settings->tls_key.string(),
                                       settings->tls_ca.string());
    if (!bad.empty()) {
      std::fprintf(stderr, "stitch-node: invalid configuration:\ntls: %s\n", bad.c_str());
      return exit_usage;
    }
  }
  if (!settings->tls_cert.empty())
    cfg.use_tls(settings->tls_cert.string(), settings->tls_key.string(), settings->tls_ca.string());
  caf::actor_system sys{cfg};
  auto n = node::start(sys, *settings);
  if (!n) {
    std::fprintf(stderr, "stitch-node: %s\n", to_string(n.error()).c_str());
    return exit_runtime_failure;
  }
  if (settings->has_role("coordinator"))
    std::printf("stitch-node: coordinator listening on %s:%u%s\n",
                settings->coordinator_listen.host.c_str(), static_cast<unsigned>((*n)->port()),
                settings->tls_cert.empty() ? "" : " (mutual TLS)");
  else
    std::printf("stitch-node: %s joined the coordinator at %s%s; other nodes reach it at %s\n",
                settings->name.c_str(), settings->coordinator_address.c_str(),
                settings->tls_cert.empty() ? "" : " (mutual TLS)", (*n)->mesh().c_str());
  if (settings->has_role("store"))
    std::printf("stitch-node: store %s\n", settings->effective_store_uri().c_str());
  const auto& http = (*n)->http();
  if (settings->has_role("gateway"))
    std::printf("stitch-node: gateway http://%s:%u\n", settings->gateway_listen.host.c_str(),
                static_cast<unsigned>(http.gateway));
  if (settings->has_role("status"))
    std::printf("stitch-node: status http://%s:%u (dashboard at /)\n",
                settings->status_listen.host.c_str(), static_cast<unsigned>(http.status));
  if (http.publisher != 0)
    std::printf("stitch-node: publisher %s://%s:%u (POST /publish)\n",
                settings->publisher_tls ? "https" : "http",
                stitch::config::parse_listen_address(settings->publisher_listen)->host.c_str(),
                static_cast<unsigned>(http.publisher));
  for (size_t i = 0; i < http.replicas.size(); ++i)
    std::printf("stitch-node: replica-%zu http://%s:%u (model %s)\n", i,
                settings->replica_listen.host.c_str(), static_cast<unsigned>(http.replicas[i]),
                settings->model_preset.c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::printf("stitch-node: stopping on signal %d\n", sig);
  std::fflush(stdout);
  (*n)->stop();
  n->reset();
  // Everything durable was synced when it was acknowledged. Should a peer's
  // reference keep an actor from being destroyed, do not hang on exit.
  std::thread{[] {
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::fprintf(stderr, "stitch-node: shutdown took over 10 s; exiting anyway\n");
    std::_Exit(exit_ok);
  }}.detach();
  return exit_ok;
}
