#include "node/node.hpp"

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include "actors/coordinator.hpp"
#include "actors/gateway.hpp"
#include "actors/http_front.hpp"
#include "actors/hub_relay.hpp"
#include "actors/log.hpp"
#include "actors/node_agent.hpp"
#include "actors/publisher.hpp"
#include "actors/publisher_http.hpp"
#include "actors/replica.hpp"
#include "actors/rollout_driver.hpp"
#include "actors/status.hpp"
#include "actors/store.hpp"
#include "actors/store_client.hpp"
#include "gpu/device.hpp"
#include "node/demo.hpp"
#include "node/peer_source.hpp"
#include "node/remote.hpp"
#include "node/security_report.hpp"
#include "runtime/engine/builtin_engine.hpp"
#include "runtime/engine/external_engine.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/pipeline/store_tensor_source.hpp"
#include "runtime/store/experiment_file.hpp"
#include "runtime/store/store_uri.hpp"
#include "transport/http_client.hpp"

#include <map>
#include <mutex>
#include <thread>

namespace stitch::node {

namespace {

/// Tensor bytes from the node's own store backend, which it keeps alive for
/// as long as a replica's workers may read.
class backend_source final : public tensor_source {
public:
  backend_source(std::shared_ptr<store_backend> backend, std::string pool)
      : backend_(std::move(backend)), inner_(*backend_, std::move(pool)) {}
  result<manifest> manifest_of(const version_ref& ref) override { return inner_.manifest_of(ref); }
  status read(const version_ref& ref, std::string_view tensor, uint64_t offset,
              std::span<std::byte> out) override {
    return inner_.read(ref, tensor, offset, out);
  }

private:
  std::shared_ptr<store_backend> backend_;
  pipeline::store_tensor_source inner_;
};

} // namespace

/// Trainer jobs of this node: one thread per run, stopped by a flag.
struct node::jobs {
  struct job {
    std::shared_ptr<std::atomic<bool>> stop = std::make_shared<std::atomic<bool>>(false);
    std::thread thread;
  };
  std::mutex mutex;
  std::map<std::string, job> by_run;
  /// Replica HTTP fronts and actors, by replica id.
  std::map<std::string, std::unique_ptr<replica_http>> fronts;
  std::map<std::string, replica_actor> replicas;
  /// `engine.url` -> the replica driving it (one engine serves one replica).
  std::map<std::string, std::string> engine_users;

