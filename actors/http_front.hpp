#pragma once

#include <caf/fwd.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actors/replica_actor.hpp"
#include "transport/http_router.hpp"
#include "transport/http_server.hpp"

namespace stitch {

/// DESIGN §5 `server_info` as JSON.
std::string server_info_json(const replica_info& info);

/// Writes a replica's answer to the client: a whole response (with
/// `Retry-After` and `X-Stitch-Replica`), or the last event of a stream and
/// its end. `streaming` says whether earlier events already started it.
void deliver(const replica_answer& answer, transport::http_responder& out, bool streaming);

/// Hands one HTTP request to `target` (a replica, or the gateway) as
/// `msg` — whose answer is a `replica_answer` — from a short-lived actor
/// that relays streamed `(event, key, json)` messages and answers the
/// client; a client that goes away makes it send `(cancel, key)`.
void relay_call(caf::actor_system& sys, const caf::actor& target, caf::message msg, uint64_t key,
                std::shared_ptr<transport::http_responder> out);

class request_lane;

struct replica_http_options {
  transport::http_server_options server;
  transport::router_options router;
  /// The replica's request lane (`replica_deps::lane`): its requests are
  /// admitted, run and answered without a hop through the actor. Null: every
  /// request goes through the actor.
  std::shared_ptr<request_lane> lane;
};

/// An HTTP surface in front of one actor: owns the server, hands every
/// request to `handle` on a server thread.
class http_surface {
public:
  http_surface(caf::actor_system& sys, caf::actor target,
               transport::http_server_options server_options);
  virtual ~http_surface();
  http_surface(const http_surface&) = delete;
  http_surface& operator=(const http_surface&) = delete;

  /// Port 0 picks a free port; returns the port.
  result<uint16_t> listen(const std::string& host, uint16_t port);
  /// Drains answers in flight, then closes. Derived destructors call it.
  void stop();
  /// Connections held and refused (zeros before `listen`).
  transport::http_server_stats stats() const;

protected:
  virtual void handle(transport::server_request req,
                      std::shared_ptr<transport::http_responder> out) = 0;

  /// Largest request body this surface accepts.
  size_t body_limit() const noexcept { return server_options_.body_limit; }

  caf::actor_system& sys_;
  caf::actor target_;
  std::atomic<uint64_t> next_key_{1};

private:
  transport::http_server_options server_options_;
  std::unique_ptr<transport::http_server> server_;
};

/// A replica's own HTTP endpoint (DESIGN §5 "Replica"): versioned routes,
/// pass-through, `/health`, `/server_info`, `/wake`.
class replica_http final : public http_surface {
public:
  replica_http(caf::actor_system& sys, caf::actor replica, replica_http_options options);
  ~replica_http() override;

private:
  void handle(transport::server_request req,
              std::shared_ptr<transport::http_responder> out) override;
  transport::router_options router_;
  std::shared_ptr<request_lane> lane_;
};

/// The gateway's HTTP surface (DESIGN §5 "Gateway"): versioned routes and
/// pass-through routed to a replica of the pool, `/health`, `/pool`, `/wake`.
class gateway_http final : public http_surface {
public:
  gateway_http(caf::actor_system& sys, caf::actor gateway, replica_http_options options);
  ~gateway_http() override;

private:
  void handle(transport::server_request req,
              std::shared_ptr<transport::http_responder> out) override;
  transport::router_options router_;
};

/// The status HTTP surface (DESIGN §5 "Status actor"): `GET /status`,
/// `GET /metrics`, `GET /` (the dashboard).
class status_http final : public http_surface {
public:
  /// `local_metrics` (may be empty) renders more Prometheus lines for
  /// `/metrics`: this node's own HTTP surfaces, say.
  status_http(caf::actor_system& sys, caf::actor status, transport::http_server_options options,
              std::function<std::string()> local_metrics = {});
  ~status_http() override;

private:
  void handle(transport::server_request req,
              std::shared_ptr<transport::http_responder> out) override;
  std::function<std::string()> local_metrics_;
};

/// Prometheus lines for HTTP surfaces by name: open connections and
/// connections refused by each limit.
std::string http_surface_metrics(
  const std::vector<std::pair<std::string, transport::http_server_stats>>& surfaces);

/// `GET /pool` of the gateway: every replica's server_info and a summary.
std::string pool_json(const std::string& pool, const std::vector<replica_info>& replicas);

} // namespace stitch
