// A real stitch-node whose replicas launch and drive external engines
// (`stitch-engine-peer`, the in-tree SGLang / vLLM stand-in): versions
// published through the CLI reach the engines through their own update
// calls, the gateway serves stamped answers (streams included), constraints
// give 409s, engine control routes are refused, and a launched engine that
// dies is restarted and re-synced while the node keeps running.

#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "node/node_process.hpp"
#include "store/store_fixtures.hpp"
#include "transport/http_client.hpp"

namespace stitch {
namespace {

using namespace stitch::testing;
using namespace std::chrono_literals;
using json = nlohmann::json;

transport::http_response call(const std::string& url_or_port, const std::string& method,
                              const std::string& target, const std::string& body = {}) {
  auto ep = url_or_port.starts_with("http")
              ? *transport::parse_endpoint(url_or_port)
              : transport::http_endpoint{"http", "127.0.0.1",
                                         static_cast<uint16_t>(std::stoi(url_or_port))};
  transport::http_client c{ep};
  transport::http_request req;
  req.method = method;
  req.target = target;
  req.body = body;
  if (!body.empty())
    req.headers.push_back({"Content-Type", "application/json"});
  auto r = c.send(req);
  return r ? *r : transport::http_response{};
}

class external_engine_node_test : public ::testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    const std::string dialect = GetParam();
    node = std::make_unique<node_process>(
      dir.path(),
      std::vector<std::string>{"replicas=2", "replica.backstop=1", "engine.kind=" + dialect,
                               "engine.launch=" + std::string{STITCH_ENGINE_PEER} + " --dialect "
                                 + dialect + " --port {port} --model-dir {model_dir}",
                               "engine.staging_dir=" + (dir.path() / "staging").string()});
    ASSERT_TRUE(node->started()) << node->log();
  }
  void TearDown() override { EXPECT_TRUE(node->stop()) << node->log(); }

  bool sglang() const { return GetParam() == "sglang"; }

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

  json pool() { return json::parse(call(node->gateway_port, "GET", "/pool").body, nullptr, false); }

  void await(uint64_t version) {
    std::string want = "demo/weight_v" + std::string(6 - std::to_string(version).size(), '0')
                       + std::to_string(version);
    for (int i = 0; i < 1200; ++i) {
      auto j = pool();
      if (!j.is_discarded() && j["summary"]["versions"].contains(want)
          && j["summary"]["versions"][want] == 2)
        return;
      std::this_thread::sleep_for(50ms);
    }
    FAIL() << "replicas never reached " << want << "\n" << pool().dump(1) << "\n" << node->log();
  }

  std::string route() const { return sglang() ? "/generate" : "/v1/completions"; }
  std::string body(const std::string& constraint, bool stream = false) const {
    std::string s = stream ? R"("stream":true,)" : "";
    if (sglang())
      return "{" + s + constraint
             + R"("text":"hello","sampling_params":{"temperature":0,"max_new_tokens":8}})";
    return "{" + s + constraint + R"("prompt":"hello","temperature":0,"max_tokens":8})";
  }
  /// (start, end) stamps of an answer.
  static std::pair<uint64_t, uint64_t> stamps_of(const json& j) {
    const json& h = j.contains("meta_info") ? j["meta_info"] : j;
    return {h.value("weight_version_start", uint64_t{999}),
            h.value("weight_version_end", uint64_t{999})};
  }

  temp_dir dir;
  std::unique_ptr<node_process> node;
};