  void stop_all() {
    std::map<std::string, job> all;
    {
      std::lock_guard lock{mutex};
      all.swap(by_run);
    }
    for (auto& [run, j] : all)
      j.stop->store(true);
    for (auto& [run, j] : all)
      if (j.thread.joinable())
        j.thread.join();
  }
};

namespace {

/// How long a node keeps trying to reach the coordinator and the store.
constexpr auto join_wait = std::chrono::seconds{20};

/// Calls `attempt` until it succeeds or `join_wait` passed (the coordinator
/// or the store's node may still be starting); answers the last result.
template <class F>
auto keep_trying(F attempt) -> decltype(attempt()) {
  auto deadline = std::chrono::steady_clock::now() + join_wait;
  for (;;) {
    auto got = attempt();
    if (got || std::chrono::steady_clock::now() > deadline)
      return got;
    std::this_thread::sleep_for(std::chrono::milliseconds{200});
  }
}

replica_options node_replica_options(const node_settings& settings) {
  auto seconds = [](double s) { return std::chrono::milliseconds{static_cast<int64_t>(s * 1000)}; };
  replica_options o;
  o.pool = settings.pool;
  o.drain_timeout = seconds(settings.drain_timeout);
  o.backstop = seconds(settings.backstop);
  o.member_token = settings.member_token;
  return o;
}

} // namespace

result<std::unique_ptr<node>> node::start(caf::actor_system& sys, const node_settings& settings) {
  if (!settings.tls_cert.empty() && !tls_enabled(sys))
    return make_error(errc::invalid_argument,
                      "tls: the node was started without its TLS settings loaded");
  // The node's CAF listener: the coordinator's port on the hub's node, the
  // mesh port on every other. Plain CAF on an address other machines reach
  // lets anyone who reaches it speak the nodes' messages.
  if (auto refused = security_refusal(settings); !refused.empty())
    return make_error(errc::invalid_argument, refused);
  for (const auto& warning : security_warnings(settings))
    log::warn("node", warning);
  std::error_code ec;
  std::filesystem::create_directories(settings.data_dir, ec);
  if (ec)
    return make_error(errc::backend_failure, "cannot create the data directory '"
                                               + settings.data_dir.string() + "': " + ec.message());
  std::unique_ptr<node> n{new node(sys)};
  n->settings_ = settings;
  n->jobs_ = std::make_unique<jobs>();
  if (settings.has_role("coordinator")) {
    coordinator_options co;
    co.heartbeat_timeout =
      std::chrono::milliseconds{static_cast<int64_t>(settings.heartbeat_timeout * 1000)};
    co.admin_token = settings.admin_token;
    co.member_token = settings.member_token;
    if (auto ok = n->recover_experiments(co); !ok)
      return std::move(ok).error();
    n->coordinator_ = sys.spawn(coordinator, co);
    n->owns_coordinator_ = true;
    auto port = publish_coordinator(sys, n->coordinator_, settings.coordinator_listen.port,
                                    settings.coordinator_listen.host);
    if (!port) {
      n->stop();
      return std::move(port).error();
    }
    n->port_ = *port;
    n->coordinator_at_ = {settings.coordinator_listen.host, *port};
  } else {
    auto at = parse_host_port(settings.coordinator_address);
    if (!at)
      return std::move(at).error();
    n->coordinator_at_ = *at;
    // Other nodes connect here directly (the node mesh, TLS with `[tls]`):
    // their agents find the address in the coordinator's directory.
    n->mesh_anchor_ = sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
      self->set_default_handler(caf::drop);
      return {[](atom::tick) {}};
    });
    auto mesh_port = publish_mesh_anchor(sys, n->mesh_anchor_, settings.cluster_listen.port,
                                         settings.cluster_listen.host);
    auto mesh_host = advertised_host(settings.cluster_listen.host, at->host);
    if (!mesh_port || !mesh_host) {
      n->stop();
      return mesh_port ? std::move(mesh_host).error() : std::move(mesh_port).error();
    }
    const bool v6 = mesh_host->find(':') != std::string::npos;
    n->mesh_ = (v6 ? "[" + *mesh_host + "]" : *mesh_host) + ":" + std::to_string(*mesh_port);
    auto found = keep_trying([&] { return connect_coordinator(sys, *at); });
    if (!found)
      return std::move(found).error();
    // Everything on this node reaches the coordinator through a relay the
    // agent points at it again after the hub's node restarts.
    n->coordinator_remote_ = *found;
    n->coordinator_ = caf::actor_cast<coordinator_actor>(
      spawn_hub_relay(sys, coordinator_relay_options(), caf::actor_cast<caf::actor>(*found)));
    n->relays_.push_back(caf::actor_cast<caf::actor>(n->coordinator_));
  }
  if (settings.has_role("store")) {
    auto opened = store::open_store(settings.effective_store_uri());
    if (!opened) {
      n->stop();
      return std::move(opened).error();
    }
    n->backend_ = std::shared_ptr<store_backend>{std::move(*opened)};
    store_options so;
    so.admin_token = settings.admin_token;
    so.io_buffer_bytes = settings.io_buffer_bytes;
    n->store_ = sys.spawn(store_service, n->backend_, store_lanes::make(), so);
    n->owns_store_ = true;
  } else {
    auto found = keep_trying([&] {
      return ask_actor<caf::actor>(sys, n->coordinator_, std::chrono::seconds{10}, atom::lookup_v,
                                   std::string{"store"});
    });
    if (!found) {
      n->stop();
      return make_error(errc::not_found, "no member of the cluster hosts the role 'store': "
                                           + found.error().message);
    }
    // The store's relay finds the store again through the coordinator, and
    // renews the replicas' pointer subscriptions with it.
    n->store_ = caf::actor_cast<store_actor>(spawn_hub_relay(
      sys, store_relay_options(caf::actor_cast<caf::actor>(n->coordinator_)), *found));
    n->relays_.push_back(caf::actor_cast<caf::actor>(n->store_));
    auto remote = std::make_shared<remote_store>(sys, n->store_);
    remote->set_token(settings.admin_token);
    n->backend_ = std::move(remote);
  }
  // Replicas fetch and lend over UCX; a publisher lends its runs' remembered
  // versions.
  if (settings.has_role("replica") || settings.has_role("publisher")) {
    if (settings.transfer_peers == config::peer_transfer::off) {
      n->transport_ = "store only (transfer.peers = off)";
    } else {
      auto w = transport::ucx::worker::start(transport::ucx::context_options{});
      if (w) {
        n->ucx_ = std::shared_ptr<transport::ucx::worker>{std::move(*w)};
        n->transport_ = "ucx (" + n->ucx_->ctx()->transports() + ")";
      } else {
        n->transport_ = "store only (UCX unavailable: " + w.error().message + ")";
        log::warn("node", settings.name
                            + ": replicas read weights from the store only: " + w.error().message);
      }
    }
  }
  if (settings.has_role("publisher")) {
    pipeline::publisher_options po;
    po.scratch_dir = settings.data_dir / "publisher";
    po.memory_limit = settings.publisher_memory_limit;
    po.delta_format = settings.publisher_delta_encoding;
    publisher_retention retention;
    retention.keep_last = settings.retain_versions;
    retention.directory = n->coordinator_; // checked: the coordinator answers in_use
    publisher_limits limits;
    limits.session_idle_timeout =
      std::chrono::seconds{static_cast<int64_t>(std::max(1.0, settings.session_idle_timeout))};
    publisher_lending lending;
    if (n->ucx_) {
      // Readers hold a lease for one fetch; a publish waits this long for
      // them before it rewrites the version they read (a reader that died
      // never releases; one still reading meets changed chunks, which fail
      // their digests, and finishes elsewhere: the trainer is not held up).
      lending.holders = std::make_shared<transport::ucx::holder_set>(
        n->ucx_, std::chrono::minutes{15}, std::chrono::seconds{2});
      lending.frame_holders = std::make_shared<transport::ucx::holder_set>(
        n->ucx_, std::chrono::minutes{15}, std::chrono::seconds{2});
      lending.registry = caf::actor_cast<holder_registry_actor>(n->coordinator_);
      lending.node = settings.name;
      lending.member_token = settings.member_token;
    }
    n->publisher_ =
      sys.spawn(publisher_service, n->backend_, n->store_, po,
                std::make_shared<worker_pool>(6, "publish", 0, priority::background),
                settings.admin_token, limits, std::move(retention), std::move(lending));
  }
  if (settings.has_role("rollout_driver")) {
    n->rollout_driver_ = caf::actor_cast<caf::actor>(
      sys.spawn(rollout_driver, std::make_shared<worker_pool>(4, "rollouts")));
  }
  if (auto ok = n->start_serving(settings); !ok) {
    n->stop();
    return std::move(ok).error();
  }
  n->enroll_roles();
  if (auto ok = n->join_cluster(settings); !ok) {
    n->stop();
    return std::move(ok).error();
  }
  return n;
}

