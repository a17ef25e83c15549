#include "actors/status.hpp"

#include "actors/credentials.hpp"
#include "actors/http_front.hpp"

#include <caf/all.hpp>

#include <chrono>
#include <cstdio>
#include <initializer_list>

#include <nlohmann/json.hpp>

namespace stitch {

namespace {

using self_ptr = status_actor::stateful_pointer<status_state>;
using ojson = nlohmann::ordered_json;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

ojson nullable(const std::optional<version_ref>& v) {
  return v ? ojson(to_string(*v)) : ojson(nullptr);
}

/// A Prometheus label value: backslash, quote and newline escaped.
std::string label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"')
      out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void write_histogram(std::string& out, const std::string& name, const std::string& help,
                     const histogram& h, const std::string& labels = {}) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  std::string sep = labels.empty() ? "" : ",";
  for (size_t i = 0; i < h.bounds.size() && i < h.counts.size(); ++i) {
    cumulative += h.counts[i];
    out += name + "_bucket{" + labels + sep + "le=\"" + number(h.bounds[i]) + "\"} "
           + std::to_string(cumulative) + "\n";
  }
  out += name + "_bucket{" + labels + sep + "le=\"+Inf\"} " + std::to_string(h.count) + "\n";
  std::string braces = labels.empty() ? "" : "{" + labels + "}";
  out += name + "_sum" + braces + " " + number(h.sum) + "\n";
  out += name + "_count" + braces + " " + std::to_string(h.count) + "\n";
}

void on_state(self_ptr self, replica_info info) {
  auto& st = self->state;
  auto it = st.replicas.find(caf::actor_cast<caf::actor_addr>(self->current_sender()));
  if (it == st.replicas.end())
    return;
  auto& e = it->second;
  int64_t now = now_ms();
  bool moved = !e.known || e.info.serving != info.serving || e.info.run_id() != info.run_id();
  bool activated = e.known && info.metrics.activations_total > e.info.metrics.activations_total;
  if (moved && info.serving) {
    e.history.emplace_back(now, static_cast<int64_t>(*info.serving));
    while (e.history.size() > st.opts.history)
      e.history.pop_front();
  }
  if (activated) {
    st.stage_seconds.observe(info.metrics.last_stage_s);
    st.pause_seconds.observe(info.metrics.last_pause_us / 1e6);
    st.recent.push_back({info.replica_id, info.applied ? to_string(*info.applied) : std::string{},
                         info.metrics.last_stage_s, info.metrics.last_pause_us,
                         info.metrics.last_drain_ms, info.metrics.last_folded, now});
    while (st.recent.size() > 50)
      st.recent.pop_front();
  }
  e.info = std::move(info);
  e.known = true;
  e.updated_ms = now;
}

ojson step_json(const step_report& s) {
  ojson j;
  j["step"] = s.step;
  j["version"] = s.version;
  j["reward"] = s.reward;
  j["samples"] = s.samples;
  j["staleness_mean"] = s.staleness_mean;
  j["staleness_max"] = s.staleness_max;
  j["pause_us"] = s.pause_us;
  j["constraint_violations"] = s.constraint_violations;
  return j;
}

ojson cluster_ojson(const cluster_view& c) {
  ojson out;
  out["nodes"] = ojson::array();
  for (const auto& n : c.nodes) {
    ojson j;
    j["name"] = n.name;
    j["roles"] = n.roles;
    j["slots"] = n.slots;
    if (!n.gateway.empty())
      j["gateway"] = n.gateway;
    if (n.last_heartbeat_ms)
      j["last_heartbeat_ms"] = *n.last_heartbeat_ms;
    if (!n.mesh.empty())
      j["mesh"] = n.mesh;
    out["nodes"].push_back(std::move(j));
  }
  out["experiments"] = ojson::array();
  for (const auto& e : c.experiments) {
    ojson j;
    j["run_id"] = e.run_id;
    j["pool"] = e.pool;
    j["replicas_wanted"] = e.replicas_wanted;
    j["commit_mode"] = e.commit_mode;
    j["replicas"] = ojson::array();
    for (const auto& r : e.replicas) {
      ojson x{{"replica_id", r.replica_id}, {"node", r.node}, {"slot", r.slot}, {"up", r.up}};
      if (r.known) {
        x["ready"] = r.ready;
        x["applied"] = nullable(r.applied);
        x["sync_state"] = std::string{to_string(r.state)};
      }
      j["replicas"].push_back(std::move(x));
    }
    j["trainer_node"] = e.trainer_node;
    j["shortfall"] = e.shortfall;
    if (e.last_step)
      j["last_step"] = step_json(*e.last_step);
    j["trainer_outcome"] = e.trainer_outcome;
    out["experiments"].push_back(std::move(j));
  }
  out["directory"] = ojson::object();
  for (const auto& h : c.directory)
    out["directory"][h.pool + "/" + to_string(h.version)] = h.nodes;
  return out;
}

} // namespace

