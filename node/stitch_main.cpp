// stitch: the command-line client of a Stitch cluster (DESIGN §7).

#include <CLI/CLI.hpp>
#include <caf/actor_system.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <thread>

#include "node/cli.hpp"
#include "node/commands.hpp"
#include "node/demo.hpp"
#include "node/profile.hpp"
#include "node/system_config.hpp"
#include "runtime/pipeline/pipeline.hpp"
#include "transport/capability.hpp"

namespace {

/// The exit code of a command, its error on stderr: `invalid_argument` is a
/// usage error where `bad_input_is_usage` (the input named on the command
/// line), any other failure a runtime one.
/// What the command ended with (for an exit that cannot wait, below).
std::atomic<int> exit_code{0};

int finish(const char* name, const stitch::status& done, bool bad_input_is_usage = true) {
  using namespace stitch::node;
  if (done)
    return exit_code = exit_ok;
  std::fprintf(stderr, "stitch %s: %s\n", name, to_string(done.error()).c_str());
  return exit_code = bad_input_is_usage && done.error().code == stitch::errc::invalid_argument
                       ? exit_usage
                       : exit_runtime_failure;
}

/// Shuts the CLI's actor system down once the command has answered, waiting
/// at most 10 s: CAF 0.17 can wait forever for an actor that a network peer
/// still references (seen under load: `stitch status` printed its answer
/// and never exited). The command's work is done by then (its answer
/// printed, the node holds what it sent), so the process then exits with
/// the command's code without finishing the shutdown.
class bounded_shutdown {
public:
  explicit bounded_shutdown(std::unique_ptr<caf::actor_system>& sys) : sys_(sys) {}
  bounded_shutdown(const bounded_shutdown&) = delete;
  bounded_shutdown& operator=(const bounded_shutdown&) = delete;
  ~bounded_shutdown() {
    std::fflush(stdout);
    std::fflush(stderr);
    // The system shuts down on this thread (where it was made); a watchdog
    // ends the process if that takes too long.
    auto done = std::make_shared<std::promise<void>>();
    std::thread watchdog{[finished = done->get_future()]() mutable {
      if (finished.wait_for(std::chrono::seconds{10}) != std::future_status::ready)
        std::_Exit(exit_code.load());
    }};
    sys_.reset();
    done->set_value();
    watchdog.join();
  }

private:
  std::unique_ptr<caf::actor_system>& sys_;
};

} // namespace