result<engine_factory> node::engine_for(const replica_options& o, const std::string& preset,
                                        std::vector<uint32_t> gpus) {
  if (settings_.engine_kind == engine_kind::builtin) {
    auto model = engine::preset(preset);
    if (!model)
      return std::move(model).error();
    engine::builtin_engine::options eo;
    eo.max_batch = settings_.engine_max_batch;
    eo.device = settings_.engine_device;
    eo.gpu = gpus.empty() ? 0 : static_cast<int>(gpus.front());
    if (eo.device == engine_device::cuda) {
      // Refused when the node starts, not when the replica does.
      auto shape = engine::llama_shape_of(*model);
      status usable = shape ? gpu::require_device(eo.gpu) : status{std::move(shape).error()};
      if (!usable)
        return make_error(usable.error().code, "engine.device = cuda for " + o.replica_id + " (GPU "
                                                 + std::to_string(eo.gpu)
                                                 + "): " + usable.error().message);
    }
    return engine_factory{[config = *model, eo]() -> result<std::shared_ptr<engine_port>> {
      auto made = engine::builtin_engine::create(config, eo);
      if (!made)
        return std::move(made).error();
      return std::shared_ptr<engine_port>{std::move(*made)};
    }};
  }
  auto seconds = [](double s) { return std::chrono::milliseconds{static_cast<int64_t>(s * 1000)}; };
  engine::external_engine_options eo;
  eo.kind = settings_.engine_kind;
  eo.url = settings_.engine_url;
  eo.staging_dir = settings_.effective_staging_dir() / o.replica_id;
  eo.request_timeout = seconds(settings_.engine_request_timeout);
  eo.update_timeout = seconds(settings_.engine_update_timeout);
  eo.ready_timeout = seconds(settings_.engine_ready_timeout);
  eo.partial_reload_max_bytes = settings_.engine_partial_reload_max_bytes;
  eo.log = [id = o.replica_id](std::string_view line) {
    log::warn("engine", id + ": " + std::string{line});
  };
  if (!settings_.engine_launch.empty()) {
    engine::launch_options lo;
    lo.command = settings_.engine_launch;
    lo.name = o.replica_id;
    lo.gpus = std::move(gpus);
    lo.log = [id = o.replica_id](std::string_view line) {
      log::info("engine", id + " | " + std::string{line});
    };
    eo.launch = std::move(lo);
  } else {
    std::lock_guard lock{jobs_->mutex};
    auto [it, fresh] = jobs_->engine_users.emplace(settings_.engine_url, o.replica_id);
    if (!fresh && it->second != o.replica_id)
      return make_error(errc::conflict, "engine.url " + settings_.engine_url + " drives replica "
                                          + it->second
                                          + " already; one engine serves one "
                                            "replica (use engine.launch for more)");
  }
  auto made = engine::external_engine::make(std::move(eo));
  if (!made)
    return std::move(made).error();
  log::info("node",
            o.replica_id + " drives " + (*made)->describe()
              + (settings_.engine_launch.empty() ? "" : " (launched at its first activation)"));
  return engine_factory{[e = std::shared_ptr<engine_port>{
                           *made}]() -> result<std::shared_ptr<engine_port>> { return e; }};
}