std::string cluster_json(const cluster_view& c) {
  return cluster_ojson(c).dump(-1, ' ', false, ojson::error_handler_t::replace);
}

status_snapshot snapshot_of(const status_state& st) {
  status_snapshot s;
  s.generated_at_ms = now_ms();
  s.node = st.opts.node;
  s.roles = st.opts.roles;
  for (const auto& [role, addr] : st.opts.listening)
    s.listening.push_back({role, addr});
  s.up_since_ms = st.started_ms;
  s.cluster_transport = st.opts.cluster_transport;
  s.cluster = st.cluster;
  s.pointers = st.pointers;
  for (const auto& [addr, e] : st.replicas) {
    if (!e.known)
      continue;
    status_replica r{e.pool, e.info, e.updated_ms, {}};
    for (const auto& [t, v] : e.history)
      r.history.push_back({t, v});
    s.replicas.push_back(std::move(r));
  }
  s.recent.assign(st.recent.rbegin(), st.recent.rend());
  return s;
}

std::string status_json(const status_snapshot& s) {
  ojson j;
  j["generated_at_ms"] = s.generated_at_ms;
  ojson node;
  node["name"] = s.node;
  node["roles"] = s.roles;
  ojson listening = ojson::object();
  for (const auto& l : s.listening)
    listening[l.role] = l.address;
  node["listening"] = std::move(listening);
  node["up_since_ms"] = s.up_since_ms;
  node["cluster_transport"] = s.cluster_transport;
  j["nodes"] = ojson::array({std::move(node)});
  // The cluster's other members and its experiments, as the coordinator
  // last told them.
  j["experiments"] = ojson::array();
  if (s.cluster) {
    auto cluster = cluster_ojson(*s.cluster);
    for (auto& n : cluster["nodes"])
      if (n.value("name", "") != s.node)
        j["nodes"].push_back(std::move(n));
    j["experiments"] = std::move(cluster["experiments"]);
  }
  ojson pools = ojson::array();
  ojson runs = ojson::array();
  for (const auto& [pool, p] : s.pointers) {
    ojson e;
    e["pool"] = pool;
    e["pointer"] = to_string(p.latest);
    e["run_id"] = p.latest.run_id;
    e["version"] = p.latest.version;
    e["boot_version"] = p.boot_version;
    pools.push_back(e);
    ojson r;
    r["run_id"] = p.latest.run_id;
    r["pool"] = pool;
    r["latest_version"] = p.latest.version;
    r["boot_version"] = p.boot_version;
    runs.push_back(std::move(r));
  }
  j["pools"] = std::move(pools);
  j["runs"] = std::move(runs);
  ojson replicas = ojson::array();
  ojson transfers = ojson::array();
  for (const auto& e : s.replicas) {
    const auto& i = e.info;
    // Every server_info field (DESIGN §5), then what only the status keeps.
    ojson r = ojson::parse(server_info_json(i));
    r["pool"] = e.pool;
    ojson last;
    last["stage_s"] = i.metrics.last_stage_s;
    last["pause_us"] = i.metrics.last_pause_us;
    last["drain_ms"] = i.metrics.last_drain_ms;
    last["folded_versions"] = i.metrics.last_folded;
    // The bytes its last version cost on the wire, beside what it stores.
    last["peer_bytes"] = i.last_fetch.peer_delta_bytes + i.last_fetch.peer_full_bytes;
    last["peer_delta_bytes"] = i.last_fetch.peer_delta_bytes;
    last["store_bytes"] = i.last_fetch.from_store;
    last["stored_bytes"] = i.last_fetch.stored_bytes;
    r["last_update"] = std::move(last);
    r["updated_ms"] = e.updated_ms;
    ojson history = ojson::array();
    for (const auto& point : e.history)
      history.push_back(ojson::array({point.at_ms, point.version}));
    r["history"] = std::move(history);
    replicas.push_back(std::move(r));
    if (i.state == sync_state::fetching || i.state == sync_state::staging
        || i.state == sync_state::committing) {
      ojson t;
      t["replica_id"] = i.replica_id;
      t["from"] = nullable(i.applied);
      t["to"] = nullable(i.pointer);
      t["state"] = std::string{to_string(i.state)};
      t["source"] = i.transport.starts_with("ucx") ? "peers, then store" : "store";
      transfers.push_back(std::move(t));
    }
  }
  j["replicas"] = std::move(replicas);
  j["transfers"] = std::move(transfers);
  ojson recent = ojson::array();
  for (const auto& update : s.recent) {
    ojson u;
    u["replica_id"] = update.replica;
    u["version"] = update.version;
    u["stage_s"] = update.stage_s;
    u["pause_us"] = update.pause_us;
    u["drain_ms"] = update.drain_ms;
    u["folded_versions"] = update.folded;
    u["at_ms"] = update.at_ms;
    recent.push_back(std::move(u));
  }
  j["recent_updates"] = std::move(recent);
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string prometheus_text(const status_state& st, const std::vector<gateway_stats>& gateways) {
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    out += std::string{"# HELP "} + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  family("stitch_pool_pointer_version", "gauge", "The version the pool's pointer names.");
  for (const auto& [pool, p] : st.pointers)
    out += "stitch_pool_pointer_version{pool=\"" + label(pool) + "\",run_id=\""
           + label(p.latest.run_id) + "\"} " + std::to_string(p.latest.version) + "\n";
  struct counter {
    const char* name;
    const char* help;
    uint64_t replica_metrics::*field;
  };
  static const counter counters[] = {
    {"stitch_replica_activations_total", "Activations (commits) of new weights.",
     &replica_metrics::activations_total},
    {"stitch_replica_folded_versions_total", "Versions folded into activations.",
     &replica_metrics::folded_versions_total},
    {"stitch_replica_skipped_activations_total", "Version advances that needed no activation.",
     &replica_metrics::skipped_activations_total},
    {"stitch_replica_stage_failures_total", "Staging attempts that failed.",
     &replica_metrics::stage_failures_total},
    {"stitch_replica_activation_failures_total", "Activations that failed.",
     &replica_metrics::activation_failures_total},
    {"stitch_replica_checksum_failures_total", "Staged tensors whose checksum did not match.",
     &replica_metrics::checksum_failures_total},
    {"stitch_replica_rebuilds_total", "Engines rebuilt after a failure.",
     &replica_metrics::rebuilds_total},
    {"stitch_replica_bytes_fetched_total", "Tensor bytes fetched for staging.",
     &replica_metrics::bytes_fetched_total},
    {"stitch_replica_bytes_from_peers_total", "Verified tensor bytes fetched from peers.",
     &replica_metrics::bytes_from_peers_total},
    {"stitch_replica_requests_admitted_total", "Requests admitted.",
     &replica_metrics::requests_admitted_total},
    {"stitch_replica_requests_rejected_total", "Requests answered 409.",
     &replica_metrics::requests_rejected_total},
    {"stitch_replica_requests_completed_total", "Requests completed with stamps.",
     &replica_metrics::requests_completed_total},
    {"stitch_replica_drain_timeouts_total", "Drains that aborted requests.",
     &replica_metrics::drain_timeouts_total},
  };
  auto labels_of = [](const status_state::replica_entry& e) {
    return "replica=\"" + label(e.info.replica_id) + "\",pool=\"" + label(e.pool) + "\"";
  };
  family("stitch_replica_applied_version", "gauge", "The version the replica serves.");
  for (const auto& [a, e] : st.replicas)
    if (e.known && e.info.serving)
      out += "stitch_replica_applied_version{" + labels_of(e) + ",run_id=\""
             + label(e.info.run_id()) + "\"} " + std::to_string(*e.info.serving) + "\n";
  family("stitch_replica_ready", "gauge", "1 when the replica admits requests.");
  for (const auto& [a, e] : st.replicas)
    if (e.known)
      out += "stitch_replica_ready{" + labels_of(e) + "} " + (e.info.ready ? "1" : "0") + "\n";
  family("stitch_replica_active_requests", "gauge", "Requests in flight at the replica.");
  for (const auto& [a, e] : st.replicas)
    if (e.known)
      out += "stitch_replica_active_requests{" + labels_of(e) + "} "
             + std::to_string(e.info.active_requests) + "\n";
  for (const auto& c : counters) {
    family(c.name, "counter", c.help);
    for (const auto& [a, e] : st.replicas)
      if (e.known)
        out += std::string{c.name} + "{" + labels_of(e) + "} "
               + std::to_string(e.info.metrics.*(c.field)) + "\n";
  }
  family("stitch_replica_transfer_bytes_total", "counter",
         "Verified tensor bytes a replica received, by source: peers (UCX) or the store.");
  for (const auto& [a, e] : st.replicas)
    if (e.known) {
      const auto& m = e.info.metrics;
      out += "stitch_replica_transfer_bytes_total{" + labels_of(e) + ",source=\"peers\"} "
             + std::to_string(m.bytes_from_peers_total) + "\n";
      out += "stitch_replica_transfer_bytes_total{" + labels_of(e) + ",source=\"store\"} "
             + std::to_string(m.bytes_from_store_total) + "\n";
    }
  family("stitch_replica_peer_bytes_total", "counter",
         "Verified bytes a replica fetched from peers, by kind: delta frames or whole tensors.");
  for (const auto& [a, e] : st.replicas)
    if (e.known) {
      const auto& m = e.info.metrics;
      out += "stitch_replica_peer_bytes_total{" + labels_of(e) + ",kind=\"delta\"} "
             + std::to_string(m.delta_bytes_from_peers_total) + "\n";
      out += "stitch_replica_peer_bytes_total{" + labels_of(e) + ",kind=\"full\"} "
             + std::to_string(m.bytes_from_peers_total - m.delta_bytes_from_peers_total) + "\n";
    }
  auto device_labels = [&](const status_state::replica_entry& e) {
    return labels_of(e) + ",device=\"" + label(e.info.device.device) + "\"";
  };
  struct device_family {
    const char* name;
    const char* type;
    const char* help;
    std::string (*value)(const engine_device_usage&);
  };
  for (const auto& f : std::initializer_list<device_family>{
         {"stitch_replica_device_memory_bytes", "gauge",
          "Device memory the replica's engine holds (0 on the CPU).",
          [](const engine_device_usage& d) { return std::to_string(d.memory_used); }},
         {"stitch_replica_device_staged_bytes_total", "counter",
          "Bytes the replica's stages moved to its device and applied there.",
          [](const engine_device_usage& d) { return std::to_string(d.staged_bytes_total); }},
         {"stitch_replica_device_staging_seconds_total", "counter",
          "Seconds the replica's device staging pipeline was busy.",
          [](const engine_device_usage& d) { return std::to_string(d.staging_seconds_total); }},
         {"stitch_replica_host_recycled_kept_bytes", "gauge",
          "Host buffers of released versions the replica's process keeps for the next ones.",
          [](const engine_device_usage& d) { return std::to_string(d.host_recycled_kept_bytes); }},
         {"stitch_replica_host_recycled_bytes_total", "counter",
          "Bytes of host allocations served by kept buffers instead of fresh memory.",
          [](const engine_device_usage& d) {
            return std::to_string(d.host_recycled_bytes_total);
          }}}) {
    family(f.name, f.type, f.help);
    for (const auto& [a, e] : st.replicas)
      if (e.known)
        out += std::string{f.name} + "{" + device_labels(e) + "} " + f.value(e.info.device) + "\n";
  }
  write_histogram(out, "stitch_stage_seconds", "Time to stage an update while serving.",
                  st.stage_seconds);
  write_histogram(out, "stitch_activation_pause_seconds",
                  "Time the engine was stopped by an activation.", st.pause_seconds);
  family("stitch_gateway_responses_total", "counter", "Gateway answers by HTTP status.");
  for (size_t g = 0; g < gateways.size(); ++g)
    for (size_t i = 0; i < gateways[g].codes.size() && i < gateways[g].code_counts.size(); ++i)
      out += "stitch_gateway_responses_total{gateway=\"" + std::to_string(g) + "\",code=\""
             + std::to_string(gateways[g].codes[i]) + "\"} "
             + std::to_string(gateways[g].code_counts[i]) + "\n";
  family("stitch_gateway_retries_total", "counter", "Requests retried on another replica.");
  for (size_t g = 0; g < gateways.size(); ++g)
    out += "stitch_gateway_retries_total{gateway=\"" + std::to_string(g) + "\"} "
           + std::to_string(gateways[g].retries_total) + "\n";
  family("stitch_served_staleness_last_versions", "gauge",
         "Pointer version minus the start stamp of the last served sample.");
  for (size_t g = 0; g < gateways.size(); ++g)
    if (gateways[g].last_staleness >= 0)
      out += "stitch_served_staleness_last_versions{gateway=\"" + std::to_string(g) + "\"} "
             + number(gateways[g].last_staleness) + "\n";
  for (size_t g = 0; g < gateways.size(); ++g) {
    std::string l = "gateway=\"" + std::to_string(g) + "\"";
    write_histogram(out, "stitch_request_duration_seconds",
                    "Gateway request latency, routing and retries included.",
                    gateways[g].latency_seconds, l);
    write_histogram(out, "stitch_served_staleness_versions",
                    "Pointer version minus the start stamp of served samples.",
                    gateways[g].staleness_versions, l);
  }
  return out;
}

namespace {

/// Follows a pool's pointer: a first read (the subscription to every pool's
/// moves brings the rest).
void watch_pool(status_actor::stateful_pointer<status_state> self, const std::string& pool) {
  auto& st = self->state;
  st.watched.insert(pool);
  if (!st.store)
    return;
  self->request(st.store, std::chrono::seconds{30}, atom::read_pointer_v, pool)
    .then(
      [self, pool](const caf::optional<pointer_record>& r) {
        // A move heard meanwhile is newer than this read.
        if (r && !self->state.pointers.contains(pool))
          self->state.pointers[pool] = *r;
      },
      [](caf::error&) {});
}

} // namespace

status_actor::behavior_type status_service(status_actor::stateful_pointer<status_state> self,
                                           status_options opts, store_actor store) {
  auto& st = self->state;
  st.opts = std::move(opts);
  st.store = store;
  st.started_ms = now_ms();
  st.stage_seconds =
    histogram::with_bounds({0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300});
  st.pause_seconds =
    histogram::with_bounds({1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.1, 1});
  self->set_down_handler([self](const caf::down_msg& down) {
    self->state.replicas.erase(down.source);
    std::erase_if(self->state.gateways,
                  [&](const gateway_actor& g) { return g.address() == down.source; });
  });
  for (const auto& pool : st.opts.pools)
    watch_pool(self, pool);
  if (st.store) {
    // Every pool, those without replicas (a publisher's alone) included:
    // the pools the store holds now, then every pointer move.
    self->send(st.store, atom::subscribe_v, std::string{},
               caf::actor_cast<pointer_listener_actor>(self));
    self->request(st.store, std::chrono::seconds{30}, atom::list_pools_v, std::string{})
      .then(
        [self](const std::vector<std::string>& pools) {
          for (const auto& pool : pools)
            if (!self->state.watched.contains(pool))
              watch_pool(self, pool);
        },
        [](caf::error&) {});
  }
  return {
    [self](atom::enroll, const std::string& pool, const replica_actor& r, const std::string& cap) {
      auto& replicas = self->state.replicas;
      if (!r
          || !member_admits("status", self->state.opts.member_token, cap,
                            "enrolling a replica of pool '" + pool + "'"))
        return;
      if (auto known = replicas.find(r.address()); known != replicas.end()) {
        // Enrolled again by a restarted coordinator: a fresh proxy replaces
        // the one whose route went with the coordinator's node.
        if (caf::actor_cast<caf::abstract_actor*>(known->second.handle)
            != caf::actor_cast<caf::abstract_actor*>(r)) {
          known->second.handle = r;
          self->monitor(r);
          self->send(r, atom::subscribe_v, caf::actor_cast<replica_watcher_actor>(self));
        }
        return;
      }
      status_state::replica_entry e;
      e.handle = r;
      e.pool = pool;
      replicas.emplace(r.address(), std::move(e));
      if (!self->state.watched.contains(pool))
        watch_pool(self, pool);
      self->monitor(r);
      self->send(r, atom::subscribe_v, caf::actor_cast<replica_watcher_actor>(self));
    },
    [self](atom::enroll, const gateway_actor& g, const std::string& cap) {
      if (!g || !member_admits("status", self->state.opts.member_token, cap, "enrolling a gateway"))
        return;
      self->monitor(g);
      self->state.gateways.push_back(g);
    },
    [self](atom::replica_state, replica_info& info) { on_state(self, std::move(info)); },
    [self](atom::pointer_moved, const std::string& pool, const pointer_record& p) {
      self->state.watched.insert(pool);
      self->state.pointers[pool] = p;
    },
    [self](atom::cluster_view, cluster_view& view, const std::string& cap) {
      if (member_admits("status", self->state.opts.member_token, cap, "a cluster view"))
        self->state.cluster = std::move(view);
    },
    [self](atom::status_view) { return snapshot_of(self->state); },
    [self](atom::metrics) -> caf::result<std::string> {
      auto& now = self->state;
      if (now.gateways.empty())
        return prometheus_text(now, {});
      auto promise = self->make_response_promise<std::string>();
      auto collected = std::make_shared<std::vector<gateway_stats>>();
      auto left = std::make_shared<size_t>(now.gateways.size());
      for (const auto& g : now.gateways)
        self->request(g, std::chrono::seconds{5}, atom::stats_v)
          .then(
            [self, promise, collected, left](gateway_stats& s) mutable {
              collected->push_back(std::move(s));
              if (--*left == 0)
                promise.deliver(prometheus_text(self->state, *collected));
            },
            [self, promise, collected, left](caf::error&) mutable {
              if (--*left == 0)
                promise.deliver(prometheus_text(self->state, *collected));
            });
      return promise;
    },
  };
}

} // namespace stitch
