#include "node/commands.hpp"

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/coordinator_actor.hpp"
#include "actors/hub_relay.hpp"
#include "actors/publisher_actor.hpp"
#include "actors/status.hpp"
#include "actors/status_actor.hpp"
#include "actors/store_client.hpp"
#include "config/experiment.hpp"
#include "node/http_publish.hpp"
#include "node/remote.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/engine/weights.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/materialize.hpp"
#include "runtime/pipeline/tensor_stream.hpp"

#include <deque>

namespace stitch::node {

std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

namespace {

constexpr auto request_timeout = std::chrono::minutes{10};

template <class T, class Handle, class... Ts>
result<T> ask(caf::actor_system& sys, const Handle& whom, Ts&&... xs) {
  return ask_actor<T>(sys, whom, request_timeout, std::forward<Ts>(xs)...);
}

result<caf::actor> lookup(caf::actor_system& sys, const host_port& where, const std::string& role) {
  auto coordinator = connect_coordinator(sys, where);
  if (!coordinator)
    return std::move(coordinator).error();
  return ask<caf::actor>(sys, *coordinator, atom::lookup_v, role);
}

/// A relay in this process through which requests to `target` (on the
/// node) go as the relay's own: when the node dies or the connection drops,
/// every request still out is answered at once with a retryable error (CAF
/// answers nothing across a lost connection: the CLI waited out its
/// timeout, 10 minutes for a publish, 2 for an export). Stopped with it.
struct owned_link {
  caf::actor relay;
  owned_link(caf::actor_system& sys, std::string role, caf::actor target)
      : relay(spawn_hub_relay(sys, owning_relay_options(std::move(role)), std::move(target))) {}
  owned_link(const owned_link&) = delete;
  owned_link& operator=(const owned_link&) = delete;
  ~owned_link() { caf::anon_send_exit(relay, caf::exit_reason::user_shutdown); }
};

/// A streamed publish sends chunks of `streamed_piece_bytes`, this many in
/// flight: what the node holds of this client.
constexpr size_t publish_chunk = streamed_piece_bytes;
constexpr size_t publish_window = 16;

result<pipeline::publish_report> stream_directory(caf::actor_system& sys,
                                                  const publisher_actor& publisher_node,
                                                  const publish_command& cmd) {
  auto source = pipeline::directory_stream::open(cmd.directory);
  if (!source)
    return std::move(source).error();
  const auto& tensors = (*source)->tensors();
  publish_args args = cmd.args;
  args.files = (*source)->files();
  // Every request goes through a link that owns it: the publisher watches
  // the link (one actor opens the session and feeds it) and aborts the
  // session the moment this process or its connection dies.
  owned_link link{sys, "publisher", caf::actor_cast<caf::actor>(publisher_node)};
  auto publisher = caf::actor_cast<publisher_actor>(link.relay);
  caf::scoped_actor self{sys};
  result<uint64_t> session = make_error(errc::engine_unavailable, "the publisher did not answer");
  self->request(publisher, caf::duration{request_timeout}, atom::publish_v, args, tensors)
    .receive([&](uint64_t id) { session = id; },
             [&](caf::error& err) { session = from_caf_error(sys, err); });
  if (!session)
    return std::move(session).error();
  using handle = decltype(self->request(publisher, caf::duration{request_timeout}, atom::chunk_v,
                                        uint64_t{}, shared_piece{}));
  std::deque<handle> in_flight;
  status outcome;
  auto land_one = [&] {
    in_flight.front().receive([](uint64_t) {},
                              [&](caf::error& err) {
                                if (outcome)
                                  outcome = from_caf_error(sys, err);
                              });
    in_flight.pop_front();
  };
  // Chunks run across tensor boundaries: the session reads one stream. Each
  // is read straight into a pooled buffer, which goes back to the pool once
  // the message carrying it was sent.
  piece_buffer chunk;
  size_t filled = 0;
  auto send = [&] {
    if (in_flight.size() >= publish_window)
      land_one();
    in_flight.push_back(self->request(publisher, caf::duration{request_timeout}, atom::chunk_v,
                                      *session, chunk.share(filled)));
    chunk = {};
    filled = 0;
  };
  for (size_t i = 0; i < tensors.size() && outcome; ++i) {
    for (uint64_t at = 0; at < tensors[i].size && outcome;) {
      if (!chunk.data) {
        auto fresh = take_piece_buffer(publish_chunk);
        if (!fresh) {
          outcome = std::move(fresh).error();
          break;
        }
        chunk = std::move(*fresh);
      }
      const size_t n =
        static_cast<size_t>(std::min<uint64_t>(publish_chunk - filled, tensors[i].size - at));
      if (auto ok =
            (*source)->read(i, at, std::as_writable_bytes(std::span{chunk.data + filled, n}));
          !ok)
        outcome = std::move(ok).error();
      filled += n;
      at += n;
      if (filled == publish_chunk)
        send();
    }
  }
  if (outcome && filled > 0)
    send();
  while (!in_flight.empty())
    land_one();
  if (!outcome) {
    caf::anon_send(publisher, atom::abort_v, *session);
    return std::move(outcome).error();
  }
  return ask<pipeline::publish_report>(sys, publisher, atom::finish_v, *session);
}

/// A streamed publish: over the publisher's HTTP surface when it has one
/// this process can reach (the bytes go from the files to the socket with
/// `sendfile`, and the node reads them into the buffers the publish
/// consumes: two copies instead of the five of a CAF message), else as CAF
/// messages. A dry run, and a cluster on TLS (the surface is plain HTTP),
/// stay on the cluster connection.
result<pipeline::publish_report> stream_publish(caf::actor_system& sys,
                                                const caf::actor& coordinator,
                                                const publisher_actor& publisher,
                                                const publish_command& cmd) {
  if (cmd.args.dry_run || tls_enabled(sys))
    return stream_directory(sys, publisher, cmd);
  auto advertised =
    ask_actor<std::string>(sys, publisher, std::chrono::seconds{30}, atom::server_info_v);
  if (!advertised)
    return std::move(advertised).error();
  auto at =
    http_surface_for(*advertised, cmd.coordinator.host, publisher.node() == coordinator.node());
  if (!at)
    return stream_directory(sys, publisher, cmd);
  auto source = pipeline::directory_stream::open(cmd.directory);
  if (!source)
    return std::move(source).error();
  publish_args args = cmd.args;
  args.files = (*source)->files();
  auto sent = publish_over_http(*at, args, **source);
  if (!sent.unreachable)
    return std::move(sent.summary);
  std::fprintf(stderr,
               "stitch publish: the publisher's HTTP surface is unreachable from here (%s); "
               "streaming through the cluster connection instead\n",
               sent.summary.error().message.c_str());
  return stream_directory(sys, publisher, cmd);
}

} // namespace

result<pipeline::publish_report> run_publish(caf::actor_system& sys, const publish_command& cmd,
                                             std::FILE* out) {
  auto coordinator = connect_coordinator(sys, cmd.coordinator);
  if (!coordinator)
    return std::move(coordinator).error();
  auto handle = ask<caf::actor>(sys, *coordinator, atom::lookup_v, std::string{"publisher"});
  if (!handle)
    return std::move(handle).error();
  auto publisher = caf::actor_cast<publisher_actor>(*handle);
  auto attempt = [&]() -> result<pipeline::publish_report> {
    if (!cmd.stream && is_loopback(cmd.coordinator.host)) {
      std::error_code ec;
      auto path = std::filesystem::absolute(cmd.directory, ec);
      return ask<pipeline::publish_report>(sys, publisher, atom::publish_v, cmd.args,
                                           path.string());
    }
    return stream_publish(sys, caf::actor_cast<caf::actor>(*coordinator), publisher, cmd);
  };
  // A busy publisher started nothing of this publish: ask again (its
  // `Retry-After` is a second) until the budget is spent.
  const auto give_up = std::chrono::steady_clock::now() + cmd.retry_budget;
  auto summary = attempt();
  while (!summary && summary.error().code == errc::busy
         && std::chrono::steady_clock::now() + std::chrono::seconds{1} <= give_up) {
    std::fprintf(stderr, "stitch publish: the publisher is busy (%s); asking again in 1 s\n",
                 summary.error().message.c_str());
    std::this_thread::sleep_for(std::chrono::seconds{1});
    summary = attempt();
  }
  if (!summary)
    return summary;
  const auto ref = to_string(version_ref{cmd.args.run_id, cmd.args.version});
  std::fprintf(
    out,
    "%s %s as a %s%s: %zu tensor(s) touched, %s of weights -> %s encoded -> %s "
    "stored\n",
    cmd.args.dry_run ? "would publish" : (summary->idempotent ? "already published" : "published"),
    ref.c_str(), std::string{to_string(summary->kind)}.c_str(),
    summary->reason_for_anchor.empty() ? "" : (" (" + summary->reason_for_anchor + ")").c_str(),
    summary->touched.size(), human_bytes(summary->raw_bytes).c_str(),
    human_bytes(summary->encoded_bytes).c_str(), human_bytes(summary->stored_bytes).c_str());
  if (cmd.args.dry_run) {
    constexpr size_t shown = 20;
    for (size_t i = 0; i < summary->touched.size() && i < shown; ++i)
      std::fprintf(out, "  touches %s\n", summary->touched[i].c_str());
    if (summary->touched.size() > shown)
      std::fprintf(out, "  ... and %zu more\n", summary->touched.size() - shown);
  }
  if (summary->pointer)
    std::fprintf(out, "pool '%s' now points at %s (boot %llu)\n", cmd.args.pool.c_str(),
                 to_string(summary->pointer->latest).c_str(),
                 static_cast<unsigned long long>(summary->pointer->boot_version));
  return summary;
}

status run_export(caf::actor_system& sys, const export_command& cmd, std::FILE* out) {
  auto ref = parse_required_version_ref(cmd.version);
  if (!ref)
    return std::move(ref).error();
  if (ref->run_id.empty())
    return make_error(errc::invalid_argument,
                      "--version needs a run: R/N or R/weight_v00000N, not '" + cmd.version + "'");
  auto handle = lookup(sys, cmd.coordinator, "store");
  if (!handle)
    return std::move(handle).error();
  owned_link link{sys, "store", *handle};
  remote_store store{sys, caf::actor_cast<store_actor>(link.relay)};
  std::string pool = cmd.pool;
  if (pool.empty()) {
    auto pools = store.pools_of(ref->run_id);
    if (!pools)
      return std::move(pools).error();
    if (pools->empty())
      return make_error(errc::not_found, "no pool holds run '" + ref->run_id + "'");
    if (pools->size() > 1) {
      std::string names;
      for (const auto& p : *pools)
        names += (names.empty() ? "" : ", ") + p;
      return make_error(errc::invalid_argument, "run '" + ref->run_id + "' is in several pools ("
                                                  + names + "); choose one with --pool");
    }
    pool = pools->front();
    std::fprintf(out, "run %s is in pool %s\n", ref->run_id.c_str(), pool.c_str());
  }
  bool written = false;
  if (!cmd.stream && is_loopback(cmd.coordinator.host)) {
    std::error_code ec;
    auto path = std::filesystem::absolute(cmd.out_dir, ec);
    auto local = store.export_to(pool, *ref, path.string(), cmd.sync, cmd.token);
    if (local)
      written = true;
    else if (local.error().code != errc::unauthorized)
      return local;
  }
  if (!written) {
    pipeline::export_options options;
    options.sync = cmd.sync;
    options.buffer_bytes = cmd.buffer_bytes;
    if (auto ok = pipeline::export_version(store, pool, *ref, cmd.out_dir, options); !ok)
      return ok;
  }
  std::fprintf(out, "exported %s of pool %s to %s\n", to_string(*ref).c_str(), pool.c_str(),
               cmd.out_dir.c_str());
  return {};
}

status run_gc(caf::actor_system& sys, const gc_command& cmd, std::FILE* out) {
  auto handle = lookup(sys, cmd.coordinator, "publisher");
  if (!handle)
    return std::move(handle).error();
  auto report = ask<retention_report>(sys, caf::actor_cast<publisher_actor>(*handle),
                                      atom::collect_v, cmd.pool, cmd.keep, cmd.dry_run, cmd.token);
  if (!report)
    return std::move(report).error();
  auto sorted = [](std::vector<retention_entry> v) {
    std::sort(v.begin(), v.end(),
              [](const retention_entry& a, const retention_entry& b) { return a.ref < b.ref; });
    return v;
  };
  auto removed = sorted(report->deleted);
  auto kept = sorted(report->kept);
  if (cmd.json) {
    nlohmann::ordered_json j;
    auto list = [](const std::vector<retention_entry>& v) {
      auto a = nlohmann::ordered_json::array();
      for (const auto& e : v) {
        nlohmann::ordered_json x;
        x["version"] = to_string(e.ref);
        x["why"] = to_string(e.why);
        if (e.why == keep_reason::chain)
          x["needed_by"] = e.needed_by;
        a.push_back(std::move(x));
      }
      return a;
    };
    j["dry_run"] = cmd.dry_run;
    j[cmd.dry_run ? "would_remove" : "removed"] = list(removed);
    j["kept"] = list(kept);
    std::fprintf(out, "%s\n", j.dump().c_str());
    return {};
  }
  const char* verb = cmd.dry_run ? "would remove" : "removed";
  for (const auto& e : removed)
    std::fprintf(out, "%s %s\n", verb, to_string(e.ref).c_str());
  for (const auto& e : kept) {
    std::string why = to_string(e.why);
    if (e.why == keep_reason::chain)
      why += " (needed by version " + std::to_string(e.needed_by) + ")";
    std::fprintf(out, "kept %s: %s\n", to_string(e.ref).c_str(), why.c_str());
  }
  std::fprintf(out, "%s %zu version(s), kept %zu\n", verb, removed.size(), kept.size());
  return {};
}

result<std::optional<resume_point>>
find_resume_point(caf::actor_system& sys, const host_port& coordinator, const std::string& pool,
                  const std::string& run_id, uint64_t min_version) {
  auto handle = lookup(sys, coordinator, "store");
  if (!handle)
    return std::move(handle).error();
  remote_store store{sys, caf::actor_cast<store_actor>(*handle)};
  auto pointer = store.read_pointer(pool);
  if (!pointer)
    return std::move(pointer).error();
  if (!*pointer || (*pointer)->latest.run_id != run_id || (*pointer)->latest.version < min_version)
    return std::optional<resume_point>{};
  auto weights = pipeline::materialize(store, pool, (*pointer)->latest);
  if (!weights)
    return std::move(weights).error();
  return std::optional<resume_point>{resume_point{(*pointer)->latest.version, std::move(*weights)}};
}

status run_init_model(const init_model_command& cmd, std::FILE* out) {
  auto config = engine::preset(cmd.preset);
  if (!config)
    return std::move(config).error();
  auto weights = engine::random_init(*config, cmd.seed);
  if (!weights)
    return std::move(weights).error();
  const std::filesystem::path dir = cmd.out_dir;
  // config.json next to the shards, in the same atomic replacement.
  if (auto ok =
        pipeline::write_hf_directory(dir, *weights, default_max_shard_bytes,
                                     {{"config.json", engine::render_model_config(*config)}});
      !ok)
    return ok;
  uint64_t bytes = 0;
  for (const auto& [name, t] : *weights)
    bytes += t.bytes.size();
  std::fprintf(out, "wrote the %s model (seed %llu, %zu tensors, %s) to %s\n", cmd.preset.c_str(),
               static_cast<unsigned long long>(cmd.seed), weights->size(),
               human_bytes(bytes).c_str(), dir.c_str());
  return {};
}

namespace {

result<std::string> ask_coordinator_text(caf::actor_system& sys, const host_port& where,
                                         auto&&... xs) {
  auto coordinator = connect_coordinator(sys, where);
  if (!coordinator)
    return std::move(coordinator).error();
  return ask<std::string>(sys, *coordinator, std::forward<decltype(xs)>(xs)...);
}

status print_line(result<std::string> answer, std::FILE* out) {
  if (!answer)
    return std::move(answer).error();
  std::fprintf(out, "%s\n", answer->c_str());
  return {};
}

} // namespace

status run_status(caf::actor_system& sys, const status_command& cmd, std::FILE* out) {
  auto handle = lookup(sys, cmd.coordinator, "status");
  if (!handle)
    return std::move(handle).error();
  auto snap =
    ask<status_snapshot>(sys, caf::actor_cast<status_actor>(*handle), atom::status_view_v);
  if (!snap)
    return std::move(snap).error();
  // Members and experiments come from the coordinator.
  auto coordinator = connect_coordinator(sys, cmd.coordinator);
  if (!coordinator)
    return std::move(coordinator).error();
  auto view = ask<cluster_view>(sys, *coordinator, atom::cluster_view_v);
  if (!view)
    return std::move(view).error();
  if (cmd.json) {
    auto j = nlohmann::json::parse(status_json(*snap));
    j["cluster"] = nlohmann::json::parse(cluster_json(*view));
    std::fprintf(out, "%s\n", j.dump().c_str());
    return {};
  }
  for (const auto& [pool, p] : snap->pointers)
    std::fprintf(out, "pool %s: pointer %s (boot %llu)\n", pool.c_str(),
                 to_string(p.latest).c_str(), static_cast<unsigned long long>(p.boot_version));
  if (snap->pointers.empty())
    std::fprintf(out, "no run claimed\n");
  std::fprintf(out, "%-24s %-6s %-26s %-11s %10s %10s  %s\n", "replica", "ready", "applied", "sync",
               "stage s", "pause us", "reason");
  size_t in_flight = 0;
  for (const auto& r : snap->replicas) {
    const auto& i = r.info;
    auto applied = i.applied ? to_string(*i.applied) : std::string{"-"};
    std::fprintf(out, "%-24s %-6s %-26s %-11s %10.3f %10.1f  %s\n", i.replica_id.c_str(),
                 i.ready ? "yes" : "no", applied.c_str(), std::string{to_string(i.state)}.c_str(),
                 i.metrics.last_stage_s, i.metrics.last_pause_us, i.reason.c_str());
    in_flight += i.state == sync_state::fetching || i.state == sync_state::staging
                 || i.state == sync_state::committing;
  }
  std::fprintf(out, "transfers in flight: %zu\n", in_flight);
  for (const auto& n : view->nodes) {
    std::string roles = "[";
    for (size_t k = 0; k < n.roles.size(); ++k)
      roles += (k ? ",\"" : "\"") + n.roles[k] + "\"";
    roles += "]";
    std::fprintf(out, "node %-20s roles %-40s slots %zu\n", n.name.c_str(), roles.c_str(),
                 n.slots.size());
  }
  for (const auto& e : view->experiments) {
    std::fprintf(out, "experiment %s (pool %s): %zu/%u replicas", e.run_id.c_str(), e.pool.c_str(),
                 e.replicas.size(), static_cast<unsigned>(e.replicas_wanted));
    if (e.last_step)
      std::fprintf(out, ", step %llu reward %.3f",
                   static_cast<unsigned long long>(e.last_step->step), e.last_step->reward);
    if (!e.trainer_outcome.empty())
      std::fprintf(out, ", trainer %s", e.trainer_outcome.c_str());
    if (!e.shortfall.empty())
      std::fprintf(out, " (%s)", e.shortfall.c_str());
    std::fprintf(out, "\n");
  }
  return {};
}

status run_submit(caf::actor_system& sys, const submit_command& cmd, std::FILE* out) {
  auto spec = config::load_experiment(cmd.file);
  if (!spec)
    return std::move(spec).error();
  return print_line(ask_coordinator_text(sys, cmd.coordinator, atom::submit_v, *spec, cmd.token),
                    out);
}

status run_scale(caf::actor_system& sys, const scale_command& cmd, std::FILE* out) {
  return print_line(
    ask_coordinator_text(sys, cmd.coordinator, atom::scale_v, cmd.run, cmd.replicas, cmd.token),
    out);
}

status run_stop(caf::actor_system& sys, const stop_command& cmd, std::FILE* out) {
  return print_line(ask_coordinator_text(sys, cmd.coordinator, atom::stop_v, cmd.run, cmd.token),
                    out);
}

} // namespace stitch::node