result<replica_actor> node::spawn_replica(const replica_options& o, const std::string& preset,
                                          uint16_t http_port, std::vector<uint32_t> gpus,
                                          uint16_t* bound) {
  auto factory = engine_for(o, preset, std::move(gpus));
  if (!factory)
    return std::move(factory).error();
  replica_deps d;
  d.store = store_;
  d.make_engine = std::move(*factory);
  d.transport = transport_;
  if (ucx_) {
    d.holder =
      std::make_shared<transport::ucx::holder>(ucx_, o.replica_id, std::chrono::minutes{15});
    d.frames_holder =
      std::make_shared<transport::ucx::holder>(ucx_, o.replica_id, std::chrono::minutes{15});
  }
  // A pool's bytes: the store's, and with the transport its holders' too.
  d.source_for = [&sys = sys_, coordinator = coordinator_, backend = backend_, ucx = ucx_,
                  holder = d.holder, frames_holder = d.frames_holder, replica = o.replica_id,
                  node = settings_.name, cap = settings_.member_token](const std::string& pool) {
    std::shared_ptr<tensor_source> source = std::make_shared<backend_source>(backend, pool);
    if (!ucx)
      return source;
    peer_source_options po;
    po.member_token = cap;
    po.pool = pool;
    po.replica_id = replica;
    po.node = node;
    // A stuck holder costs one stripe's read deadline, not the fetch.
    po.fetch.deadline = std::chrono::minutes{10};
    po.frames_fetch.deadline = std::chrono::minutes{10};
    po.relay = holder;
    po.frames_relay = frames_holder;
    return std::shared_ptr<tensor_source>{
      std::make_shared<peer_source>(sys, coordinator, std::move(source), ucx, po)};
  };
  d.bytes = d.source_for(o.pool);
  d.reconcile_worker = std::make_shared<worker_pool>(1, "stage-" + o.replica_id);
  d.request_workers = std::make_shared<worker_pool>(64, "gen-" + o.replica_id);
  d.lane = std::make_shared<request_lane>(gate_options_of(o));
  auto replica = sys_.spawn(replica_service, o, d);
  replica_http_options front;
  front.lane = d.lane;
  front.server.body_limit = settings_.body_limit;
  front.server.max_connections = settings_.http_max_connections;
  front.server.max_connections_per_client = settings_.http_max_connections_per_client;
  front.server.body_budget = settings_.http_body_budget;
  front.router.admin_token = settings_.admin_token;
  front.router.affinity_headers = settings_.affinity_headers;
  auto http = std::make_unique<replica_http>(sys_, caf::actor_cast<caf::actor>(replica), front);
  auto port = http->listen(settings_.replica_listen.host, http_port);
  if (!port) {
    caf::anon_send_exit(replica, caf::exit_reason::user_shutdown);
    return std::move(port).error();
  }
  log::info("node",
            o.replica_id + " serves http://" + settings_.replica_listen.host + ":"
              + std::to_string(*port) + " (pool " + o.pool + ", engine "
              + (settings_.engine_kind == engine_kind::builtin
                   ? "builtin " + preset + " on " + std::string{to_string(settings_.engine_device)}
                   : std::string{to_string(settings_.engine_kind)})
              + ")");
  std::lock_guard lock{jobs_->mutex};
  if (jobs_->fronts.contains(o.replica_id)) {
    caf::anon_send_exit(replica, caf::exit_reason::user_shutdown);
    return make_error(errc::conflict, "replica " + o.replica_id + " already runs here");
  }
  jobs_->fronts[o.replica_id] = std::move(http);
  jobs_->replicas[o.replica_id] = replica;
  if (bound)
    *bound = *port;
  return replica;
}

