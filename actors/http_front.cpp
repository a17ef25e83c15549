#include "actors/http_front.hpp"

#include <caf/all.hpp>

#include "actors/request_lane.hpp"
#include "actors/status.hpp"

#include <nlohmann/json.hpp>

#include <map>

namespace stitch {

using transport::http_responder;
using transport::server_response;

std::string server_info_json(const replica_info& i) {
  nlohmann::ordered_json j;
  j["replica_id"] = i.replica_id;
  j["pool"] = i.pool;
  j["ready"] = i.ready;
  auto text = [](const auto& x) {
    return x ? nlohmann::ordered_json(to_string(*x)) : nlohmann::ordered_json(nullptr);
  };
  j["applied"] = text(i.applied);
  j["applied_version"] =
    i.serving ? nlohmann::ordered_json(*i.serving) : nlohmann::ordered_json(nullptr);
  j["run_id"] =
    i.applied ? nlohmann::ordered_json(i.applied->run_id) : nlohmann::ordered_json(nullptr);
  j["pointer"] = text(i.pointer);
  j["sync_state"] = std::string{to_string(i.state)};
  j["reason"] = i.reason;
  j["terminal_error"] =
    i.terminal_error ? nlohmann::ordered_json(*i.terminal_error) : nlohmann::ordered_json(nullptr);
  j["commit_mode"] = std::string{to_string(i.mode)};
  j["active_requests"] = i.active_requests;
  j["queued_requests"] = i.queued_requests;
  const auto& m = i.metrics;
  nlohmann::ordered_json mj;
  mj["stage_s"] = m.last_stage_s;
  mj["drain_ms"] = m.last_drain_ms;
  mj["pause_us"] = m.last_pause_us;
  mj["max_pause_us"] = m.max_pause_us;
  mj["folded_versions"] = m.last_folded;
  mj["folded_versions_total"] = m.folded_versions_total;
  mj["activations_total"] = m.activations_total;
  mj["skipped_activations_total"] = m.skipped_activations_total;
  mj["stages_total"] = m.stages_total;
  mj["stage_failures_total"] = m.stage_failures_total;
  mj["activation_failures_total"] = m.activation_failures_total;
  mj["checksum_failures_total"] = m.checksum_failures_total;
  mj["rebuilds_total"] = m.rebuilds_total;
  mj["bytes_fetched_total"] = m.bytes_fetched_total;
  mj["bytes_from_peers_total"] = m.bytes_from_peers_total;
  mj["delta_bytes_from_peers_total"] = m.delta_bytes_from_peers_total;
  mj["bytes_from_store_total"] = m.bytes_from_store_total;
  mj["requests_admitted_total"] = m.requests_admitted_total;
  mj["requests_rejected_total"] = m.requests_rejected_total;
  mj["requests_completed_total"] = m.requests_completed_total;
  mj["drain_timeouts_total"] = m.drain_timeouts_total;
  j["metrics"] = std::move(mj);
  j["transport"] = i.transport;
  j["weight_version_spans"] = i.version_spans;
  j["engine"] = {{"status", i.engine}, {"healthy", i.engine_healthy}};
  const auto& d = i.device;
  j["device"] = {{"device", d.device},
                 {"name", d.name},
                 {"memory_used_bytes", d.memory_used},
                 {"memory_total_bytes", d.memory_total},
                 {"staged_bytes_total", d.staged_bytes_total},
                 {"staging_seconds_total", d.staging_seconds_total},
                 {"staging_bytes_per_second",
                  d.staging_seconds_total > 0
                    ? static_cast<double>(d.staged_bytes_total) / d.staging_seconds_total
                    : 0.0},
                 {"host_recycled_kept_bytes", d.host_recycled_kept_bytes},
                 {"host_recycled_bytes_total", d.host_recycled_bytes_total}};
  nlohmann::ordered_json fetch;
  const auto& f = i.last_fetch;
  fetch["version"] =
    f.version ? nlohmann::ordered_json(to_string(*f.version)) : nlohmann::ordered_json(nullptr);
  nlohmann::ordered_json peers = nlohmann::ordered_json::object();
  for (const auto& [source, n] : f.from_peers)
    peers[source] = n;
  fetch["from_peers"] = std::move(peers);
  fetch["peer_bytes"] = {{"delta", f.peer_delta_bytes}, {"full", f.peer_full_bytes}};
  fetch["stored_bytes"] = f.stored_bytes;
  fetch["from_store"] = f.from_store;
  fetch["seconds"] = f.seconds;
  fetch["fetch_s"] = f.fetch_s;
  fetch["decode_s"] = f.decode_s;
  fetch["verify_s"] = f.verify_s;
  fetch["problems"] = f.problems;
  j["last_fetch"] = std::move(fetch);
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void deliver(const replica_answer& a, http_responder& out, bool streaming) {
  transport::http_headers headers;
  if (!a.replica_id.empty())
    headers.push_back({"X-Stitch-Replica", a.replica_id});
  if (a.stream && a.status == 200) {
    if (!streaming)
      out.start_events(headers);
    out.event(a.body);
    out.end_events(true);
    return;
  }
  if (streaming) {
    // The stream already began: the error becomes its last event.
    out.event(a.body);
    out.end_events(false);
    return;
  }
  server_response r;
  r.status = a.status;
  r.content_type = a.content_type.empty() ? "application/json" : a.content_type;
  r.body = a.body;
  r.headers = std::move(headers);
  if (a.retry_after > 0)
    r.headers.push_back({"Retry-After", std::to_string(a.retry_after)});
  out.send(std::move(r));
}

void relay_call(caf::actor_system& sys, const caf::actor& target, caf::message msg, uint64_t key,
                std::shared_ptr<http_responder> out) {
  sys.spawn([target, msg = std::move(msg), key,
             out = std::move(out)](caf::event_based_actor* self) mutable -> caf::behavior {
    auto streaming = std::make_shared<bool>(false);
    // The gateway knows requests by (client actor, key): cancel as this actor.
    out->on_disconnect([target, key, me = self->address()] {
      if (auto h = caf::actor_cast<caf::actor>(me))
        caf::send_as(h, target, atom::cancel_v, key);
      else
        caf::anon_send(target, atom::cancel_v, key);
    });
    self->request(target, caf::infinite, std::move(msg))
      .then(
        [self, out, streaming](replica_answer& a) {
          deliver(a, *out, *streaming);
          self->quit();
        },
        [self, out, streaming](caf::error& err) {
          auto a =
            answer_of(make_http_error(http_failure::unavailable,
                                      "the replica did not answer: " + self->system().render(err)));
          deliver(a, *out, *streaming);
          self->quit();
        });
    return {[out, streaming](atom::event, uint64_t, std::string& ev) {
      if (!*streaming) {
        out->start_events({});
        *streaming = true;
      }
      out->event(std::move(ev));
    }};
  });
}

namespace {

/// The replica call of a routed request (the key is set by the caller).
replica_call call_of(transport::routed::versioned& d) {
  replica_call call;
  call.route = d.route;
  call.body = std::move(d.body);
  call.c = d.c;
  return call;
}

constraint versioned_constraint(const transport::routed::versioned& d) {
  return d.c;
}

constraint versioned_constraint(const transport::routed::passthrough&) {
  return {};
}

replica_call call_of(transport::routed::passthrough& d) {
  replica_call call;
  call.method = d.method;
  call.route = d.route;
  call.body = std::move(d.body);
  return call;
}

/// Asks `target` one question and answers the client with `render(reply)`,
/// or 503 when the actor does not answer.
template <class Reply, class Render, class... Ts>
void ask(caf::actor_system& sys, const caf::actor& target, std::shared_ptr<http_responder> out,
         Render render, Ts... xs) {
  sys.spawn([target, out = std::move(out), render = std::move(render),
             msg = caf::make_message(std::move(xs)...)](caf::event_based_actor* self) {
    self->request(target, std::chrono::seconds{10}, msg)
      .then(
        [self, out, render](Reply& reply) {
          out->send(render(reply));
          self->quit();
        },
        [self, out](caf::error& err) {
          out->send(transport::error_response(
            http_failure::unavailable, "the actor did not answer: " + self->system().render(err)));
          self->quit();
        });
  });
}

} // namespace

http_surface::http_surface(caf::actor_system& sys, caf::actor target,
                           transport::http_server_options server_options)
    : sys_(sys), target_(std::move(target)), server_options_(server_options) {}

http_surface::~http_surface() = default;

result<uint16_t> http_surface::listen(const std::string& host, uint16_t port) {
  server_ = std::make_unique<transport::http_server>(
    server_options_, [this](transport::server_request req, std::shared_ptr<http_responder> out) {
      handle(std::move(req), std::move(out));
    });
  return server_->listen(host, port);
}

void http_surface::stop() {
  if (server_)
    server_->stop();
}

transport::http_server_stats http_surface::stats() const {
  return server_ ? server_->stats() : transport::http_server_stats{};
}

std::string http_surface_metrics(
  const std::vector<std::pair<std::string, transport::http_server_stats>>& surfaces) {
  if (surfaces.empty())
    return {};
  std::string out;
  out += "# HELP stitch_http_connections Open HTTP connections of each surface of this node.\n";
  out += "# TYPE stitch_http_connections gauge\n";
  for (const auto& [name, st] : surfaces)
    out += "stitch_http_connections{surface=\"" + name + "\"} "
           + std::to_string(st.open_connections) + "\n";
  out += "# HELP stitch_http_refused_connections_total Connections answered 503 over a limit "
         "(http.max_connections, http.max_connections_per_client).\n";
  out += "# TYPE stitch_http_refused_connections_total counter\n";
  for (const auto& [name, st] : surfaces) {
    out += "stitch_http_refused_connections_total{surface=\"" + name
           + "\",limit=\"max_connections\"} " + std::to_string(st.refused_max_connections) + "\n";
    out += "stitch_http_refused_connections_total{surface=\"" + name + "\",limit=\"per_client\"} "
           + std::to_string(st.refused_per_client) + "\n";
  }
  // One gauge or counter per surface, from a field of its stats.
  auto per_surface = [&](std::string_view name, std::string_view type, std::string_view help,
                         uint64_t transport::http_server_stats::*field) {
    out += "# HELP " + std::string{name} + " " + std::string{help} + "\n";
    out += "# TYPE " + std::string{name} + " " + std::string{type} + "\n";
    for (const auto& [surface, st] : surfaces)
      out +=
        std::string{name} + "{surface=\"" + surface + "\"} " + std::to_string(st.*field) + "\n";
  };
  per_surface("stitch_http_refused_bodies_total", "counter",
              "Requests answered 503 because their body would pass http.body_budget.",
              &transport::http_server_stats::refused_body_budget);
  per_surface("stitch_http_receiving_body_bytes", "gauge",
              "Bytes announced by the request bodies each surface is receiving (counted against "
              "http.body_budget).",
              &transport::http_server_stats::bodies_receiving);
  return out;
}

replica_http::replica_http(caf::actor_system& sys, caf::actor replica, replica_http_options options)
    : http_surface(sys, std::move(replica), options.server), router_(std::move(options.router)),
      lane_(std::move(options.lane)) {}

replica_http::~replica_http() {
  stop();
}

void replica_http::handle(transport::server_request req, std::shared_ptr<http_responder> out) {
  auto decision = transport::route_request(transport::surface::replica, req, router_);
  auto target = target_;
  std::visit(
    [&](auto& d) {
      using T = std::decay_t<decltype(d)>;
      if constexpr (std::is_same_v<T, transport::routed::refuse>) {
        out->send(std::move(d.response));
      } else if constexpr (std::is_same_v<
                             T, transport::routed::
                                  versioned> || std::is_same_v<T, transport::routed::passthrough>) {
        if (lane_ && lane_->ready()) {
          constexpr bool versioned = std::is_same_v<T, transport::routed::versioned>;
          std::string method;
          if constexpr (versioned)
            method = "POST";
          else
            method = d.method;
          lane_->submit(versioned ? request_kind::versioned : request_kind::passthrough,
                        versioned_constraint(d), std::move(method), std::move(d.route),
                        std::move(d.body), std::move(out));
          return;
        }
        replica_call call = call_of(d);
        call.key = next_key_++;
        auto key = call.key;
        relay_call(sys_, target, caf::make_message(atom::generate_v, std::move(call)), key,
                   std::move(out));
      } else if constexpr (std::is_same_v<T, transport::routed::wake>) {
        caf::anon_send(target, atom::wake_v);
        server_response r;
        r.body = R"({"ok":true})";
        out->send(std::move(r));
      } else if constexpr (std::is_same_v<
                             T, transport::routed::
                                  health> || std::is_same_v<T, transport::routed::server_info>) {
        constexpr bool health = std::is_same_v<T, transport::routed::health>;
        ask<replica_info>(
          sys_, target, std::move(out),
          [](const replica_info& info) {
            server_response r;
            if constexpr (health) {
              nlohmann::ordered_json j;
              j["ready"] = info.ready;
              j["reason"] = info.reason;
              j["applied"] = info.applied ? nlohmann::ordered_json(to_string(*info.applied))
                                          : nlohmann::ordered_json(nullptr);
              r.status = info.ready ? 200 : 503;
              if (!info.ready)
                r.headers.push_back({"Retry-After", "1"});
              r.body = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
            } else {
              r.body = server_info_json(info);
            }
            return r;
          },
          atom::server_info_v);
      } else {
        out->send(transport::error_response(http_failure::not_found, "no such route on a replica"));
      }
    },
    decision);
}

std::string pool_json(const std::string& pool, const std::vector<replica_info>& replicas) {
  nlohmann::ordered_json j;
  j["pool"] = pool;
  auto list = nlohmann::ordered_json::array();
  std::map<std::string, uint64_t> per_version;
  uint64_t ready = 0;
  for (const auto& r : replicas) {
    list.push_back(nlohmann::ordered_json::parse(server_info_json(r)));
    if (r.ready) {
      ++ready;
      ++per_version[r.applied ? to_string(*r.applied) : std::string{}];
    }
  }
  j["replicas"] = std::move(list);
  nlohmann::ordered_json summary;
  summary["replicas"] = replicas.size();
  summary["ready"] = ready;
  nlohmann::ordered_json versions = nlohmann::ordered_json::object();
  for (const auto& [v, n] : per_version)
    versions[v] = n;
  summary["versions"] = std::move(versions);
  j["summary"] = std::move(summary);
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

gateway_http::gateway_http(caf::actor_system& sys, caf::actor gateway, replica_http_options options)
    : http_surface(sys, std::move(gateway), options.server), router_(std::move(options.router)) {}

gateway_http::~gateway_http() {
  stop();
}

void gateway_http::handle(transport::server_request req, std::shared_ptr<http_responder> out) {
  auto decision = transport::route_request(transport::surface::gateway, req, router_);
  auto target = target_;
  auto relay = [&](std::string pool, std::string session, replica_call call) {
    call.key = next_key_++;
    auto key = call.key;
    relay_call(
      sys_, target,
      caf::make_message(atom::generate_v, std::move(pool), std::move(session), std::move(call)),
      key, std::move(out));
  };
  std::visit(
    [&](auto& d) {
      using T = std::decay_t<decltype(d)>;
      if constexpr (std::is_same_v<T, transport::routed::refuse>) {
        out->send(std::move(d.response));
      } else if constexpr (std::is_same_v<
                             T, transport::routed::
                                  versioned> || std::is_same_v<T, transport::routed::passthrough>) {
        relay(d.pool, d.session, call_of(d));
      } else if constexpr (std::is_same_v<T, transport::routed::wake>) {
        caf::anon_send(target, atom::wake_v, d.pool);
        server_response r;
        r.body = R"({"ok":true})";
        out->send(std::move(r));
      } else if constexpr (std::is_same_v<
                             T, transport::routed::
                                  health> || std::is_same_v<T, transport::routed::pool_view>) {
        constexpr bool health = std::is_same_v<T, transport::routed::health>;
        ask<std::vector<replica_info>>(
          sys_, target, std::move(out),
          [pool = d.pool](const std::vector<replica_info>& replicas) {
            server_response r;
            if constexpr (health) {
              uint64_t ready = 0;
              for (const auto& x : replicas)
                ready += x.ready ? 1 : 0;
              nlohmann::ordered_json j;
              j["ready"] = ready > 0;
              j["ready_replicas"] = ready;
              j["replicas"] = replicas.size();
              r.status = ready > 0 ? 200 : 503;
              if (ready == 0)
                r.headers.push_back({"Retry-After", "1"});
              r.body = j.dump();
            } else {
              r.body = pool_json(pool, replicas);
            }
            return r;
          },
          atom::pool_view_v, d.pool);
      } else {
        out->send(
          transport::error_response(http_failure::not_found, "no such route on the gateway"));
      }
    },
    decision);
}

status_http::status_http(caf::actor_system& sys, caf::actor status,
                         transport::http_server_options options,
                         std::function<std::string()> local_metrics)
    : http_surface(sys, std::move(status), options), local_metrics_(std::move(local_metrics)) {}

status_http::~status_http() {
  stop();
}

void status_http::handle(transport::server_request req, std::shared_ptr<http_responder> out) {
  if (req.path != "/" && req.path != "/status" && req.path != "/metrics" && req.path != "/health") {
    out->send(transport::error_response(http_failure::not_found,
                                        "the status surface serves /, /status, /metrics"));
    return;
  }
  if (req.method != "GET" && req.method != "HEAD") {
    auto r = transport::error_response(http_failure::method_not_allowed, req.path + " takes GET");
    r.headers.push_back({"Allow", "GET"});
    out->send(std::move(r));
    return;
  }
  if (req.path == "/" || req.path == "/health") {
    server_response r;
    if (req.path == "/") {
      r.content_type = "text/html; charset=utf-8";
      r.body = dashboard_html();
    } else {
      r.body = R"({"ok":true})";
    }
    out->send(std::move(r));
    return;
  }
  bool metrics = req.path == "/metrics";
  auto target = target_;
  auto render = [metrics, local = metrics ? local_metrics_ : nullptr](std::string& body) {
    server_response r;
    if (metrics)
      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = std::move(body);
    if (local)
      r.body += local();
    return r;
  };
  if (metrics) {
    ask<std::string>(sys_, target, std::move(out), render, atom::metrics_v);
  } else {
    ask<status_snapshot>(
      sys_, target, std::move(out),
      [render](const status_snapshot& s) {
        auto body = status_json(s);
        return render(body);
      },
      atom::status_view_v);
  }
}

} // namespace stitch