int main(int argc, char** argv) {
  using namespace stitch::node;
  stitch::keep_freed_buffers_in_heap();
  CLI::App app{"stitch: command-line client of a Stitch cluster", "stitch"};
  app.require_subcommand(1);
  std::string coordinator = "127.0.0.1:4242";
  std::string token;
  app.add_option("--coordinator", coordinator, "coordinator HOST:PORT")
    ->envname("STITCH_COORDINATOR")
    ->capture_default_str();
  app.add_option("--token", token, "admin token (or STITCH_TOKEN)")->envname("STITCH_TOKEN");
  std::string token_file;
  app.add_option("--token-file", token_file,
                 "a file holding the admin token (so that it shows in no process listing)");
  app.set_version_flag("--version", "stitch 0.1.0");

  publish_command pub;
  auto* publish = app.add_subcommand("publish", "publish a Hugging Face directory as a version");
  publish->add_option("--pool", pub.args.pool, "pool")->capture_default_str();
  publish->add_option("--run", pub.args.run_id, "run id")->required();
  publish->add_option("--version", pub.args.version, "version number")->required();
  publish->add_option("dir", pub.directory, "safetensors directory (single file or sharded)")
    ->required();
  publish->add_flag("--anchor", pub.args.force_anchor, "publish a full anchor");
  publish->add_flag("--dry-run", pub.args.dry_run, "print what would be published");
  publish->add_flag("--stream", pub.stream, "stream the tensors even to a local node");
  int64_t retry_budget_s = pub.retry_budget.count();
  publish
    ->add_option("--retry-budget", retry_budget_s,
                 "seconds to keep asking a busy publisher (every session taken); 0: give up at "
                 "once")
    ->check(CLI::Range(int64_t{0}, int64_t{86400}))
    ->capture_default_str();

  export_command exp;
  auto* exporter = app.add_subcommand("export", "write a version as a Hugging Face directory");
  exporter->add_option("--version", exp.version, "R/N or R/weight_v00000N")->required();
  exporter->add_option("--out", exp.out_dir, "output directory")->required();
  exporter->add_option("--pool", exp.pool, "pool (default: the one holding the run)");
  exporter->add_flag("--stream", exp.stream, "stream the bytes even from a node on this machine");
  exporter->add_flag("--sync", exp.sync, "fsync the files before the directory appears");
  exporter->add_option("--buffer-bytes", exp.buffer_bytes, "bytes buffered while streaming")
    ->capture_default_str();

  gc_command gc;
  auto* gc_cmd = app.add_subcommand(
    "gc", "remove old versions: keep the newest of each run, their chains, the boot and what "
          "replicas use");
  gc_cmd->add_option("--pool", gc.pool, "pool (default: every pool)");
  gc_cmd->add_option("--keep", gc.keep,
                     "newest versions kept per run (default: the publisher "
                     "node's store.retain_versions)");
  gc_cmd->add_flag("--dry-run", gc.dry_run, "print what would be removed; remove nothing");
  gc_cmd->add_flag("--json", gc.json, "print one JSON object");

  init_model_command init;
  auto* init_model = app.add_subcommand("init-model", "write a random-init boot checkpoint");
  init_model->add_option("--preset", init.preset, "tiny | small | medium | moe-tiny | moe-small")
    ->capture_default_str();
  init_model->add_option("--seed", init.seed, "random seed")->capture_default_str();
  init_model->add_option("--out", init.out_dir, "output directory")->required();

  auto* member_token = app.add_subcommand(
    "member-token", "print the member capability of --token (admin.member_token of nodes that "
                    "join the cluster without the admin token)");

  status_command stat;
  auto* status = app.add_subcommand("status", "the pools' pointers and every replica's state");
  status->add_flag("--json", stat.json, "print the status actor's JSON");

  demo_command demo;
  std::string demo_gateway = "127.0.0.1:8080";
  auto* demo_cmd = app.add_subcommand("demo", "the async RL demo: a trainer learning while "
                                              "replicas keep generating");
  demo_cmd->add_flag("--local", demo.local, "start an all-in-one node in this process");
  demo_cmd->add_option("--steps", demo.steps, "training steps")->capture_default_str();
  demo_cmd->add_option("--samples", demo.samples_per_step, "rollouts per step")
    ->capture_default_str();
  demo_cmd
    ->add_option("--staleness-decay", demo.staleness_decay,
                 "weight of a token per version it is behind (by its version span)")
    ->check(CLI::Range(0.01, 1.0));
  demo_cmd->add_option("--staleness", demo.staleness, "min_version = latest - this")
    ->capture_default_str();
  demo_cmd->add_option("--gateway", demo_gateway, "gateway HOST:PORT (without --local)")
    ->capture_default_str();
  demo_cmd->add_flag("--json", demo.json, "end with one summary JSON object");
  demo_cmd->add_flag("--moe", demo.moe,
                     "train the moe-tiny mixture of experts with routing replay (R3)");
  demo_cmd
    ->add_option("--router-lr", demo.router_learning_rate,
                 "with --moe: step size on the last layer's router")
    ->capture_default_str();

  submit_command sub;
  auto* submit = app.add_subcommand("submit", "submit an experiment: claim its run, place its "
                                              "replicas and trainer");
  submit->add_option("file", sub.file, "experiment TOML")->required();

  scale_command scl;
  auto* scale = app.add_subcommand("scale", "change an experiment's replica count (elastic)");
  scale->add_option("--replicas", scl.replicas, "replicas wanted")->required();
  scale->add_option("--run", scl.run, "the run (default: the only active experiment)");

  stop_command stp;
  auto* stop = app.add_subcommand("stop", "end an experiment: its replicas drain and leave");
  stop->add_option("run", stp.run, "run id")->required();

  profile_command prof;
  auto* profile = app.add_subcommand(
    "profile", "where a replica's update time goes: drive it through a cold start, a delta, a "
               "folded catch-up, an empty delta and a run switch of scratch versions");
  profile->add_option("--replica", prof.replica, "the replica's id")->required();
  profile->add_flag("--take-out", prof.take_out,
                    "take a replica in rotation out for the profile (it is put back after)");
  profile->add_flag("--json", prof.json, "print one JSON object");
  profile->add_option("--out", prof.out,
                      "also write the JSON here and the chart next to it (.svg)");
  profile->add_option("--folded", prof.folded, "versions the folded catch-up moves across (1..6)")
    ->capture_default_str();
  profile->add_option("--stride", prof.stride, "about one element in N changes in each delta")
    ->capture_default_str();
  profile->add_option("--work-dir", prof.work_dir,
                      "where the copy of the replica's weights is kept meanwhile");

  std::string tls_cert, tls_key, tls_ca;
  app.add_option("--tls-cert", tls_cert, "this client's certificate (PEM), for TLS clusters");
  app.add_option("--tls-key", tls_key, "this client's private key (PEM)");
  app.add_option("--tls-ca", tls_ca, "the CA that signed the cluster's certificates (PEM)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? exit_ok : exit_usage;
  }
  if (!token_file.empty()) {
    auto read = read_token_file(token_file, !token.empty(), "--token (or STITCH_TOKEN)");
    if (!read) {
      std::fprintf(stderr, "stitch: --token-file: %s\n", read.error().message.c_str());
      return exit_usage;
    }
    token = std::move(*read);
  }
  auto where = parse_host_port(coordinator);
  if (!where) {
    std::fprintf(stderr, "stitch: --coordinator: %s\n", where.error().message.c_str());
    return exit_usage;
  }
  auto* chosen = app.get_subcommands().front();
  if (chosen == init_model) {
    return finish("init-model", run_init_model(init, stdout));
  }
  if (chosen == member_token) {
    if (token.empty()) {
      std::fprintf(stderr, "stitch member-token: give the admin token (--token or STITCH_TOKEN)\n");
      return exit_usage;
    }
    std::printf("%s\n", stitch::transport::member_capability(token).c_str());
    return exit_ok;
  }
  int tls_given = !tls_cert.empty() + !tls_key.empty() + !tls_ca.empty();
  if (tls_given != 0 && tls_given != 3) {
    std::fprintf(stderr, "stitch: --tls-cert, --tls-key and --tls-ca go together\n");
    return exit_usage;
  }
  if (tls_given == 3) {
    auto bad = stitch::check_tls_files(tls_cert, tls_key, tls_ca);
    if (!bad.empty()) {
      std::fprintf(stderr, "stitch: %s\n", bad.c_str());
      return exit_usage;
    }
  }
  // Moving a model's bytes is bulk work: on a machine that also serves, the
  // node's request and control threads go first (every thread the actor
  // system starts inherits this).
  if (chosen == publish || chosen == exporter || chosen == profile)
    stitch::pipeline::run_as_background_thread();
  stitch::system_config cfg;
  if (tls_given == 3)
    cfg.use_tls(tls_cert, tls_key, tls_ca);
  auto system = std::make_unique<caf::actor_system>(cfg);
  bounded_shutdown shutdown{system};
  auto& sys = *system;
  if (chosen == submit) {
    sub.coordinator = *where;
    sub.token = token;
    return finish("submit", run_submit(sys, sub, stdout));
  }
  if (chosen == scale) {
    scl.coordinator = *where;
    scl.token = token;
    return finish("scale", run_scale(sys, scl, stdout));
  }
  if (chosen == stop) {
    stp.coordinator = *where;
    stp.token = token;
    return finish("stop", run_stop(sys, stp, stdout));
  }
  if (chosen == demo_cmd) {
    demo.coordinator = *where;
    demo.token = token;
    auto gw = parse_host_port(demo_gateway);
    if (!gw) {
      std::fprintf(stderr, "stitch demo: --gateway: %s\n", gw.error().message.c_str());
      return exit_usage;
    }
    demo.gateway = *gw;
    return finish("demo", run_demo(sys, demo, stdout), false);
  }
  if (chosen == status) {
    stat.coordinator = *where;
    return finish("status", run_status(sys, stat, stdout), false);
  }
  if (chosen == profile) {
    prof.coordinator = *where;
    prof.token = token;
    return finish("profile", run_profile(sys, prof, stdout));
  }
  if (chosen == gc_cmd) {
    gc.coordinator = *where;
    gc.token = token;
    return finish("gc", run_gc(sys, gc, stdout));
  }
  if (chosen == publish) {
    pub.coordinator = *where;
    pub.args.token = token;
    pub.retry_budget = std::chrono::seconds{retry_budget_s};
    auto done = run_publish(sys, pub, stdout);
    return finish("publish", done ? stitch::status{} : stitch::status{done.error()});
  }
  exp.coordinator = *where;
  exp.token = token;
  return finish("export", run_export(sys, exp, stdout));
}