status node::join_cluster(const node_settings& settings) {
  member_info me;
  me.name = settings.name;
  me.roles = settings.roles;
  me.slots = settings.gpus;
  if (gateway_)
    me.gateway_http = settings.gateway_listen.host + ":" + std::to_string(http_.gateway);
  me.mesh = owns_coordinator_ ? "" : mesh_;
  node_agent_hooks hooks;
  hooks.spawn_replica = [this](const placement& p,
                               const experiment_spec& spec) -> result<replica_actor> {
    auto mode = parse_commit_mode(spec.commit_mode);
    if (!mode)
      return std::move(mode).error();
    auto o = node_replica_options(settings_);
    o.replica_id = p.replica_id;
    o.pool = p.pool;
    o.mode = *mode;
    // Slot i listens on replica.listen + replicas + i (0: any free port).
    uint32_t base = settings_.replica_listen.port;
    uint16_t want = base == 0 ? 0 : static_cast<uint16_t>(base + settings_.replicas + p.slot);
    return spawn_replica(o, spec.boot_preset, want, {p.slot});
  };
  hooks.replica_gone = [this](const std::string& id) {
    std::unique_ptr<replica_http> front;
    {
      std::lock_guard lock{jobs_->mutex};
      jobs_->replicas.erase(id);
      std::erase_if(jobs_->engine_users, [&](const auto& u) { return u.second == id; });
      if (auto it = jobs_->fronts.find(id); it != jobs_->fronts.end()) {
        front = std::move(it->second);
        jobs_->fronts.erase(it);
      }
    }
    if (front)
      front->stop();
  };
  hooks.start_trainer = [this](const experiment_spec& spec, const std::string& gateway,
                               node_agent_actor agent) -> status {
    auto gw = parse_host_port(gateway);
    if (!gw)
      return std::move(gw).error();
    std::lock_guard lock{jobs_->mutex};
    if (auto it = jobs_->by_run.find(spec.run_id); it != jobs_->by_run.end()) {
      if (!it->second.stop->load())
        return {};
      if (it->second.thread.joinable())
        it->second.thread.join();
      jobs_->by_run.erase(it);
    }
    auto& j = jobs_->by_run[spec.run_id];
    demo_command cmd;
    cmd.coordinator = coordinator_at_;
    cmd.gateway = *gw;
    cmd.steps = spec.trainer.steps;
    cmd.samples_per_step = spec.trainer.samples_per_step;
    cmd.staleness = spec.trainer.staleness;
    cmd.learning_rate = spec.trainer.learning_rate;
    cmd.token = settings_.admin_token;
    cmd.run_id = spec.run_id;
    cmd.pool = spec.pool;
    cmd.preset = spec.boot_preset;
    cmd.seed = spec.boot_seed;
    cmd.boot_version = spec.boot_version;
    cmd.stop = j.stop.get();
    // A hub restart (the publisher's node) is waited out.
    cmd.publish_retry_for = std::chrono::seconds{120};
    // Start from the run as stored: its boot (from a seed or a directory),
    // or where a trainer whose node died left it.
    cmd.resume = true;
    cmd.on_step = [agent, run = spec.run_id,
                   cap = settings_.member_token](const step_report& step) {
      char line[160];
      std::snprintf(line, sizeof line, " step %u: version %llu, reward %.3f, %llu samples",
                    step.step, static_cast<unsigned long long>(step.version), step.reward,
                    static_cast<unsigned long long>(step.samples));
      log::info("trainer", run + line);
      caf::anon_send(agent, atom::progress_v, run, step, cap);
    };
    log::info("trainer", "training " + spec.run_id + " for " + std::to_string(cmd.steps)
                           + " steps via gateway " + gateway);
    j.thread = std::thread{[this, cmd = std::move(cmd), agent, stop = j.stop]() mutable {
      // Rollouts come from the cluster's rollout driver when it has one.
      auto coordinator = caf::actor_cast<caf::actor>(coordinator_);
      auto lookup_driver = [this, coordinator] {
        return ask_actor<caf::actor>(sys_, coordinator, std::chrono::seconds{10}, atom::lookup_v,
                                     std::string{"rollout_driver"});
      };
      auto driver = lookup_driver();
      if (driver) {
        log::info("trainer", cmd.run_id + " samples through the cluster's rollout driver");
        // A link to the driver's node can drop under a batch (its node
        // restarted, or two nodes connected to each other at once and CAF
        // closed one of the links, killing its proxies): the driver is looked
        // up again and the batch asked again, for as long as a hub restart
        // is waited out.
        cmd.rollouts =
          [this, lookup_driver, handle = caf::actor_cast<rollout_driver_actor>(*driver),
           gw = cmd.gateway, pool = cmd.pool, stop = cmd.stop, patience = cmd.publish_retry_for,
           run = cmd.run_id](uint64_t min_version, uint32_t count, uint64_t seed_base) mutable {
            rollout_request req{gw.host, gw.port, pool, min_version, count, seed_base};
            const auto give_up = std::chrono::steady_clock::now() + patience;
            for (;;) {
              auto got = ask_actor<std::vector<engine::rollout_result>>(
                sys_, handle, std::chrono::minutes{10}, atom::rollouts_v, req);
              if (got || got.error().code != errc::engine_unavailable
                  || std::chrono::steady_clock::now() >= give_up || (stop && stop->load()))
                return got;
              log::warn("trainer", run + ": the rollout driver went away (" + got.error().message
                                     + "); looking it up again");
              std::this_thread::sleep_for(std::chrono::milliseconds{250});
              if (auto again = lookup_driver())
                handle = caf::actor_cast<rollout_driver_actor>(*again);
            }
          };
      }
      std::FILE* quiet = std::fopen("/dev/null", "w");
      auto done = run_demo(sys_, cmd, quiet ? quiet : stderr);
      if (quiet)
        std::fclose(quiet);
      std::string outcome;
      if (!done)
        outcome = "failed: " + to_string(done.error());
      else if (stop->load())
        outcome = "stopped";
      log::info("trainer", cmd.run_id + " ended: " + (outcome.empty() ? "finished" : outcome));
      stop->store(true);
      caf::anon_send(agent, atom::trained_v, cmd.run_id, outcome, settings_.member_token);
    }};
    return {};
  };
  // Removed after missed heartbeats (a partition, a stall), the node joins
  // again: the coordinator dropped its role handles with it.
  hooks.rejoined = [this] { enroll_roles(); };
  hooks.stop_trainer = [this](const std::string& run) {
    std::lock_guard lock{jobs_->mutex};
    if (auto it = jobs_->by_run.find(run); it != jobs_->by_run.end())
      it->second.stop->store(true);
  };
  hooks.running_trainers = [this] {
    std::vector<std::string> runs;
    std::lock_guard lock{jobs_->mutex};
    for (const auto& [run, j] : jobs_->by_run)
      if (!j.stop->load())
        runs.push_back(run);
    return runs;
  };
  coordinator_address where;
  if (!owns_coordinator_) {
    // The hub's node may die and come back on the same address: the agent
    // reconnects and points this node's coordinator relay at it.
    where = {node_connector(sys_), coordinator_at_.host, coordinator_at_.port, {}};
    hooks.coordinator_changed =
      [relay = caf::actor_cast<caf::actor>(coordinator_)](const coordinator_actor& now) {
        rebind_hub_relay(relay, caf::actor_cast<caf::actor>(now));
      };
  }
  where.member_token = settings_.member_token;
  agent_ = sys_.spawn(node_agent, me, owns_coordinator_ ? coordinator_ : coordinator_remote_,
                      std::move(hooks), std::move(where));
  return {};
}

