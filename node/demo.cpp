#include "node/demo.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "node/commands.hpp"
#include "node/node.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/engine/policy_gradient.hpp"
#include "runtime/engine/rollout_client.hpp"
#include "runtime/engine/weights.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "transport/http_client.hpp"

namespace stitch::node {

namespace {

using json = nlohmann::json;

/// The replicas' largest last activation pause, in microseconds.
double max_pause_us(const host_port& gateway, const std::string& pool) {
  transport::http_client client{transport::http_endpoint{"http", gateway.host, gateway.port}};
  transport::http_request req;
  req.target = "/pool";
  req.headers = {{"X-Stitch-Pool", pool}};
  auto got = client.send(req);
  if (!got || got->status != 200)
    return 0;
  auto j = json::parse(got->body, nullptr, false);
  double best = 0;
  if (!j.is_discarded())
    for (const auto& r : j["replicas"])
      best = std::max(best, r["metrics"].value("pause_us", 0.0));
  return best;
}

/// Failures that another try may not meet: the publisher's node was away,
/// the network cut, a request timed out. What the input or the store's rules
/// refuse is final.
bool worth_retrying(errc code) {
  switch (code) {
    case errc::invalid_argument:
    case errc::invalid_manifest:
    case errc::invalid_format:
    case errc::version_exists:
    case errc::rewind:
    case errc::unauthorized:
    case errc::checksum_mismatch: return false;
    default: return true;
  }
}

status publish_version(caf::actor_system& sys, const demo_command& cmd,
                       const pipeline::tensor_set& weights, const engine::model_config& config,
                       const std::filesystem::path& dir, uint64_t version) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  // config.json goes with every version (replicas serve it with it).
  if (auto ok =
        pipeline::write_hf_directory(dir, weights, default_max_shard_bytes,
                                     {{"config.json", engine::render_model_config(config)}});
      !ok)
    return ok;
  publish_command pub;
  pub.coordinator = cmd.coordinator;
  pub.args.run_id = cmd.run_id;
  pub.args.pool = cmd.pool;
  pub.args.version = version;
  pub.args.token = cmd.token;
  pub.directory = dir.string();
  pub.retry_budget = std::chrono::seconds{0}; // the loop below retries, and heeds `stop`
  // The publisher's node may be down or restarting (the hub restarts from
  // its store): a publish that failed for want of it is tried again, the
  // same version with the same bytes, which the store takes once.
  const auto deadline = std::chrono::steady_clock::now() + cmd.publish_retry_for;
  for (uint32_t attempt = 0;; ++attempt) {
    auto done = with_quiet_output([&](std::FILE* out) { return run_publish(sys, pub, out); });
    if (done)
      return {};
    if (!worth_retrying(done.error().code) || std::chrono::steady_clock::now() > deadline
        || (cmd.stop && cmd.stop->load()))
      return std::move(done).error();
    if (attempt == 0)
      std::fprintf(stderr,
                   "[trainer] publishing version %llu failed (%s); retrying for up to %lld s\n",
                   static_cast<unsigned long long>(version), done.error().message.c_str(),
                   static_cast<long long>(cmd.publish_retry_for.count()));
    std::this_thread::sleep_for(std::chrono::seconds{1});
  }
}

/// The run's version `version` as the store holds it, once the pool's pointer
/// has reached it (the publisher moves the pointer just after storing), for
/// up to `cmd.publish_retry_for`; none if the pointer goes elsewhere.
result<std::optional<resume_point>> stored_version(caf::actor_system& sys, const demo_command& cmd,
                                                   uint64_t version) {
  const auto give_up = std::chrono::steady_clock::now() + cmd.publish_retry_for;
  for (;;) {
    auto point = find_resume_point(sys, cmd.coordinator, cmd.pool, cmd.run_id, version);
    if (!point || (*point && (*point)->version == version))
      return point;
    if ((*point && (*point)->version > version) || std::chrono::steady_clock::now() >= give_up
        || (cmd.stop && cmd.stop->load()))
      return std::optional<resume_point>{};
    std::this_thread::sleep_for(std::chrono::milliseconds{100});
  }
}

} // namespace