TEST_P(external_engine_node_test, launched_engines_serve_each_published_version_with_stamps) {
  publish(0, 1);
  await(0);
  publish(1, 2);
  await(1);
  publish(2, 3);
  await(2);

  auto ok =
    call(node->gateway_port, "POST", route(), body(R"("weight_version":{"min_version":2},)"));
  ASSERT_EQ(ok.status, 200u) << ok.body;
  auto j = json::parse(ok.body);
  EXPECT_EQ(stamps_of(j), std::make_pair(uint64_t{2}, uint64_t{2})) << ok.body;

  // SGLang's native route works in front of either engine (vLLM's through
  // its completions route).
  auto native = call(node->gateway_port, "POST", "/generate",
                     R"({"text":"hello","sampling_params":{"temperature":0,"max_new_tokens":8},)"
                     R"("weight_version":{"min_version":2}})");
  ASSERT_EQ(native.status, 200u) << native.body;
  auto nj = json::parse(native.body);
  EXPECT_EQ(stamps_of(nj), std::make_pair(uint64_t{2}, uint64_t{2})) << native.body;
  EXPECT_TRUE(nj["output_ids"].is_array() && !nj["output_ids"].empty()) << native.body;

  auto future =
    call(node->gateway_port, "POST", route(), body(R"("weight_version":{"exact_version":7},)"));
  EXPECT_EQ(future.status, 409u) << future.body;

  // A stream through the gateway: events, then the stamped last one.
  auto streamed = call(node->gateway_port, "POST", route(), body("", true));
  ASSERT_EQ(streamed.status, 200u) << streamed.body;
  std::vector<json> events;
  std::regex data{"data: ([^\n]*)\n\n"};
  for (std::sregex_iterator it{streamed.body.begin(), streamed.body.end(), data}, end; it != end;
       ++it)
    if ((*it)[1] != "[DONE]")
      events.push_back(json::parse((*it)[1].str()));
  ASSERT_GT(events.size(), 2u) << streamed.body;
  EXPECT_EQ(stamps_of(events.back()).first, 2u) << events.back().dump();
  EXPECT_NE(streamed.body.find("data: [DONE]"), std::string::npos);

  // The engine's control routes are not for clients.
  auto blocked = call(node->gateway_port, "POST",
                      sglang() ? "/update_weights_from_disk" : "/collective_rpc", "{}");
  EXPECT_EQ(blocked.status, 403u) << blocked.body;

  // Each replica says which engine it drives and what that engine serves.
  auto p = pool();
  ASSERT_EQ(p["replicas"].size(), 2u);
  for (const auto& r : p["replicas"]) {
    EXPECT_TRUE(r["engine"]["healthy"].get<bool>()) << r.dump();
    EXPECT_NE(r["engine"]["status"].get<std::string>().find(GetParam() + " http://127.0.0.1:"),
              std::string::npos)
      << r.dump();
    EXPECT_NE(r["engine"]["status"].get<std::string>().find("serves demo/weight_v000002"),
              std::string::npos)
      << r.dump();
  }
  EXPECT_NE(node->log().find("[stitch] started (pid"), std::string::npos)
    << "the engines' output reaches the node's log";
}