void node::enroll_roles() {
  // The coordinator's directory: other nodes find the store, publisher,
  // gateway, status and rollout driver through it; `stitch status` finds the
  // status actor; retention keeps what the config's replicas use.
  auto enroll = [this](const char* role, const caf::actor& handle) {
    if (handle)
      caf::anon_send(coordinator_, atom::enroll_v, std::string{role}, handle,
                     settings_.member_token);
  };
  if (owns_store_)
    enroll("store", caf::actor_cast<caf::actor>(store_));
  enroll("publisher", caf::actor_cast<caf::actor>(publisher_));
  enroll("rollout_driver", rollout_driver_);
  enroll("gateway", caf::actor_cast<caf::actor>(gateway_));
  enroll("status", caf::actor_cast<caf::actor>(status_));
  for (const auto& replica : replicas_)
    caf::anon_send(coordinator_, atom::enroll_v, settings_.pool, replica, settings_.member_token);
}

status node::start_serving(const node_settings& settings) {
  transport::http_server_options server;
  server.body_limit = settings.body_limit;
  server.max_connections = settings.http_max_connections;
  server.max_connections_per_client = settings.http_max_connections_per_client;
  server.body_budget = settings.http_body_budget;
  replica_http_options front;
  front.server = server;
  front.router.admin_token = settings.admin_token;
  front.router.affinity_headers = settings.affinity_headers;

  if (settings.has_role("gateway")) {
    gateway_options go;
    go.member_token = settings.member_token;
    gateway_ = sys_.spawn(gateway_service, go);
  }
  if (settings.has_role("status")) {
    status_options so;
    so.node = settings.name;
    so.cluster_transport = tls_enabled(sys_)           ? "mutual TLS"
                           : settings.cluster_insecure ? "plain, cluster.insecure"
                                                       : "plain (loopback only)";
    so.roles = settings.roles;
    so.pools = {settings.pool};
    so.member_token = settings.member_token;
    status_ = sys_.spawn(status_service, so, store_);
    if (gateway_)
      caf::anon_send(status_, atom::enroll_v, gateway_, settings.member_token);
  }
  uint32_t replicas = settings.has_role("replica") ? settings.replicas : 0;
  for (uint32_t i = 0; i < replicas; ++i) {
    auto o = node_replica_options(settings);
    o.replica_id = settings.name == "local" ? "replica-" + std::to_string(i)
                                            : settings.name + "-replica-" + std::to_string(i);
    o.mode = settings.commit_mode;
    uint16_t want = settings.replica_listen.port == 0
                      ? 0
                      : static_cast<uint16_t>(settings.replica_listen.port + i);
    uint16_t port = 0;
    std::vector<uint32_t> gpus;
    if (i < settings.gpus.size())
      gpus.push_back(settings.gpus[i]);
    auto replica = spawn_replica(o, settings.model_preset, want, std::move(gpus), &port);
    if (!replica)
      return std::move(replica).error();
    replicas_.push_back(*replica);
    http_.replicas.push_back(port);
    if (gateway_)
      caf::anon_send(gateway_, atom::enroll_v, settings.pool, *replica, settings.member_token);
    if (status_)
      caf::anon_send(status_, atom::enroll_v, settings.pool, *replica, settings.member_token);
  }
  if (gateway_) {
    gateway_front_ =
      std::make_unique<gateway_http>(sys_, caf::actor_cast<caf::actor>(gateway_), front);
    auto gw = gateway_front_->listen(settings.gateway_listen.host, settings.gateway_listen.port);
    if (!gw)
      return std::move(gw).error();
    http_.gateway = *gw;
  }
  if (status_) {
    // /metrics also counts this node's own HTTP surfaces.
    auto local_metrics = [this] {
      std::vector<std::pair<std::string, transport::http_server_stats>> all;
      std::lock_guard lock{jobs_->mutex};
      if (gateway_front_)
        all.emplace_back("gateway", gateway_front_->stats());
      if (status_front_)
        all.emplace_back("status", status_front_->stats());
      if (publisher_front_)
        all.emplace_back("publisher", publisher_front_->stats());
      for (const auto& [id, f] : jobs_->fronts)
        all.emplace_back("replica " + id, f->stats());
      return http_surface_metrics(all);
    };
    status_front_ = std::make_unique<status_http>(sys_, caf::actor_cast<caf::actor>(status_),
                                                  server, std::move(local_metrics));
    auto st = status_front_->listen(settings.status_listen.host, settings.status_listen.port);
    if (!st)
      return std::move(st).error();
    http_.status = *st;
  }
  if (publisher_ && !settings.publisher_listen.empty()) {
    auto at = config::parse_listen_address(settings.publisher_listen);
    if (!at)
      return std::move(at).error();
    publisher_http_options po;
    po.server = server;
    // Tensor bytes arrive in requests of up to this size.
    po.server.body_limit = std::max<size_t>(server.body_limit, size_t{64} << 20);
    po.server.read_timeout = std::chrono::minutes{2};
    po.admin_token = settings.admin_token;
    if (settings.publisher_tls) {
      po.server.tls_cert = settings.tls_cert.string();
      po.server.tls_key = settings.tls_key.string();
    }
    auto front_of_publisher =
      std::make_unique<publisher_http>(sys_, caf::actor_cast<caf::actor>(publisher_), po);
    {
      // The status surface's /metrics may already read the fronts.
      std::lock_guard lock{jobs_->mutex};
      publisher_front_ = std::move(front_of_publisher);
    }
    auto pb = publisher_front_->listen(at->host, at->port);
    if (!pb)
      return std::move(pb).error();
    http_.publisher = *pb;
    // From an actor of this node: the publisher ignores anonymous ones.
    caf::scoped_actor self{sys_};
    self->send(publisher_, atom::server_info_v,
               transport::http_endpoint{settings.publisher_tls ? "https" : "http", at->host, *pb}
                 .to_string());
  }
  return {};
}