status run_demo(caf::actor_system& sys, const demo_command& given, std::FILE* out) {
  demo_command cmd = given;
  // Where versions are written for the publisher; gone on every way out.
  struct scratch_dir {
    std::filesystem::path path;
    ~scratch_dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } scratch_guard{
    std::filesystem::temp_directory_path()
    / ("stitch-demo-" + std::to_string(::getpid()) + "-" + cmd.pool + "-" + cmd.run_id)};
  const auto& scratch = scratch_guard.path;
  std::filesystem::create_directories(scratch);
  std::unique_ptr<node> local;
  if (cmd.local) {
    node_settings s;
    s.data_dir = scratch / "data";
    s.coordinator_listen = {"127.0.0.1", 0};
    s.gateway_listen = {"127.0.0.1", 0};
    s.status_listen = {"127.0.0.1", 0};
    s.replica_listen = {"127.0.0.1", 0};
    s.backstop = 1;
    s.admin_token = cmd.token;
    if (cmd.moe)
      s.model_preset = "moe-tiny";
    auto started = node::start(sys, s);
    if (!started)
      return std::move(started).error();
    local = std::move(*started);
    cmd.coordinator = {"127.0.0.1", local->port()};
    cmd.gateway = {"127.0.0.1", local->http().gateway};
    if (!cmd.json)
      std::fprintf(out, "demo: local node up; dashboard at http://127.0.0.1:%u/\n",
                   static_cast<unsigned>(local->http().status));
  }
  if (cmd.moe && cmd.preset == "tiny")
    cmd.preset = "moe-tiny";
  auto model = engine::preset(cmd.preset);
  if (model && cmd.moe && !model->is_moe())
    return make_error(errc::invalid_argument,
                      "demo: --moe needs a mixture-of-experts preset, not " + cmd.preset);
  if (!model)
    return std::move(model).error();
  auto config = *model;
  // The weights to start from: the run's latest stored version when resuming
  // a run the pool already serves (its boot, from a seed or a directory, or
  // where another trainer stopped); else the built-in model from the seed,
  // published as the boot checkpoint.
  std::optional<pipeline::tensor_set> weights;
  uint32_t first_step = 0;
  if (cmd.resume) {
    auto point = find_resume_point(sys, cmd.coordinator, cmd.pool, cmd.run_id, cmd.boot_version);
    if (!point)
      return std::move(point).error();
    if (*point) {
      first_step =
        static_cast<uint32_t>(std::min<uint64_t>((*point)->version - cmd.boot_version, cmd.steps));
      weights = std::move((*point)->weights);
      if (!cmd.json && first_step > 0)
        std::fprintf(out, "demo: resuming %s at version %llu (step %u)\n", cmd.run_id.c_str(),
                     static_cast<unsigned long long>((*point)->version), first_step);
    }
  }
  if (!weights) {
    auto initial = engine::random_init(config, cmd.seed);
    if (!initial)
      return std::move(initial).error();
    weights = std::move(*initial);
    if (auto ok = publish_version(sys, cmd, *weights, config, scratch / "v", cmd.boot_version); !ok)
      return ok;
  }

  struct step_row {
    double reward;
    size_t samples;
    double staleness_mean;
    uint64_t staleness_max;
    double pause_us;
  };
  std::vector<step_row> rows;
  uint64_t violations = 0, samples_total = 0, staleness_max = 0;
  double staleness_sum = 0, pause_max = 0;
  uint64_t tokens_total = 0, crossed_tokens = 0;
  uint64_t routing_decisions = 0, routing_disagreements = 0;
  double token_staleness_sum = 0;
  if (!cmd.json)
    std::fprintf(out, "%5s %8s %8s %14s %14s %12s\n", "step", "reward", "samples", "staleness mean",
                 "staleness max", "pause us");
  for (uint32_t step = first_step; step < cmd.steps; ++step) {
    if (cmd.stop && cmd.stop->load())
      break;
    const uint64_t latest = cmd.boot_version + step;
    const uint64_t min_version = latest > cmd.staleness ? latest - cmd.staleness : 0;
    const uint64_t seed_base = uint64_t{step} * 100'000;
    std::vector<engine::rollout_result> results;
    if (cmd.rollouts) {
      auto got = cmd.rollouts(min_version, cmd.samples_per_step, seed_base);
      if (!got)
        return std::move(got).error();
      results = std::move(*got);
    } else {
      results = engine::rollout_batch({cmd.gateway.host, cmd.gateway.port, cmd.pool, cmd.moe},
                                      min_version, cmd.samples_per_step, seed_base, cmd.stop);
    }
    std::vector<engine::rollout_sample> batch;
    step_row row{0, 0, 0, 0, 0};
    if (cmd.stop && cmd.stop->load())
      break;
    for (auto& r : results) {
      if (!r.ok)
        return make_error(errc::engine_unavailable, "demo: a rollout failed: " + r.error);
      violations += r.violation ? 1 : 0;
      uint64_t stale = latest - std::min(latest, r.sample.version);
      row.staleness_mean += static_cast<double>(stale);
      row.staleness_max = std::max(row.staleness_max, stale);
      batch.push_back(std::move(r.sample));
    }
    row.samples = batch.size();
    row.staleness_mean /= static_cast<double>(std::max<size_t>(1, batch.size()));
    engine::pg_options o;
    o.learning_rate = cmd.learning_rate;
    o.current_version = latest;
    o.staleness_decay = cmd.staleness_decay;
    if (cmd.moe)
      o.router_learning_rate = cmd.router_learning_rate;
    auto stats = engine::policy_gradient_step(*weights, config, batch, o);
    if (!stats)
      return std::move(stats).error();
    tokens_total += stats->tokens;
    crossed_tokens += stats->crossed_tokens;
    routing_decisions += stats->routing_decisions;
    routing_disagreements += stats->routing_disagreements;
    token_staleness_sum += stats->mean_token_staleness * static_cast<double>(stats->tokens);
    row.reward = stats->mean_reward;
    if (auto ok = publish_version(sys, cmd, *weights, config, scratch / "v", latest + 1); !ok) {
      // A trainer resumed after its node died can race its predecessor's last
      // publish, which the publisher finished after the death: the stored
      // version wins, and training goes on from it.
      if (!cmd.resume || ok.error().code != errc::version_exists)
        return ok;
      auto stored = stored_version(sys, cmd, latest + 1);
      if (!stored)
        return std::move(stored).error();
      if (!*stored)
        return ok;
      weights = std::move((*stored)->weights);
      if (!cmd.json)
        std::fprintf(out,
                     "demo: %s version %llu was already stored by this run; continuing from it\n",
                     cmd.run_id.c_str(), static_cast<unsigned long long>(latest + 1));
      continue;
    }
    row.pause_us = max_pause_us(cmd.gateway, cmd.pool);
    rows.push_back(row);
    samples_total += row.samples;
    staleness_sum += row.staleness_mean * static_cast<double>(row.samples);
    staleness_max = std::max(staleness_max, row.staleness_max);
    pause_max = std::max(pause_max, row.pause_us);
    if (cmd.on_step)
      cmd.on_step(step_report{step, latest + 1, row.reward, row.samples, row.staleness_mean,
                              row.staleness_max, row.pause_us, violations});
    if (!cmd.json) {
      std::fprintf(out, "%5u %8.3f %8zu %14.2f %14llu %12.1f\n", step, row.reward, row.samples,
                   row.staleness_mean, static_cast<unsigned long long>(row.staleness_max),
                   row.pause_us);
      std::fflush(out);
    }
  }
  auto window = std::max<size_t>(1, std::min<size_t>(5, rows.size() / 2));
  double first = 0, last = 0;
  for (size_t i = 0; i < window && i < rows.size(); ++i) {
    first += rows[i].reward / static_cast<double>(window);
    last += rows[rows.size() - 1 - i].reward / static_cast<double>(window);
  }
  double staleness_mean = samples_total ? staleness_sum / static_cast<double>(samples_total) : 0;
  if (cmd.json) {
    json j;
    j["reward_first"] = first;
    j["reward_last"] = last;
    j["steps"] = rows.size();
    j["samples"] = samples_total;
    j["staleness_mean"] = staleness_mean;
    j["staleness_max"] = staleness_max;
    j["token_staleness_mean"] =
      tokens_total ? token_staleness_sum / static_cast<double>(tokens_total) : 0.0;
    j["crossed_tokens"] = crossed_tokens;
    j["constraint_violations"] = violations;
    j["pause_ms_max"] = pause_max / 1000.0;
    if (cmd.moe) {
      j["routing_decisions"] = routing_decisions;
      j["routing_disagreements"] = routing_disagreements;
      j["routing_disagreement_rate"] =
        routing_decisions
          ? static_cast<double>(routing_disagreements) / static_cast<double>(routing_decisions)
          : 0.0;
    }
    std::fprintf(out, "%s\n", j.dump().c_str());
  } else {
    std::fprintf(out,
                 "\nsummary\n"
                 "  reward (mean of first %zu steps -> last %zu): %.3f -> %.3f\n"
                 "  steps %zu, samples %llu\n"
                 "  staleness (versions behind the newest): mean %.2f, max %llu (bound %u)\n"
                 "  tokens %llu: %.2f versions behind on average, %llu made after an activation "
                 "their generation crossed (weighted %.2f per version behind)\n"
                 "  constraint violations: %llu\n"
                 "  largest activation pause: %.3f ms\n",
                 window, window, first, last, rows.size(),
                 static_cast<unsigned long long>(samples_total), staleness_mean,
                 static_cast<unsigned long long>(staleness_max), cmd.staleness,
                 static_cast<unsigned long long>(tokens_total),
                 tokens_total ? token_staleness_sum / static_cast<double>(tokens_total) : 0.0,
                 static_cast<unsigned long long>(crossed_tokens), cmd.staleness_decay,
                 static_cast<unsigned long long>(violations), pause_max / 1000.0);
    if (cmd.moe)
      std::fprintf(out,
                   "  routing replay: %llu (position, layer) choices replayed; the trainer's own "
                   "router would have chosen other experts in %llu (%.2f%%)\n",
                   static_cast<unsigned long long>(routing_decisions),
                   static_cast<unsigned long long>(routing_disagreements),
                   routing_decisions ? 100.0 * static_cast<double>(routing_disagreements)
                                         / static_cast<double>(routing_decisions)
                                     : 0.0);
  }
  if (local)
    local->stop();
  if (violations > 0)
    return make_error(errc::version_not_ready, "demo: " + std::to_string(violations)
                                                 + " responses violated their constraint");
  return {};
}

} // namespace stitch::node