TEST_P(external_engine_node_test, only_inference_and_read_only_routes_reach_the_engine) {
  publish(0, 1);
  await(0);
  struct probe {
    std::string method, target;
  };
  // Each engine's control routes as its current server names them
  // (runtime/engine/external_dialects.cpp), spellings of them, listed
  // routes under another method, and a route no engine has yet.
  std::vector<probe> blocked;
  auto add = [](std::vector<probe>& to, const char* method, std::initializer_list<const char*> ts) {
    for (const char* t : ts)
      to.push_back({method, t});
  };
  if (sglang()) {
    add(blocked, "POST",
        {"/update_weights_from_disk",
         "/update_weights_from_tensor",
         "/send_weights_to_remote_instance",
         "/init_weights_send_group_for_remote_instance",
         "/get_weights_by_name",
         "/slow_down",
         "/freeze_gc",
         "/weights_checker",
         "/clear_hicache_storage_backend",
         "/start_expert_distribution_record",
         "/dump_expert_distribution_record",
         "/open_session",
         "/close_session",
         "/update_weight_version",
         "/pause_generation",
         "/flush_cache",
         "/abort_request",
         "/shutdown",
         "/v1/responses",
         "/v1/messages",
         "/invocations",
         "/api/generate"});
    add(blocked, "GET", {"/flush_cache", "/server_info", "/get_server_info", "/start_profile"});
  } else {
    add(blocked, "POST",
        {"/collective_rpc", "/abort_requests", "/init_weight_transfer_engine",
         "/start_weight_update", "/start_draft_weight_update", "/update_weights",
         "/finish_weight_update", "/weight_checker", "/update_weight_version", "/pause", "/sleep",
         "/reset_prefix_cache", "/v1/responses", "/inference/v1/generate", "/invocations"});
    add(blocked, "GET", {"/weight_info", "/get_world_size", "/server_info", "/is_paused"});
  }
  for (const char* t : {"/a_route_added_next_year", "/v1/models/../flush_cache",
                        "/update%5Fweights_from_disk", "/v1/models/x%2F..%2Fflush_cache"})
    blocked.push_back({"POST", t});
  blocked.push_back({"POST", "/v1/models"});
  blocked.push_back({"DELETE", "/metrics"});
  std::vector<probe> allowed;
  if (sglang())
    add(allowed, "GET",
        {"/health_generate", "/get_load", "/v1/loads", "/ping", "/metrics", "/v1/models",
         "/get_model_info", "/v1/models/Qwen/Qwen3-8B"});
  else
    add(allowed, "GET", {"/load", "/ping", "/version", "/metrics", "/v1/models"});
  add(allowed, "POST", {"/tokenize", "/detokenize"});
  std::vector<std::string> engines;
  std::vector<size_t> before;
  auto replicas = pool()["replicas"];
  ASSERT_EQ(replicas.size(), 2u) << pool().dump(1) << node->log();
  for (const auto& replica : replicas) {
    std::smatch m;
    auto status = replica["engine"]["status"].get<std::string>();
    ASSERT_TRUE(std::regex_search(status, m, std::regex{"(http://127\\.0\\.0\\.1:[0-9]+)"}))
      << status;
    engines.push_back(m[1]);
    before.push_back(call(engines.back(), "GET", "/_peer/calls").body.size());
  }
  for (const auto& b : blocked) {
    auto r = call(node->gateway_port, b.method, b.target, b.method == "POST" ? "{}" : "");
    EXPECT_EQ(r.status, 403u) << b.method << " " << b.target << ": " << r.body;
    EXPECT_NE(r.body.find("RouteBlocked"), std::string::npos) << r.body;
  }
  for (const auto& a : allowed) {
    auto r = call(node->gateway_port, a.method, a.target,
                  a.target == "/tokenize" ? R"({"prompt":"hi"})"
                  : a.method == "POST"    ? R"({"tokens":[104,105]})"
                                          : "");
    EXPECT_NE(r.status, 403u) << a.method << " " << a.target << ": " << r.body;
  }
  // What reached the engines since, from their own call logs (Stitch's
  // own calls, its weight loads among them, came before).
  std::set<std::string> reached;
  for (size_t i = 0; i < engines.size(); ++i) {
    auto log = call(engines[i], "GET", "/_peer/calls").body;
    std::istringstream lines{log.substr(std::min(log.size(), before[i]))};
    for (std::string line; std::getline(lines, line);)
      reached.insert(line.substr(0, line.find(' ', line.find(' ') + 1)));
  }
  for (const auto& b : blocked)
    EXPECT_FALSE(reached.contains(b.method + " " + b.target)) << b.method << " " << b.target;
  std::string seen;
  for (const auto& r : reached)
    seen += r + "\n";
  for (const auto& a : allowed)
    EXPECT_TRUE(reached.contains(a.method + " " + a.target))
      << a.method << " " << a.target << " not among\n"
      << seen;
}