node::node(caf::actor_system& sys) : sys_(sys) {}

node::~node() {
  stop();
}

void node::stop() {
  if (jobs_)
    jobs_->stop_all();
  // The node leaves the cluster first: the coordinator places its replicas
  // elsewhere while they drain here.
  if (agent_)
    caf::anon_send_exit(agent_, caf::exit_reason::user_shutdown);
  agent_ = nullptr;
  if (mesh_anchor_)
    caf::anon_send_exit(mesh_anchor_, caf::exit_reason::user_shutdown);
  mesh_anchor_ = nullptr;
  // Replicas leave rotation and finish what they are running (bounded by
  // replica.drain_timeout, at most 30 s here), then HTTP stops.
  std::map<std::string, replica_actor> leaving;
  std::map<std::string, std::unique_ptr<replica_http>> placed;
  if (jobs_) {
    std::lock_guard lock{jobs_->mutex};
    leaving.swap(jobs_->replicas);
    placed.swap(jobs_->fronts);
  }
  if (!leaving.empty()) {
    caf::scoped_actor self{sys_};
    for (auto& [id, r] : leaving) {
      self->monitor(r);
      self->send(r, atom::retire_v, settings_.member_token);
    }
    auto limit = std::min<std::chrono::milliseconds>(
      std::chrono::milliseconds{static_cast<int64_t>(settings_.drain_timeout * 1000)},
      std::chrono::seconds{30});
    auto deadline = std::chrono::steady_clock::now() + limit;
    size_t gone = 0;
    while (gone < leaving.size() && std::chrono::steady_clock::now() < deadline) {
      self->receive([&](caf::down_msg&) { ++gone; },
                    caf::after(std::chrono::milliseconds{100}) >> [] {});
    }
    for (auto& [id, r] : leaving)
      caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  }
  if (gateway_front_)
    gateway_front_->stop();
  for (auto& [id, f] : placed)
    f->stop();
  if (status_front_)
    status_front_->stop();
  if (publisher_front_)
    publisher_front_->stop();
  replicas_.clear();
  for (auto handle : {caf::actor_cast<caf::actor>(gateway_), caf::actor_cast<caf::actor>(status_)})
    if (handle)
      caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
  gateway_ = nullptr;
  status_ = nullptr;
  if (owns_coordinator_ && coordinator_ && port_ != 0)
    (void) sys_.middleman().unpublish(coordinator_, port_);
  std::vector<caf::actor> owned{caf::actor_cast<caf::actor>(publisher_), rollout_driver_};
  rollout_driver_ = nullptr;
  if (owns_coordinator_)
    owned.push_back(caf::actor_cast<caf::actor>(coordinator_));
  if (owns_store_)
    owned.push_back(caf::actor_cast<caf::actor>(store_));
  for (const auto& handle : owned)
    if (handle) {
      caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
      // Handles sent to remote nodes are kept alive in the registry for them;
      // a stopping node releases them.
      sys_.registry().erase(handle.id());
    }
  for (const auto& relay : relays_)
    caf::anon_send_exit(relay, caf::exit_reason::user_shutdown);
  relays_.clear();
  coordinator_ = nullptr;
  coordinator_remote_ = nullptr;
  publisher_ = nullptr;
  store_ = nullptr;
  backend_.reset();
}

