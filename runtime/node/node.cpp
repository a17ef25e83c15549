#include "runtime/node/node.hpp"

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include "actors/coordinator.hpp"
#include "actors/gateway.hpp"
#include "actors/http_front.hpp"
#include "actors/publisher.hpp"
#include "actors/replica.hpp"
#include "actors/status.hpp"
#include "actors/store.hpp"
#include "runtime/engine/builtin_engine.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/store/store_tensor_source.hpp"
#include "runtime/store/store_uri.hpp"

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
  store::store_tensor_source inner_;
};

} // namespace

result<std::unique_ptr<node>> node::start(caf::actor_system& sys, const node_settings& settings) {
  // Nothing starts half-configured: roles this build cannot host yet are refused.
  for (const char* role : {"trainer", "rollout_driver"})
    if (settings.has_role(role))
      return make_error(errc::invalid_argument,
                        std::string{"role '"} + role + "' is not part of this build yet");
  if (!settings.has_role("coordinator") || !settings.has_role("store")
      || !settings.coordinator_address.empty())
    return make_error(errc::invalid_argument,
                      "this build runs the coordinator and store on every node; joining another "
                      "node's coordinator (coordinator.address) is not part of this build yet");
  if (!settings.tls_cert.empty())
    return make_error(errc::invalid_argument,
                      "tls: inter-node TLS is not part of this build yet; remove [tls]");
  std::error_code ec;
  std::filesystem::create_directories(settings.data_dir, ec);
  if (ec)
    return make_error(errc::backend_failure, "cannot create the data directory '"
                                               + settings.data_dir.string() + "': " + ec.message());
  auto opened = store::open_store(settings.effective_store_uri());
  if (!opened)
    return std::move(opened).error();
  std::shared_ptr<store_backend> backend{std::move(*opened)};
  std::unique_ptr<node> n{new node(sys)};
  n->store_ = sys.spawn<caf::detached>(store_service, backend, settings.data_dir / "spool");
  n->publisher_ = sys.spawn<caf::detached>(publisher_service, backend, n->store_,
                                           store::publisher_options{}, settings.admin_token);
  n->coordinator_ = sys.spawn(coordinator);
  caf::anon_send(n->coordinator_, atom::enroll_v, std::string{"store"},
                 caf::actor_cast<caf::actor>(n->store_));
  caf::anon_send(n->coordinator_, atom::enroll_v, std::string{"publisher"},
                 caf::actor_cast<caf::actor>(n->publisher_));
  auto port = sys.middleman().publish(n->coordinator_, settings.coordinator_listen.port,
                                      settings.coordinator_listen.host.c_str(), true);
  if (!port) {
    n->stop();
    return make_error(errc::backend_failure, "cannot listen on " + settings.coordinator_listen.host
                                               + ":"
                                               + std::to_string(settings.coordinator_listen.port)
                                               + ": " + sys.render(port.error()));
  }
  n->port_ = *port;
  if (auto ok = n->start_serving(backend, settings); !ok) {
    n->stop();
    return std::move(ok).error();
  }
  return n;
}

status node::start_serving(std::shared_ptr<store_backend> backend, const node_settings& settings) {
  auto model = engine::preset(settings.model_preset);
  if (!model)
    return std::move(model).error();
  auto mode = parse_commit_mode(settings.commit_mode);
  if (!mode)
    return std::move(mode).error();
  auto seconds = [](double s) { return std::chrono::milliseconds{static_cast<int64_t>(s * 1000)}; };
  transport::http_server_options server;
  server.body_limit = settings.body_limit;
  replica_http_options front;
  front.server = server;
  front.router.admin_token = settings.admin_token;
  front.router.affinity_headers = settings.affinity_headers;

  if (settings.has_role("gateway"))
    gateway_ = sys_.spawn(gateway_service, gateway_options{});
  if (settings.has_role("status")) {
    status_options so;
    so.node = settings.name;
    so.roles = settings.roles;
    so.pools = {settings.pool};
    status_ = sys_.spawn(status_service, so, store_);
    if (gateway_)
      caf::anon_send(status_, atom::enroll_v, gateway_);
    // `stitch status` finds it through the coordinator.
    caf::anon_send(coordinator_, atom::enroll_v, std::string{"status"},
                   caf::actor_cast<caf::actor>(status_));
  }
  uint32_t replicas = settings.has_role("replica") ? settings.replicas : 0;
  for (uint32_t i = 0; i < replicas; ++i) {
    replica_options o;
    o.replica_id = settings.name == "local" ? "replica-" + std::to_string(i)
                                            : settings.name + "/replica-" + std::to_string(i);
    o.pool = settings.pool;
    o.mode = *mode;
    o.drain_timeout = seconds(settings.drain_timeout);
    o.backstop = seconds(settings.backstop);
    replica_deps d;
    d.store = store_;
    d.make_engine = [config = *model]() -> result<std::shared_ptr<engine_port>> {
      return std::shared_ptr<engine_port>{std::make_shared<engine::builtin_engine>(config)};
    };
    d.bytes = std::make_shared<backend_source>(backend, settings.pool);
    d.reconcile_worker = std::make_shared<worker_pool>(1, "stage-" + std::to_string(i));
    d.request_workers = std::make_shared<worker_pool>(64, "gen-" + std::to_string(i));
    auto replica = sys_.spawn(replica_service, o, d);
    replicas_.push_back(replica);
    if (gateway_)
      caf::anon_send(gateway_, atom::enroll_v, settings.pool, replica);
    if (status_)
      caf::anon_send(status_, atom::enroll_v, settings.pool, replica);
    auto http = std::make_unique<replica_http>(sys_, caf::actor_cast<caf::actor>(replica), front);
    uint16_t want = settings.replica_listen.port == 0
                      ? 0
                      : static_cast<uint16_t>(settings.replica_listen.port + i);
    auto port = http->listen(settings.replica_listen.host, want);
    if (!port)
      return std::move(port).error();
    http_.replicas.push_back(*port);
    replica_fronts_.push_back(std::move(http));
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
    status_front_ =
      std::make_unique<status_http>(sys_, caf::actor_cast<caf::actor>(status_), server);
    auto st = status_front_->listen(settings.status_listen.host, settings.status_listen.port);
    if (!st)
      return std::move(st).error();
    http_.status = *st;
  }
  return {};
}

node::node(caf::actor_system& sys) : sys_(sys) {}

node::~node() {
  stop();
}

void node::stop() {
  // HTTP first: answers in flight drain while the actors still run.
  if (gateway_front_)
    gateway_front_->stop();
  for (auto& f : replica_fronts_)
    f->stop();
  if (status_front_)
    status_front_->stop();
  for (auto& r : replicas_)
    caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  replicas_.clear();
  for (auto handle : {caf::actor_cast<caf::actor>(gateway_), caf::actor_cast<caf::actor>(status_)})
    if (handle)
      caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
  gateway_ = nullptr;
  status_ = nullptr;
  if (coordinator_ && port_ != 0)
    (void) sys_.middleman().unpublish(coordinator_, port_);
  for (auto handle : {caf::actor_cast<caf::actor>(coordinator_),
                      caf::actor_cast<caf::actor>(publisher_), caf::actor_cast<caf::actor>(store_)})
    if (handle) {
      caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
      // Handles sent to remote nodes are kept alive in the registry for them;
      // a stopping node releases them.
      sys_.registry().erase(handle.id());
    }
  coordinator_ = nullptr;
  publisher_ = nullptr;
  store_ = nullptr;
}

} // namespace stitch::node