TEST_P(external_engine_node_test, a_killed_engine_is_restarted_and_resynced_while_the_node_runs) {
  publish(0, 1);
  await(0);
  publish(1, 2);
  await(1);
  // One replica's engine dies.
  auto p = pool();
  std::smatch m;
  auto status = p["replicas"][0]["engine"]["status"].get<std::string>();
  ASSERT_TRUE(std::regex_search(status, m, std::regex{"(http://127\\.0\\.0\\.1:[0-9]+)"}))
    << status;
  std::string engine_url = m[1];
  call(engine_url, "POST", "/_peer/exit");
  // Requests keep being answered (by the other replica, then by both).
  for (int i = 0; i < 20; ++i) {
    auto r =
      call(node->gateway_port, "POST", route(), body(R"("weight_version":{"min_version":1},)"));
    EXPECT_TRUE(r.status == 200u || r.status == 503u) << r.status << " " << r.body;
    if (r.status == 200u) {
      EXPECT_EQ(stamps_of(json::parse(r.body)).first, 1u);
    }
    std::this_thread::sleep_for(50ms);
  }
  bool healthy = false;
  for (int i = 0; i < 600 && !healthy; ++i) {
    auto engine = call(engine_url, "GET", "/health");
    auto now = pool();
    healthy = engine.status == 200 && now["replicas"][0]["engine"]["healthy"].get<bool>()
              && now["replicas"][1]["engine"]["healthy"].get<bool>();
    if (!healthy)
      std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(healthy) << pool().dump(1) << "\n" << node->log();
  EXPECT_NE(node->log().find("re-synced"), std::string::npos) << node->log();
  // The restarted engine serves the published version, not its boot one.
  publish(2, 3);
  await(2);
  for (int i = 0; i < 6; ++i) {
    auto r =
      call(node->gateway_port, "POST", route(), body(R"("weight_version":{"exact_version":2},)"));
    ASSERT_EQ(r.status, 200u) << r.body;
  }
}

TEST_P(external_engine_node_test, stitch_profile_drives_an_external_engine_through_the_port) {
  publish(0, 1);
  await(0);
  auto r = run(std::string{STITCH_BIN} + " --coordinator 127.0.0.1:" + node->coordinator_port
               + " profile --replica replica-0 --take-out --folded 2 --json 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.output << node->log();
  auto j = json::parse(r.output);
  ASSERT_EQ(j["steps"].size(), 6u) << j.dump(2);
  for (const auto& s : j["steps"]) {
    SCOPED_TRACE(s.dump());
    EXPECT_TRUE(s["checksum_ok"].get<bool>());
    // The engine's weights live in its own process: the verdict is the
    // stage's, which verified every tensor it wrote.
    EXPECT_EQ(s["checksum_basis"], "staged tensors");
    if (s["path"] != "empty delta") {
      EXPECT_TRUE(s["activated"].get<bool>());
      EXPECT_GT(s["preparation_s"].get<double>(), 0);
      EXPECT_GT(s["fetch_s"].get<double>(), 0) << "the export's reads are timed";
      EXPECT_GT(s["bytes_moved"].get<uint64_t>(), 0u);
    }
  }
  EXPECT_EQ(j["steps"][3]["folded"], 2);
  EXPECT_TRUE(j["steps"][5]["run_switch"].get<bool>());
  // Full and partial engine loads side by side: the delta changes every
  // tensor (a full reload); the two-tensor one is loaded alone on SGLang.
  const auto& every = j["steps"][1]["engine_load"];
  const auto& two = j["steps"][2]["engine_load"];
  ASSERT_TRUE(every.is_object() && two.is_object()) << j.dump(2);
  EXPECT_EQ(every["kind"], "full");
  EXPECT_GT(every["seconds"].get<double>(), 0);
  if (sglang()) {
    EXPECT_EQ(every["detail"], "its deltas change every tensor");
    EXPECT_EQ(two["kind"], "partial") << two.dump();
    EXPECT_EQ(two["tensors"], 2);
    EXPECT_LT(two["bytes"].get<uint64_t>(), every["bytes"].get<uint64_t>());
  } else {
    EXPECT_EQ(two["kind"], "full");
    EXPECT_NE(two["detail"].get<std::string>().find("vLLM reloads in full"), std::string::npos);
  }
  EXPECT_EQ(j["returned"]["ready"], true) << j.dump(2);
  EXPECT_EQ(j["returned"]["applied"], "demo/weight_v000000");
  await(0);
  // The engine serves the pool's weights again, not the scratch ones.
  auto ok =
    call(node->gateway_port, "POST", route(), body(R"("weight_version":{"min_version":0},)"));
  ASSERT_EQ(ok.status, 200u) << ok.body;
  auto p = pool();
  for (const auto& rep : p["replicas"])
    EXPECT_NE(rep["engine"]["status"].get<std::string>().find("serves demo/weight_v000000"),
              std::string::npos)
      << rep.dump();
}

INSTANTIATE_TEST_SUITE_P(dialects, external_engine_node_test, ::testing::Values("sglang", "vllm"),
                         [](const auto& param_info) { return param_info.param; });

} // namespace
} // namespace stitch