status node::recover_experiments(coordinator_options& co) {
  // The experiments live beside the node's data: a restarted hub recovers
  // them and adopts the replicas that kept serving.
  auto dir = settings_.data_dir / "coordinator";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return make_error(errc::backend_failure, "cannot create " + dir.string() + ": " + ec.message());
  auto path = dir / "experiments.msgpack";
  auto records = store::load_experiments(path);
  if (!records)
    return make_error(records.error().code, "the coordinator's experiments cannot be recovered: "
                                              + records.error().message
                                              + " (move the file aside to start without them)");
  if (auto ok = cluster_plan{}.restore(*records); !ok)
    return make_error(ok.error().code, "the coordinator's experiments in " + path.string()
                                         + " cannot be recovered: " + ok.error().message
                                         + " (move the file aside to start without them)");
  co.restored = std::move(*records);
  // Nodes retry every 200 ms to 2 s; a few heartbeat bounds give them time
  // to reach the restarted hub before missing replicas are placed anew.
  co.recovery_window = std::max(std::chrono::milliseconds{3000}, 2 * co.heartbeat_timeout);
  // Written on a thread of its own, newest last; unchanged records are not
  // written again.
  co.persist = [writer = std::make_shared<worker_pool>(1, "persist"), path,
                last = std::make_shared<std::string>()](std::vector<experiment_record> now) {
    writer->post([path, last, now = std::move(now)] {
      auto bytes = store::encode_experiments(now);
      if (bytes == *last)
        return;
      if (auto ok = store::save_experiments(path, now); !ok) {
        log::error("coordinator", "the experiments were not persisted: " + ok.error().message);
        return;
      }
      *last = std::move(bytes);
    });
  };
  return {};
}

} // namespace stitch::node
