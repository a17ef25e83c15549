// The all-in-one stitch-node over HTTP: built-in replicas converge on a
// published model, the gateway serves stamped samples, and the status surface
// (JSON, Prometheus, the dashboard in headless Chromium) reports them.

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "gpu/device.hpp"
#include "node/node_process.hpp"
#include "store/store_fixtures.hpp"
#include "transport/http_client.hpp"

namespace stitch {
namespace {

using namespace stitch::testing;
using namespace std::chrono_literals;

transport::http_response get(const std::string& port, const std::string& method,
                             const std::string& target, const std::string& body = {}) {
  transport::http_client c{
    transport::http_endpoint{"http", "127.0.0.1", static_cast<uint16_t>(std::stoi(port))}};
  transport::http_request req;
  req.method = method;
  req.target = target;
  req.body = body;
  if (!body.empty())
    req.headers.push_back({"Content-Type", "application/json"});
  auto r = c.send(req);
  EXPECT_TRUE(r) << (r ? "" : to_string(r.error()));
  return r ? *r : transport::http_response{};
}

class node_http_test : public ::testing::Test {
protected:
  void SetUp() override {
    node = std::make_unique<node_process>(dir.path(), settings());
    ASSERT_TRUE(node->started()) << node->log();
  }
  virtual std::vector<std::string> settings() const {
    return {"replicas=2", "model.preset=tiny", "replica.backstop=1"};
  }
  void TearDown() override { EXPECT_TRUE(node->stop()) << node->log(); }

  void publish(uint64_t version, uint64_t seed) {
    auto model = dir.path() / ("model-" + std::to_string(version));
    auto init = run(std::string{STITCH_BIN} + " init-model --preset tiny --seed "
                    + std::to_string(seed) + " --out " + model.string());
    ASSERT_EQ(init.code, 0) << init.output;
    auto pub =
      run(std::string{STITCH_BIN} + " --coordinator 127.0.0.1:" + node->coordinator_port
          + " publish --run demo --version " + std::to_string(version) + " " + model.string());
    ASSERT_EQ(pub.code, 0) << pub.output;
  }

  /// Waits (bounded) until the gateway reports both replicas ready at `version`.
  void await(uint64_t version) {
    std::string want = "demo/weight_v" + std::string(6 - std::to_string(version).size(), '0')
                       + std::to_string(version);
    for (int i = 0; i < 1200; ++i) {
      auto pool = get(node->gateway_port, "GET", "/pool");
      auto j = nlohmann::json::parse(pool.body, nullptr, false);
      if (!j.is_discarded() && j["summary"]["versions"].contains(want)
          && j["summary"]["versions"][want] == 2)
        return;
      std::this_thread::sleep_for(50ms);
    }
    FAIL() << "replicas never reached " << want << "\n"
           << get(node->gateway_port, "GET", "/pool").body;
  }

  temp_dir dir;
  std::unique_ptr<node_process> node;
};

TEST_F(node_http_test, replicas_converge_serve_stamped_samples_and_report_status) {
  auto before = get(node->gateway_port, "GET", "/health");
  EXPECT_EQ(before.status, 503u) << "no run claimed yet";
  publish(0, 1);
  await(0);
  publish(1, 2);
  await(1);

  auto sample = get(node->gateway_port, "POST", "/generate",
                    R"({"text":"hello","sampling_params":{"max_new_tokens":8,"temperature":0},
                        "weight_version":{"min_version":1,"exact_version":null}})");
  ASSERT_EQ(sample.status, 200u) << sample.body;
  auto s = nlohmann::json::parse(sample.body);
  EXPECT_EQ(s["meta_info"]["weight_version_start"], 1);
  EXPECT_EQ(s["meta_info"]["run_id"], "demo");
  auto ahead = get(node->gateway_port, "POST", "/generate",
                   R"({"text":"x","weight_version":{"min_version":9}})");
  EXPECT_EQ(ahead.status, 409u);

