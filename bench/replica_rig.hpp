#pragma once

// The request-path benches' setup: one replica over a RocksDB store that
// holds run "bench" version 0 (the tiny preset, with its config.json), a
// gateway in front of it, each with its HTTP surface, on an actor system
// configured as the nodes' are.

#include <caf/all.hpp>

#include <chrono>
#include <filesystem>
#include <memory>
#include <thread>

#include "actors/gateway.hpp"
#include "actors/http_front.hpp"
#include "actors/replica.hpp"
#include "actors/store.hpp"
#include "node/system_config.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/engine/weights.hpp"
#include "runtime/pipeline/publisher.hpp"
#include "runtime/pipeline/store_tensor_source.hpp"
#include "runtime/store/rocksdb_store.hpp"
#include "transport/http_client.hpp"

namespace stitch::bench {

/// The nodes' actor system settings, without CAF's log file.
inline caf::actor_system_config& bench_config(caf::actor_system_config& cfg) {
  register_stitch_types(cfg);
  tune_scheduler(cfg);
  cfg.set("logger.file-verbosity", caf::atom("quiet"));
  return cfg;
}

class replica_rig {
public:
  struct options {
    size_t request_workers = 16;
    replica_http_options gateway_http;
  };

  explicit replica_rig(caf::actor_system& sys) : sys_(sys) {}
  replica_rig(const replica_rig&) = delete;
  replica_rig& operator=(const replica_rig&) = delete;

  /// The model the store holds.
  static engine::model_config model() { return *engine::preset("tiny"); }

  /// Stores the version, starts the replica (its engine from `make_engine`)
  /// and the gateway, and waits (bounded) until the gateway routes to it.
  status start(const std::filesystem::path& dir, engine_factory make_engine, options o) {
    auto opened = store::open_rocksdb_store((dir / "db").string());
    if (!opened)
      return std::move(opened).error();
    backend_ = std::shared_ptr<store_backend>{std::move(*opened)};
    const auto config = model();
    pipeline::publish_request pr{"default", "bench", 0, false, false};
    pr.files = {{"config.json", engine::render_model_config(config)}};
    pipeline::publisher pub{*backend_};
    if (auto r = pub.publish(pr, *engine::random_init(config, 1)); !r)
      return std::move(r).error();
    store_ = sys_.spawn(store_service, backend_, stitch::store_lanes::make(), store_options{});
    replica_deps d;
    d.store = store_;
    d.make_engine = std::move(make_engine);
    d.bytes = std::make_shared<pipeline::store_tensor_source>(*backend_, "default");
    d.reconcile_worker = std::make_shared<worker_pool>(1, "stage");
    d.request_workers = std::make_shared<worker_pool>(o.request_workers, "gen");
    d.lane = std::make_shared<request_lane>(gate_options_of(replica_options{}));
    replica_ = sys_.spawn(replica_service, replica_options{}, d);
    gateway_ = sys_.spawn(gateway_service, gateway_options{});
    caf::anon_send(gateway_, atom::enroll_v, std::string{"default"}, replica_, std::string{});
    replica_http_options front;
    front.lane = d.lane;
    replica_front_ =
      std::make_unique<replica_http>(sys_, caf::actor_cast<caf::actor>(replica_), std::move(front));
    gateway_front_ = std::make_unique<gateway_http>(sys_, caf::actor_cast<caf::actor>(gateway_),
                                                    std::move(o.gateway_http));
    auto rport = replica_front_->listen("127.0.0.1", 0);
    if (!rport)
      return std::move(rport).error();
    auto gport = gateway_front_->listen("127.0.0.1", 0);
    if (!gport)
      return std::move(gport).error();
    replica_port = *rport;
    gateway_port = *gport;
    for (int i = 0; i < 3000; ++i) {
      transport::http_client c{transport::http_endpoint{"http", "127.0.0.1", gateway_port}};
      transport::http_request h;
      h.target = "/health";
      if (auto r = c.send(h); r && r->status == 200)
        return {};
      std::this_thread::sleep_for(std::chrono::milliseconds{10});
    }
    return make_error(errc::engine_unavailable, "the replica never activated its version");
  }

  const gateway_http& gateway_front() const { return *gateway_front_; }

  ~replica_rig() {
    if (gateway_front_)
      gateway_front_->stop();
    if (replica_front_)
      replica_front_->stop();
    for (const auto& a :
         {caf::actor_cast<caf::actor>(replica_), caf::actor_cast<caf::actor>(gateway_),
          caf::actor_cast<caf::actor>(store_)})
      if (a)
        caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }

  uint16_t replica_port = 0;
  uint16_t gateway_port = 0;

private:
  caf::actor_system& sys_;
  std::shared_ptr<store_backend> backend_;
  store_actor store_;
  replica_actor replica_;
  gateway_actor gateway_;
  std::unique_ptr<replica_http> replica_front_;
  std::unique_ptr<gateway_http> gateway_front_;
};

} // namespace stitch::bench