  auto status = nlohmann::json::parse(get(node->status_port, "GET", "/status").body);
  ASSERT_EQ(status["replicas"].size(), 2u);
  EXPECT_EQ(status["pools"][0]["pointer"], "demo/weight_v000001");
  for (const auto& r : status["replicas"]) {
    EXPECT_EQ(r["applied_version"], 1);
    EXPECT_GE(r["history"].size(), 2u) << "v0 then v1";
    EXPECT_EQ(r["device"]["device"], "cpu");
    EXPECT_EQ(r["device"]["memory_used_bytes"], 0);
    // A CPU engine recycles released mapped host buffers; the tiny model's
    // tensors are heap buffers, which are never kept.
    EXPECT_EQ(r["device"]["host_recycled_kept_bytes"], 0);
    EXPECT_EQ(r["device"]["host_recycled_bytes_total"], 0);
  }
  // A body nesting JSON a hundred thousand levels deep once crashed the node
  // (a stack overflow writing it back out): refused by name, and the node
  // keeps serving.
  std::string deep =
    R"({"text":"hi","x":)" + std::string(100'000, '[') + std::string(100'000, ']') + "}";
  auto bomb = get(node->gateway_port, "POST", "/generate", deep);
  EXPECT_EQ(bomb.status, 400u) << bomb.body;
  EXPECT_NE(bomb.body.find("deeper than 64 levels"), std::string::npos) << bomb.body;
  auto after_bomb = get(node->gateway_port, "POST", "/generate",
                        R"({"text":"hi","sampling_params":{"max_new_tokens":2}})");
  EXPECT_EQ(after_bomb.status, 200u) << after_bomb.body;

  auto metrics = get(node->status_port, "GET", "/metrics");
  EXPECT_NE(metrics.body.find("stitch_replica_applied_version{replica=\"replica-0\""),
            std::string::npos);
  EXPECT_NE(metrics.body.find("stitch_activation_pause_seconds_bucket"), std::string::npos);
  EXPECT_NE(metrics.body.find("stitch_request_duration_seconds_count"), std::string::npos);
  EXPECT_NE(metrics.body.find("stitch_replica_device_memory_bytes{replica=\"replica-0\","
                              "pool=\"default\",device=\"cpu\"} 0"),
            std::string::npos)
    << metrics.body;
  EXPECT_NE(metrics.body.find("# TYPE stitch_replica_host_recycled_bytes_total counter\n"
                              "stitch_replica_host_recycled_bytes_total{replica=\"replica-0\","),
            std::string::npos)
    << metrics.body;
  // This node's HTTP surfaces: connections held and refused by each limit.
  EXPECT_NE(metrics.body.find("stitch_http_connections{surface=\"gateway\"}"), std::string::npos)
    << metrics.body;
  EXPECT_NE(metrics.body.find("stitch_http_refused_connections_total{surface=\"replica replica-0\","
                              "limit=\"per_client\"} 0"),
            std::string::npos)
    << metrics.body;
  EXPECT_NE(metrics.body.find("stitch_http_refused_bodies_total{surface=\"gateway\"} 0"),
            std::string::npos)
    << metrics.body;
  EXPECT_NE(metrics.body.find("stitch_http_receiving_body_bytes{surface=\"gateway\"} 0"),
            std::string::npos)
    << metrics.body;
  EXPECT_NE(metrics.body.find("stitch_gateway_responses_total{gateway=\"0\",code=\"409\"} 1"),
            std::string::npos)
    << metrics.body;

  // The same view from the CLI, a CAF client of the coordinator.
  auto cli =
    run(std::string{STITCH_BIN} + " --coordinator 127.0.0.1:" + node->coordinator_port + " status");
  ASSERT_EQ(cli.code, 0) << cli.output;
  EXPECT_NE(cli.output.find("pool default: pointer demo/weight_v000001"), std::string::npos)
    << cli.output;
  EXPECT_NE(cli.output.find("replica-1"), std::string::npos) << cli.output;
  auto cli_json = run(std::string{STITCH_BIN} + " --coordinator 127.0.0.1:" + node->coordinator_port
                      + " status --json");
  ASSERT_EQ(cli_json.code, 0) << cli_json.output;
  EXPECT_EQ(nlohmann::json::parse(cli_json.output)["replicas"].size(), 2u);

  // The dashboard, rendered by a real browser: the replica rows and the chart.
  auto artifacts = std::filesystem::path{STITCH_ARTIFACT_DIR};
  std::filesystem::create_directories(artifacts);
  auto profile = dir.path() / "chromium";
  std::string chromium = "timeout 120 chromium --headless --no-sandbox --disable-gpu "
                         "--disable-dev-shm-usage --no-first-run --hide-scrollbars "
                         "--user-data-dir="
                         + profile.string() + " --virtual-time-budget=4000 --window-size=1280,900 ";
  std::string url = "http://127.0.0.1:" + node->status_port + "/";
  auto dom = run(chromium + "--dump-dom " + url);
  ASSERT_EQ(dom.code, 0) << dom.output;
  EXPECT_NE(dom.output.find(R"(class="replica" data-id="replica-0")"), std::string::npos)
    << dom.output;
  EXPECT_NE(dom.output.find(R"(class="replica" data-id="replica-1")"), std::string::npos);
  EXPECT_NE(dom.output.find("<polyline"), std::string::npos) << "the chart was drawn";
  EXPECT_NE(dom.output.find(R"(data-replica="replica-1")"), std::string::npos);
  EXPECT_NE(dom.output.find("demo/weight_v000001"), std::string::npos);
  auto shot = artifacts / "dashboard.png";
  std::filesystem::remove(shot);
  auto png = run(chromium + "--screenshot=" + shot.string() + " " + url);
  ASSERT_EQ(png.code, 0) << png.output;
  ASSERT_TRUE(std::filesystem::exists(shot)) << png.output;
  EXPECT_GT(std::filesystem::file_size(shot), 10'000u) << "a real picture, not an empty page";
}

/// Replicas that read only the store: every stage decodes delta frames.
class stitch_profile_test : public node_http_test {
protected:
  std::vector<std::string> settings() const override {
    auto s = node_http_test::settings();
    s.push_back("transfer.peers=off");
    return s;
  }
  run_result profile(const std::string& flags) {
    return run(std::string{STITCH_BIN} + " --coordinator 127.0.0.1:" + node->coordinator_port
               + " profile --replica replica-0 " + flags);
  }
};

TEST_F(stitch_profile_test, drives_a_replica_through_every_update_path_and_puts_it_back) {
  publish(1, 1);
  await(1);
  auto refused = profile("--json");
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.output.find("is in rotation"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("--take-out"), std::string::npos) << refused.output;

  // Clients keep being served meanwhile, never from the scratch weights.
  std::atomic<bool> stop{false};
  std::atomic<int> served{0}, foreign{0};
  std::thread client{[&] {
    while (!stop) {
      auto r = get(node->gateway_port, "POST", "/generate",
                   R"({"text":"hi","sampling_params":{"max_new_tokens":2}})");
      if (r.status != 200)
        continue;
      auto j = nlohmann::json::parse(r.body, nullptr, false);
      if (!j.is_discarded() && j["meta_info"]["run_id"] == "demo")
        ++served;
      else
        ++foreign;
    }
  }};
  auto out_path = dir.path() / "profile.json";
  auto r = profile("--take-out --json --out " + out_path.string() + " 2>/dev/null");
  stop = true;
  client.join();
  ASSERT_EQ(r.code, 0) << r.output << node->log();
  EXPECT_GT(served.load(), 0);
  EXPECT_EQ(foreign.load(), 0) << "a request was answered from another run's weights";
  auto j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j["steps"].size(), 6u) << j.dump(2);
  std::vector<std::string> paths;
  for (const auto& s : j["steps"])
    paths.push_back(s["path"]);
  EXPECT_EQ(paths, (std::vector<std::string>{"cold start", "delta", "two-tensor delta",
                                             "folded catch-up", "empty delta", "run switch"}));
  for (const auto& s : j["steps"]) {
    SCOPED_TRACE(s.dump());
    EXPECT_TRUE(s["checksum_ok"].get<bool>());
    EXPECT_EQ(s["checksum_basis"], "served weights");
    for (const char* k : {"preparation_s", "fetch_s", "decode_s", "verify_s", "stage_s", "drain_ms",
                          "pause_us", "total_s", "bytes_moved"})
      ASSERT_TRUE(s.contains(k)) << k;
    const bool staged = s["path"] != "empty delta";
    EXPECT_EQ(s["activated"].get<bool>(), staged);
    if (staged) {
      EXPECT_GT(s["fetch_s"].get<double>(), 0);
      EXPECT_GT(s["verify_s"].get<double>(), 0);
      EXPECT_GT(s["pause_us"].get<double>(), 0);
      EXPECT_GT(s["bytes_moved"].get<uint64_t>(), 0u);
      EXPECT_LE(s["fetch_s"].get<double>() + s["decode_s"].get<double>()
                  + s["verify_s"].get<double>() + s["stage_s"].get<double>(),
                s["preparation_s"].get<double>() * 1.000001 + 1e-9);
      EXPECT_GE(s["total_s"].get<double>(), s["preparation_s"].get<double>());
    } else {
      EXPECT_EQ(s["bytes_moved"], 0u);
      EXPECT_EQ(s["pause_us"], 0.0);
    }
  }
  const auto& steps = j["steps"];
  // Deltas are decoded from their frames; anchors are read whole.
  EXPECT_GT(steps[1]["decode_s"].get<double>(), 0);
  EXPECT_GT(steps[2]["decode_s"].get<double>(), 0);
  EXPECT_GT(steps[3]["decode_s"].get<double>(), 0);
  // The built-in engine swaps weights in memory: no load from files.
  for (const auto& s : steps)
    EXPECT_EQ(s["engine_load"], nullptr) << s.dump();
  EXPECT_LT(steps[2]["bytes_moved"].get<uint64_t>(), steps[1]["bytes_moved"].get<uint64_t>())
    << "two tensors' changes are fewer bytes than every tensor's";
  EXPECT_EQ(steps[0]["decode_s"], 0.0);
  EXPECT_EQ(steps[0]["from"], nullptr) << "a cold start";
  EXPECT_EQ(steps[3]["folded"], 4);
  EXPECT_LT(steps[1]["bytes_moved"].get<uint64_t>(), steps[0]["bytes_moved"].get<uint64_t>())
    << "a delta moves its frames, not the model";
  EXPECT_TRUE(steps[5]["run_switch"].get<bool>());
  EXPECT_EQ(j["returned"]["ready"], true) << j.dump(2);
  EXPECT_EQ(j["returned"]["applied"], "demo/weight_v000001");
  EXPECT_EQ(j["scratch_removed"], 8) << "the first run's eight versions";
  std::ifstream svg{dir.path() / "profile.svg"};
  std::string chart{std::istreambuf_iterator<char>{svg}, {}};
  EXPECT_NE(chart.find("<svg"), std::string::npos);
  EXPECT_NE(chart.find("run switch"), std::string::npos);
  await(1); // both replicas serve the pool again

  // A second profile leaves one scratch version behind, not two runs.
  auto again = profile("--take-out --json 2>/dev/null");
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_EQ(nlohmann::json::parse(again.output)["scratch_removed"], 9)
    << "this run's eight and the last profile's leftover";
}

TEST(stitch_demo, the_trainer_learns_while_replicas_serve_within_the_staleness_bound) {
  auto r =
    run(std::string{STITCH_BIN} + " demo --local --steps 20 --staleness 2 --json 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.output;
  auto last_line = r.output.substr(r.output.rfind('{'));
  auto j = nlohmann::json::parse(last_line);
  EXPECT_EQ(j["steps"], 20);
  EXPECT_EQ(j["samples"], 20 * 16);
  EXPECT_EQ(j["constraint_violations"], 0);
  EXPECT_LE(j["staleness_max"].get<uint64_t>(), 2u);
  EXPECT_GT(j["reward_last"].get<double>(), j["reward_first"].get<double>() + 0.2)
    << "the reward must measurably improve: " << last_line;
  for (const char* k : {"reward_first", "reward_last", "steps", "samples", "staleness_mean",
                        "staleness_max", "constraint_violations", "pause_ms_max"})
    EXPECT_TRUE(j.contains(k)) << k;
}

TEST(stitch_demo, a_mixture_of_experts_trains_with_routing_replay) {
  auto r = run(std::string{STITCH_BIN}
               + " demo --local --moe --steps 12 --staleness 2 --json 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.output;
  auto last_line = r.output.substr(r.output.rfind('{'));
  auto j = nlohmann::json::parse(last_line);
  EXPECT_EQ(j["steps"], 12);
  EXPECT_EQ(j["constraint_violations"], 0);
  // Every sample came back with its routing and the trainer replayed it:
  // (16 prompt tokens + up to 8 generated - 1) positions x 2 layers each.
  EXPECT_LE(j["routing_decisions"].get<uint64_t>(), 12u * 16u * (16u + 8u - 1u) * 2u) << last_line;
  EXPECT_GE(j["routing_decisions"].get<uint64_t>(), 12u * 16u * 16u * 2u) << last_line;
  // Stale samples were routed by older routers than the trainer's (the
  // router trains every step); only all-fresh samples could agree everywhere.
  if (j["staleness_mean"].get<double>() > 0.2) {
    EXPECT_GT(j["routing_disagreements"].get<uint64_t>(), 0u) << last_line;
  }
  EXPECT_LT(j["routing_disagreement_rate"].get<double>(), 0.5) << last_line;
  EXPECT_GT(j["reward_last"].get<double>(), j["reward_first"].get<double>()) << last_line;
}

TEST(node_security, the_admin_token_guards_wake_and_publish) {
  temp_dir dir;
  node_process node{dir.path(), {"replicas=0", "admin.token=let-me-in"}};
  ASSERT_TRUE(node.started()) << node.log();
  EXPECT_EQ(get(node.gateway_port, "POST", "/wake").status, 401u);
  {
    transport::http_client c{transport::http_endpoint{
      "http", "127.0.0.1", static_cast<uint16_t>(std::stoi(node.gateway_port))}};
    transport::http_request req;
    req.method = "POST";
    req.target = "/wake";
    req.headers = {{"Authorization", "Bearer let-me-in"}};
    auto r = c.send(req);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200u);
  }
  auto model = dir.path() / "model";
  ASSERT_EQ(run(std::string{STITCH_BIN} + " init-model --preset tiny --out " + model.string()).code,
            0);
  std::string publish = std::string{STITCH_BIN} + " --coordinator 127.0.0.1:"
                        + node.coordinator_port + " publish --run r --version 0 " + model.string();
  auto refused = run(publish);
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.output.find("unauthorized"), std::string::npos) << refused.output;
  auto wrong = run(std::string{STITCH_BIN} + " --token nope --coordinator 127.0.0.1:"
                   + node.coordinator_port + " publish --run r --version 0 " + model.string());
  EXPECT_NE(wrong.code, 0) << wrong.output;
  EXPECT_NE(wrong.output.find("unauthorized"), std::string::npos) << wrong.output;
  auto allowed = run("STITCH_TOKEN=let-me-in " + publish);
  EXPECT_EQ(allowed.code, 0) << allowed.output;
  EXPECT_TRUE(node.stop()) << node.log();
}

TEST(node_security, a_publisher_on_another_node_writes_to_a_guarded_store_with_the_token) {
  // The store checks the admin token on every write (claim, advance,
  // uploads, retention): a publisher of another node carries its node's.
  temp_dir dir;
  std::filesystem::create_directories(dir.path() / "hub");
  node_process hub{
    dir.path() / "hub",
    {"roles=coordinator,store,gateway,status", "replicas=0", "admin.token=let-me-in"}};
  ASSERT_TRUE(hub.started()) << hub.log();
  std::vector<std::string> args = {"--data-dir=" + (dir.path() / "pub" / "data").string()};
  for (std::string s : {std::string{"roles=publisher"}, std::string{"admin.token=let-me-in"},
                        "coordinator.address=127.0.0.1:" + hub.coordinator_port})
    args.insert(args.end(), {"--set", s});
  node_process pub{dir.path() / "pub", args, "joined the coordinator"};
  ASSERT_TRUE(pub.started()) << pub.log();
  auto model = dir.path() / "model";
  ASSERT_EQ(run(std::string{STITCH_BIN} + " init-model --preset tiny --out " + model.string()).code,
            0);
  auto published =
    run("STITCH_TOKEN=let-me-in " + std::string{STITCH_BIN} + " --coordinator 127.0.0.1:"
        + hub.coordinator_port + " publish --run r --version 0 " + model.string());
  EXPECT_EQ(published.code, 0) << published.output << pub.log() << hub.log();
  EXPECT_TRUE(pub.stop()) << pub.log();
  EXPECT_TRUE(hub.stop()) << hub.log();
}

TEST(node_gpu, a_replica_on_cuda_without_a_device_stops_the_node_saying_why) {
  if (stitch::gpu::why_no_device().empty())
    GTEST_SKIP() << "a CUDA device is present: the refusal cannot be seen here";
  temp_dir dir;
  std::vector<std::string> args = {"--data-dir=" + (dir.path() / "data").string()};
  for (const char* s :
       {"coordinator.listen=127.0.0.1:0", "gateway.listen=127.0.0.1:0", "status.listen=127.0.0.1:0",
        "replica.listen=127.0.0.1:0", "replicas=1", "engine.device=cuda"})
    args.insert(args.end(), {"--set", s});
  node_process node{dir.path(), args, "status http://127\\.0\\.0\\.1:[0-9]+"};
  EXPECT_FALSE(node.started());
  EXPECT_NE(node.exit_code(), 0);
  auto log = node.log();
  EXPECT_NE(log.find("engine.device = cuda"), std::string::npos) << log;
  EXPECT_NE(log.find(stitch::gpu::why_no_device()), std::string::npos) << log;
}

} // namespace
} // namespace stitch
