#include <gtest/gtest.h>

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <regex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/counted_store_source.hpp"
#include "common/eventually.hpp"
#include "common/plans.hpp"
#include "runtime/core/chain_planner.hpp"
#include "runtime/core/checksum.hpp"
#include "runtime/engine/api_shapes.hpp"
#include "runtime/engine/external_engine.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/engine/weights.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/materialize.hpp"
#include "runtime/pipeline/publisher.hpp"
#include "runtime/pipeline/store_tensor_source.hpp"
#include "store/memory_store.hpp"
#include "transport/http_client.hpp"
#include "transport/http_server.hpp"

// The adapters against `stitch-engine-peer` (tests/engine/engine_peer.cpp),
// the in-tree stand-in for SGLang and vLLM servers.

namespace stitch::engine {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using stitch::testing::memory_store;

void nudge(pipeline::host_tensor& t, uint32_t salt, size_t every = 7) {
  for (size_t i = salt % every; i + 4 <= t.bytes.size(); i += 4 * every)
    t.bytes[i] ^= static_cast<std::byte>(1 + salt % 200);
}

const std::string greedy_body =
  R"({"text":"hello","sampling_params":{"temperature":0,"max_new_tokens":12},"return_logprob":true})";
const std::string greedy_completion = R"({"prompt":"hello","temperature":0,"max_tokens":12})";

template <class Pred>
bool eventually(Pred&& p, std::chrono::milliseconds limit = std::chrono::seconds{30}) {
  return testing::eventually(std::forward<Pred>(p), limit, std::chrono::milliseconds{50});
}

class external_engine_test : public ::testing::TestWithParam<engine_kind> {
protected:
  void SetUp() override {
    root = fs::temp_directory_path()
           / ("stitch-ext-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::create_directories(root);
    auto c = preset("tiny");
    ASSERT_TRUE(c);
    config = *c;
    auto w = random_init(config, 42);
    ASSERT_TRUE(w);
    versions.push_back(*w);
    for (uint32_t v = 1; v <= 4; ++v) {
      auto next = versions.back();
      if (v != 3) { // v3 is an empty delta
        nudge(next.at("lm_head.weight"), v);
        nudge(next.at("model.layers." + std::to_string(v % 2) + ".mlp.up_proj.weight"), v);
      }
      versions.push_back(next);
    }
    pipeline::publisher pub{db};
    for (uint64_t v = 0; v < versions.size(); ++v) {
      pipeline::publish_request r{"default", "r", v, false, false};
      r.files = {{"config.json", render_model_config(config)}};
      auto out = pub.publish(r, versions[v]);
      ASSERT_TRUE(out) << to_string(out.error());
    }
    // The engine's own boot model (what a user starts the server with).
    boot_dir = root / "boot";
    ASSERT_TRUE(pipeline::write_hf_directory(boot_dir, versions[0], default_max_shard_bytes,
                                             {{"config.json", render_model_config(config)}}));
  }

  void TearDown() override {
    engine.reset();
    if (peer)
      peer->stop();
    std::error_code ec;
    fs::remove_all(root, ec);
  }

  std::string dialect() const { return GetParam() == engine_kind::sglang ? "sglang" : "vllm"; }
  std::string generate_route() const {
    return GetParam() == engine_kind::sglang ? "/generate" : "/v1/completions";
  }
  std::string generate_body() const {
    return GetParam() == engine_kind::sglang ? greedy_body : greedy_completion;
  }

  std::string peer_command(const std::string& extra = "") const {
    return std::string{STITCH_ENGINE_PEER} + " --dialect " + dialect()
           + " --port {port} --model-dir {model_dir}" + extra;
  }

  /// Starts a peer on its own (the `engine.url` case). The port was free
  /// when picked; if another test's peer took it first, ours exits: again.
  void start_peer(const std::string& extra = "") {
    for (int attempt = 0; attempt < 5; ++attempt) {
      auto port = pick_free_port();
      ASSERT_TRUE(port);
      launch_options lo;
      lo.command = peer_command(extra);
      lo.name = "peer";
      lo.log = [](std::string_view line) { std::cerr << "peer | " << line << "\n"; };
      auto p = engine_process::start(lo, *port, boot_dir);
      ASSERT_TRUE(p) << to_string(p.error());
      peer = std::move(*p);
      peer_url = "http://127.0.0.1:" + std::to_string(*port);
      bool up =
        eventually([&] { return !peer->running() || peer_get("/_peer/calls").status == 200; });
      std::this_thread::sleep_for(std::chrono::milliseconds{100});
      if (up && peer->running() && peer->starts() == 1 && peer_get("/_peer/calls").status == 200)
        return;
      peer->stop();
    }
    FAIL() << "no peer could start";
  }

  transport::http_response peer_get(const std::string& route, const std::string& method = "GET",
                                    const std::string& body = {}) {
    auto ep = transport::parse_endpoint(peer_url);
    transport::http_client c{*ep};
    transport::http_request r;
    r.method = method;
    r.target = route;
    r.body = body;
    if (!body.empty())
      r.headers.push_back({"Content-Type", "application/json"});
    auto out = c.send(r);
    return out ? *out : transport::http_response{};
  }

  std::string calls() { return peer_get("/_peer/calls").body; }

  external_engine_options options() {
    external_engine_options o;
    o.kind = GetParam();
    o.url = peer_url;
    o.staging_dir = root / "staging";
    o.max_shard_bytes = 64 << 10; // many shards: unchanged ones are linked
    o.monitor_every = std::chrono::milliseconds{100};
    o.update_timeout = std::chrono::seconds{20};
    return o;
  }

  void make_engine(external_engine_options o) {
    auto e = external_engine::make(std::move(o));
    ASSERT_TRUE(e) << to_string(e.error());
    engine = *e;
  }

  chain_plan plan(std::optional<applied_state> applied, version_ref to,
                  std::string pool = "default") {
    auto out = stitch::testing::plan_over(db, cache, applied, to, pool);
    EXPECT_TRUE(out && std::holds_alternative<chain_plan>(*out));
    return std::get<chain_plan>(*out);
  }

  /// Stages and activates the way the replica does (pause, commit, resume).
  status activate(const chain_plan& p, tensor_source& src) {
    auto ok = engine->stage(p, false, src);
    if (ok) {
      ok = engine->pause();
      if (ok)
        ok = engine->commit();
      auto resumed = engine->resume();
      if (ok)
        ok = resumed;
    }
    if (!ok)
      std::cerr << "activating " << to_string(p.target) << ": " << to_string(ok.error()) << "\n";
    return ok;
  }

  /// What the engine answers a greedy request with, as token ids.
  std::vector<int32_t> served_tokens(const std::string& tag = "t") {
    engine_call call;
    call.tag = tag;
    call.route = generate_route();
    call.body = generate_body();
    auto reply = engine->forward(call, {}, {});
    EXPECT_TRUE(reply) << (reply ? "" : to_string(reply.error()));
    if (!reply)
      return {};
    EXPECT_EQ(reply->status, 200) << reply->body;
    auto doc = json::parse(reply->body);
    std::vector<int32_t> ids;
    if (doc.contains("output_ids"))
      return doc["output_ids"].get<std::vector<int32_t>>();
    // vLLM answers text; the byte tokenizer makes it the ids.
    for (unsigned char ch : doc["choices"][0]["text"].get<std::string>())
      ids.push_back(ch);
    return ids;
  }

  /// SGLang's greedy request answered by the built-in model on `tensors`
  /// directly (the peer seeds unseeded requests with 1).
  std::optional<generation_output> native_reference(const pipeline::tensor_set& tensors) {
    auto req = parse_api_request(api_kind::native, greedy_body);
    auto w = build_weights(config, tensors);
    if (!req || !w)
      return std::nullopt;
    req->sampling.seed = 1;
    auto out = engine::generate(**w, config, tokenizer{}, req->prompt, req->sampling);
    return out ? std::optional<generation_output>{std::move(*out)} : std::nullopt;
  }

  /// The same request answered by the built-in model on `tensors` directly.
  std::vector<int32_t> expected_tokens(const pipeline::tensor_set& tensors) {
    auto kind = GetParam() == engine_kind::sglang ? api_kind::native : api_kind::completions;
    auto req = parse_api_request(kind, generate_body());
    EXPECT_TRUE(req);
    req->sampling.seed = 1;
    auto w = build_weights(config, tensors);
    EXPECT_TRUE(w);
    auto out = engine::generate(**w, config, tokenizer{}, req->prompt, req->sampling);
    EXPECT_TRUE(out);
    if (GetParam() == engine_kind::sglang)
      return out->tokens;
    // As the answer carries it: JSON text, invalid UTF-8 replaced.
    auto text = json::parse(json(out->text).dump(-1, ' ', false, json::error_handler_t::replace))
                  .get<std::string>();
    std::vector<int32_t> ids;
    for (unsigned char ch : text)
      ids.push_back(ch);
    return ids;
  }

  /// A peer serving v0 through an adapter made with `options()` as
  /// `adjust` changes them (its versions read from `source`).
  void serve_v0(const std::function<void(external_engine_options&)>& adjust = {}) {
    start_peer();
    auto o = options();
    if (adjust)
      adjust(o);
    make_engine(std::move(o));
    ASSERT_TRUE(activate(plan(std::nullopt, {"r", 0}), source));
  }

  static inline int counter = 0;
  fs::path root;
  fs::path boot_dir;
  model_config config;
  memory_store db;
  std::vector<pipeline::tensor_set> versions;
  stitch::testing::manifest_cache cache;
  pipeline::store_tensor_source source{db, "default"};
  std::unique_ptr<engine_process> peer;
  std::string peer_url;
  std::shared_ptr<external_engine> engine;
};

TEST_P(external_engine_test, a_version_chain_is_served_exactly_with_the_engines_own_update_calls) {
  start_peer();
  make_engine(options());
  pipeline::store_tensor_source src{db, "default"};
  EXPECT_FALSE(engine->health().healthy);
  auto refused = engine->forward({0, "x", "POST", generate_route(), generate_body()}, {}, {});
  ASSERT_FALSE(refused) << "nothing verified is served before the first commit";
  EXPECT_EQ(refused.error().code, errc::engine_unavailable);

  // Anchor.
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 0}), src));
  EXPECT_TRUE(engine->health().healthy) << engine->health().detail;
  EXPECT_EQ(served_tokens(), expected_tokens(versions[0]));
  auto first_dir = engine->committed_dir();

  // One delta: only the shards holding changed tensors are written again.
  auto p1 = plan(applied_state{{"r", 0}}, {"r", 1});
  ASSERT_FALSE(p1.anchor);
  EXPECT_EQ(p1.touched.size(), 2u);
  ASSERT_TRUE(engine->stage(p1, false, src));
  // Only the shards holding changed tensors are written; the others are the
  // served version's files, linked.
  auto staged_dir = root / "staging" / "r@weight_v000001";
  size_t linked = 0;
  size_t written = 0;
  for (const auto& entry : fs::directory_iterator(staged_dir)) {
    if (entry.path().extension() != ".safetensors")
      continue;
    struct stat now {};
    struct stat before {};
    ASSERT_EQ(::stat(entry.path().c_str(), &now), 0);
    bool same = ::stat((first_dir / entry.path().filename()).c_str(), &before) == 0
                && before.st_ino == now.st_ino;
    (same ? linked : written) += 1;
  }
  EXPECT_GT(linked, 0u) << "unchanged shards are hard-linked";
  EXPECT_GT(written, 0u) << "changed shards are written";
  EXPECT_LT(written, linked) << "a two-tensor delta rewrites few shards";
  ASSERT_TRUE(engine->pause());
  ASSERT_TRUE(engine->commit());
  ASSERT_TRUE(engine->resume());
  EXPECT_EQ(served_tokens(), expected_tokens(versions[1]));
  auto second_dir = engine->committed_dir();
  ASSERT_EQ(second_dir, staged_dir);
  EXPECT_FALSE(fs::exists(first_dir)) << "staged versions no longer needed are removed";

  // A folded catch-up across an empty delta, byte-identical to an export.
  auto p4 = plan(applied_state{{"r", 1}}, {"r", 4});
  EXPECT_EQ(p4.deltas.size(), 3u);
  ASSERT_TRUE(activate(p4, src));
  EXPECT_EQ(served_tokens(), expected_tokens(versions[4]));
  auto staged = pipeline::load_hf_directory(engine->committed_dir());
  ASSERT_TRUE(staged) << to_string(staged.error());
  EXPECT_EQ(*staged, versions[4]);

  // The engine was told each version's identity, through its own routes.
  auto log = calls();
  if (GetParam() == engine_kind::sglang) {
    EXPECT_NE(log.find(R"(POST /pause_generation {"mode":"in_place"})"), std::string::npos) << log;
    EXPECT_NE(log.find("POST /update_weights_from_disk"), std::string::npos);
    EXPECT_NE(log.find(R"("weight_version":"r/weight_v000004")"), std::string::npos) << log;
    EXPECT_NE(log.find(R"("abort_all_requests":false)"), std::string::npos);
    EXPECT_NE(log.find(R"("flush_cache":false)"), std::string::npos);
    EXPECT_NE(log.find("POST /continue_generation"), std::string::npos);
    EXPECT_NE(log.find("GET /get_model_info"), std::string::npos)
      << "a 2025 server answers the old route";
  } else {
    EXPECT_NE(log.find("POST /pause?mode=keep"), std::string::npos) << log;
    EXPECT_NE(log.find(R"("method":"reload_weights")"), std::string::npos) << log;
    EXPECT_NE(log.find(R"("is_checkpoint_format":true)"), std::string::npos);
    EXPECT_NE(log.find("POST /resume"), std::string::npos);
  }
}

/// A source whose peers lend the deltas' stored frames (read from the store
/// and verified as the UCX fetch verifies them) and no whole tensors; it
/// counts what is read from the store.
class frame_lending_source final : public stitch::testing::counted_store_source, public transfer {
public:
  explicit frame_lending_source(store_backend& db) : counted_store_source(db) {}
  transfer* peers() override { return this; }
  fetch_report fetch(const version_ref&, std::span<const fetch_target> targets,
                     const std::function<void(const transfer_progress&)>&) override {
    fetch_report r;
    r.fetched.assign(targets.size(), false);
    return r;
  }
  fetch_report fetch_frames(const version_ref& ref, std::span<const fetch_target> targets,
                            const std::function<void(const transfer_progress&)>&) override {
    return frames_from_store(ref, targets);
  }
};

TEST_P(external_engine_test, a_delta_is_staged_from_the_frames_peers_lend) {
  serve_v0();
  auto p1 = plan(applied_state{{"r", 0}}, {"r", 1});
  ASSERT_FALSE(p1.anchor);
  auto m = db.read_manifest("default", {"r", 1});
  ASSERT_TRUE(m);
  ASSERT_EQ(m->frames.size(), m->touched.size());
  frame_lending_source peers{db};
  ASSERT_TRUE(activate(p1, peers));
  EXPECT_EQ(served_tokens(), expected_tokens(versions[1]));
  EXPECT_EQ(peers.frame_bytes, m->total_size) << "every frame from peers";
  for (const auto& name : m->touched)
    EXPECT_FALSE(peers.stored_reads.contains(name)) << name << " was read from the store";

  // A frame no peer gives is read from the store, the rest still from peers.
  auto p2 = plan(applied_state{{"r", 1}}, {"r", 2});
  auto m2 = db.read_manifest("default", {"r", 2});
  ASSERT_TRUE(m2);
  ASSERT_FALSE(m2->touched.empty());
  frame_lending_source some{db};
  some.withheld = m2->touched.front();
  ASSERT_TRUE(activate(p2, some));
  EXPECT_EQ(served_tokens(), expected_tokens(versions[2]));
  EXPECT_TRUE(some.stored_reads.contains(some.withheld));
  EXPECT_EQ(some.frame_bytes, m2->total_size - m2->frames.at(some.withheld).size);
}

TEST_P(external_engine_test, replicas_of_a_node_share_one_staged_copy_of_a_version) {
  start_peer();
  auto o = options();
  o.staging_dir = root / "staging" / "replica-0";
  make_engine(o);
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 1}), src));
  auto sibling_options = options();
  sibling_options.staging_dir = root / "staging" / "replica-1";
  auto sibling = external_engine::make(sibling_options);
  ASSERT_TRUE(sibling);
  ASSERT_TRUE((*sibling)->stage(plan(std::nullopt, {"r", 1}), false, src));
  size_t files = 0;
  for (const auto& entry :
       fs::directory_iterator(root / "staging" / "replica-1" / "r@weight_v000001")) {
    struct stat a {};
    struct stat b {};
    ASSERT_EQ(::stat(entry.path().c_str(), &a), 0);
    ASSERT_EQ(::stat((engine->committed_dir() / entry.path().filename()).c_str(), &b), 0);
    EXPECT_EQ(a.st_ino, b.st_ino) << entry.path();
    ++files;
  }
  EXPECT_GT(files, 3u);
}

TEST_P(external_engine_test, a_run_switch_loads_the_new_runs_weights_from_scratch) {
  start_peer();
  make_engine(options());
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 2}), src));
  auto other = random_init(config, 7);
  ASSERT_TRUE(other);
  pipeline::publisher pub{db};
  pipeline::publish_request r{"default", "b", 0, false, false};
  r.files = {{"config.json", render_model_config(config)}};
  ASSERT_TRUE(pub.publish(r, *other));
  auto p = plan(applied_state{{"r", 2}}, {"b", 0});
  EXPECT_TRUE(p.reset_to_boot);
  ASSERT_TRUE(activate(p, src));
  EXPECT_EQ(served_tokens(), expected_tokens(*other));
  EXPECT_NE(expected_tokens(*other), expected_tokens(versions[2])) << "the runs differ";
  if (GetParam() == engine_kind::sglang) {
    auto log = calls();
    EXPECT_NE(log.find(R"("weight_version":"b/weight_v000000")"), std::string::npos) << log;
  }
}

TEST_P(external_engine_test, requests_carry_the_version_namespace_and_answers_carry_stamps) {
  // A 2026 SGLang: the version is read from /model_info.
  start_peer(GetParam() == engine_kind::sglang ? " --sglang-2026" : "");
  make_engine(options());
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 0}), src));
  auto body = engine->stamp_request(generate_route(), generate_body(), {"r", 0});
  engine_call call{7, "rep-7", "POST", generate_route(), body};
  auto reply = engine->forward(call, {}, {});
  ASSERT_TRUE(reply) << to_string(reply.error());
  auto log = calls();
  const std::string field = GetParam() == engine_kind::sglang ? "extra_key" : "cache_salt";
  EXPECT_NE(log.find("\"" + field + "\":\"r/weight_v000000\""), std::string::npos) << log;
  if (GetParam() == engine_kind::sglang) {
    EXPECT_NE(log.find("GET /model_info"), std::string::npos) << log;
  }
  auto stamped = json::parse(engine->stamp_response(generate_route(), reply->body, {0, 0}, "r"));
  if (GetParam() == engine_kind::sglang) {
    EXPECT_EQ(stamped["meta_info"]["weight_version_start"], 0);
    EXPECT_EQ(stamped["meta_info"]["run_id"], "r");
    EXPECT_EQ(reply->finish_reason, stamped["meta_info"]["finish_reason"]["type"]);
  } else {
    EXPECT_EQ(stamped["weight_version_end"], 0);
    EXPECT_EQ(stamped["run_id"], "r");
  }
  // Only inference and read-only routes reach the engine: its control
  // routes, and any route it adds later, are refused naming the route.
  for (const char* route :
       GetParam() == engine_kind::sglang
         ? std::vector<const char*>{"/update_weights_from_disk", "/pause_generation",
                                    "/flush_cache", "/get_weights_by_name", "/next_year"}
         : std::vector<const char*>{"/collective_rpc", "/pause", "/sleep", "/weight_checker",
                                    "/next_year"}) {
    auto why = engine->route_refusal("POST", route);
    ASSERT_TRUE(why) << route;
    EXPECT_NE(why->find(route), std::string::npos) << *why;
  }
  EXPECT_FALSE(engine->route_refusal("GET", "/v1/models"));
  EXPECT_FALSE(engine->route_refusal("GET", "/metrics"));
  EXPECT_FALSE(engine->route_refusal("POST", "/tokenize"));
  auto wrong_method = engine->route_refusal("POST", "/v1/models");
  ASSERT_TRUE(wrong_method);
  EXPECT_NE(wrong_method->find("takes GET"), std::string::npos) << *wrong_method;
}

TEST_P(external_engine_test, token_prompts_batches_and_sampling_fields_reach_the_engine) {
  start_peer();
  make_engine(options());
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 1}), src));
  auto want = native_reference(versions[1]);
  ASSERT_TRUE(want);
  const bool sglang = GetParam() == engine_kind::sglang;
  const std::string hello_ids = "[256,104,101,108,108,111]"; // BOS "hello"
  const std::string sampling =
    R"("sampling_params":{"temperature":0,"max_new_tokens":12,"min_p":0.0,)"
    R"("repetition_penalty":1.0,"stop_token_ids":[9999]},"return_logprob":true)";
  auto native = [&](const std::string& prompt, int id) {
    auto body = engine->stamp_request("/generate", "{" + prompt + "," + sampling + "}", {"r", 1});
    return engine->forward(
      {static_cast<request_id>(id), "t-" + std::to_string(id), "POST", "/generate", body}, {}, {});
  };
  // One token prompt: the model's answer to the same text.
  auto one = native(R"("input_ids":)" + hello_ids, 20);
  ASSERT_TRUE(one) << to_string(one.error());
  ASSERT_EQ(one->status, 200) << one->body;
  auto oj = json::parse(one->body);
  ASSERT_TRUE(oj.is_object()) << one->body;
  EXPECT_EQ(oj["output_ids"].get<std::vector<int32_t>>(), want->tokens) << one->body;
  // Batches of text and of token ids: one answer per prompt, in order.
  for (const std::string& batch :
       {std::string{R"("text":["hello","hello"])"},
        std::string{R"("input_ids":[)"} + hello_ids + "," + hello_ids + "]"}) {
    auto many = native(batch, 21);
    ASSERT_TRUE(many) << to_string(many.error());
    ASSERT_EQ(many->status, 200) << many->body;
    auto mj = json::parse(many->body);
    ASSERT_TRUE(mj.is_array() && mj.size() == 2) << many->body;
    for (const auto& item : mj) {
      EXPECT_EQ(item["output_ids"].get<std::vector<int32_t>>(), want->tokens) << many->body;
      EXPECT_EQ(item["meta_info"]["finish_reason"]["type"], want->finish_reason);
    }
    auto stamped = json::parse(engine->stamp_response("/generate", many->body, {1, 1}, "r"));
    EXPECT_EQ(stamped[1]["meta_info"]["weight_version_start"], 1) << stamped.dump();
  }
  auto log = calls();
  if (sglang) {
    // SGLang's own route: the request reaches it as the client sent it.
    EXPECT_NE(log.find(R"("input_ids":)" + hello_ids), std::string::npos) << log;
    EXPECT_NE(log.find(R"("stop_token_ids":[9999])"), std::string::npos) << log;
  } else {
    // vLLM: the same prompt and every sampling field under vLLM's names.
    EXPECT_NE(log.find(R"("prompt":)" + hello_ids), std::string::npos) << log;
    EXPECT_NE(log.find(R"("prompt":[)" + hello_ids + "," + hello_ids + "]"), std::string::npos)
      << log;
    for (const char* field : {R"("max_tokens":12)", R"("min_p":0.0)", R"("repetition_penalty":1.0)",
                              R"("stop_token_ids":[9999])", R"("logprobs":0)"})
      EXPECT_NE(log.find(field), std::string::npos) << field << "\n" << log;
    // A field vLLM cannot carry is refused by name, never dropped.
    auto odd = engine->forward(
      {22, "t-22", "POST", "/generate",
       R"({"text":"hello","sampling_params":{"stop_regex":"x+","max_new_tokens":4}})"},
      {}, {});
    ASSERT_FALSE(odd);
    EXPECT_EQ(odd.error().code, errc::invalid_argument);
    EXPECT_NE(odd.error().message.find("sampling_params.stop_regex"), std::string::npos)
      << odd.error().message;
    auto both = engine->forward(
      {23, "t-23", "POST", "/generate", R"({"text":"a","input_ids":[1],"stream":false})"}, {}, {});
    ASSERT_FALSE(both);
    EXPECT_NE(both.error().message.find("not both"), std::string::npos) << both.error().message;
    // The OpenAI route passes a token prompt through as it came.
    auto completion = engine->forward(
      {24, "t-24", "POST", "/v1/completions",
       engine->stamp_request("/v1/completions",
                             R"({"prompt":)" + hello_ids + R"(,"temperature":0,"max_tokens":12})",
                             {"r", 1})},
      {}, {});
    ASSERT_TRUE(completion) << to_string(completion.error());
    EXPECT_EQ(completion->status, 200) << completion->body;
  }
}

TEST_P(external_engine_test, a_clients_cache_namespace_is_kept_within_the_versions) {
  start_peer();
  make_engine(options());
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 1}), src));
  const bool sglang = GetParam() == engine_kind::sglang;
  // SGLang's native field on /generate (vLLM's completions take it as part
  // of `cache_salt`), and each engine's own field on its OpenAI route.
  auto body = engine->stamp_request(
    "/generate",
    R"({"text":"hello","extra_key":"tenant-a","sampling_params":{"max_new_tokens":2}})", {"r", 1});
  auto reply = engine->forward({30, "t-30", "POST", "/generate", body}, {}, {});
  ASSERT_TRUE(reply) << to_string(reply.error());
  ASSERT_EQ(reply->status, 200) << reply->body;
  auto own = engine->stamp_request("/v1/completions",
                                   std::string{R"({"prompt":"hello","max_tokens":2,")"}
                                     + (sglang ? "extra_key" : "cache_salt") + R"(":"tenant-b"})",
                                   {"r", 1});
  auto second = engine->forward({31, "t-31", "POST", "/v1/completions", own}, {}, {});
  ASSERT_TRUE(second) << to_string(second.error());
  auto log = calls();
  const std::string field = sglang ? "extra_key" : "cache_salt";
  EXPECT_NE(log.find("\"" + field + "\":\"r/weight_v000001:tenant-a\""), std::string::npos) << log;
  EXPECT_NE(log.find("\"" + field + "\":\"r/weight_v000001:tenant-b\""), std::string::npos) << log;
}

TEST_P(external_engine_test, the_ports_generate_returns_the_engines_tokens_and_logprobs) {
  start_peer();
  make_engine(options());
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 1}), src));
  generation_request r;
  r.id = 3;
  r.prompt = "hello";
  r.sampling.temperature = 0;
  r.sampling.max_new_tokens = 12;
  r.return_logprob = true;
  auto got = engine->generate(r, {});
  ASSERT_TRUE(got) << to_string(got.error());
  auto want = native_reference(versions[1]);
  ASSERT_TRUE(want);
  EXPECT_EQ(got->tokens, want->tokens);
  ASSERT_EQ(got->logprobs.size(), want->logprobs.size());
  for (size_t i = 0; i < want->logprobs.size(); ++i)
    EXPECT_NEAR(got->logprobs[i], want->logprobs[i], 1e-6);
  EXPECT_EQ(got->finish == finish_reason::length ? "length" : "stop", want->finish_reason);
}

TEST_P(external_engine_test, a_stream_passes_through_event_by_event) {
  start_peer();
  make_engine(options());
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 0}), src));
  std::string body = generate_body();
  body.insert(1, R"("stream":true,)");
  std::vector<std::string> events;
  auto reply = engine->forward({1, "s-1", "POST", generate_route(), body},
                               [&](std::string ev) { events.push_back(std::move(ev)); }, {});
  ASSERT_TRUE(reply) << to_string(reply.error());
  EXPECT_TRUE(reply->stream);
  EXPECT_GT(events.size(), 2u);
  for (const auto& ev : events)
    EXPECT_TRUE(json::parse(ev).is_object()) << ev;
  auto last = json::parse(reply->body);
  EXPECT_FALSE(reply->finish_reason.empty()) << reply->body;
  EXPECT_EQ(reply->body.find("[DONE]"), std::string::npos);
}

TEST_P(external_engine_test, a_failed_update_takes_the_engine_out_until_a_rebuild_resyncs_it) {
  start_peer();
  auto o = options();
  make_engine(o);
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 0}), src));
  peer_get("/_peer/fail_updates?n=1", "POST");
  auto failed = activate(plan(applied_state{{"r", 0}}, {"r", 1}), src);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code, errc::activation_failed);
  // SGLang says why; vLLM's failing worker call answers a bare 500.
  EXPECT_NE(failed.error().message.find(GetParam() == engine_kind::sglang ? "injected failure"
                                                                          : "answered 500"),
            std::string::npos)
    << failed.error().message;
  // The rebuild the replica runs: everything from the last good version.
  ASSERT_TRUE(engine->reset_to_boot({"r", 0}, src));
  EXPECT_TRUE(engine->health().healthy);
  EXPECT_EQ(served_tokens(), expected_tokens(versions[0]));
  ASSERT_TRUE(activate(plan(applied_state{{"r", 0}}, {"r", 2}), src));
  EXPECT_EQ(served_tokens(), expected_tokens(versions[2]));
}

TEST_P(external_engine_test, a_hung_update_times_out_instead_of_hanging_the_replica) {
  start_peer();
  auto o = options();
  o.update_timeout = std::chrono::milliseconds{1500};
  make_engine(o);
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 0}), src));
  peer_get("/_peer/hang_updates?n=1", "POST");
  auto t0 = std::chrono::steady_clock::now();
  auto failed = activate(plan(applied_state{{"r", 0}}, {"r", 1}), src);
  ASSERT_FALSE(failed);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds{15});
  EXPECT_FALSE(engine->health().healthy);
  EXPECT_NE(engine->health().detail.find("timed out"), std::string::npos)
    << engine->health().detail;
  auto rebuilt = engine->reset_to_boot({"r", 1}, src);
  ASSERT_TRUE(rebuilt) << to_string(rebuilt.error());
  EXPECT_EQ(served_tokens(), expected_tokens(versions[1]));
}

TEST_P(external_engine_test, garbage_answers_and_a_dead_engine_are_clear_errors) {
  start_peer();
  make_engine(options());
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 0}), src));
  peer_get("/_peer/garbage?n=1", "POST");
  auto garbage = engine->forward({2, "g", "POST", generate_route(), generate_body()}, {}, {});
  ASSERT_FALSE(garbage);
  EXPECT_NE(garbage.error().message.find("not JSON"), std::string::npos) << garbage.error().message;
  peer->kill_now();
  auto dead = engine->forward({3, "d", "POST", generate_route(), generate_body()}, {}, {});
  ASSERT_FALSE(dead);
  EXPECT_EQ(dead.error().code, errc::engine_unavailable);
  ASSERT_TRUE(eventually([&] { return !engine->health().healthy; }));
  // The peer's supervisor restarts it from the boot model: the monitor loads
  // the activated version into it again before it serves.
  ASSERT_TRUE(eventually([&] { return engine->health().healthy; }, std::chrono::seconds{60}))
    << engine->health().detail;
  EXPECT_EQ(served_tokens(), expected_tokens(versions[0]));
}

/// What only SGLang can be checked for: it reports the version it serves.
class sglang_engine_test : public external_engine_test {};

/// vLLM only: `vllm serve` has no `/generate`.
class vllm_engine_test : public external_engine_test {};

TEST_P(vllm_engine_test, sglang_generate_is_served_through_completions_in_sglangs_shape) {
  start_peer();
  make_engine(options());
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 2}), src));
  auto body = engine->stamp_request("/generate", greedy_body, {"r", 2});
  auto reply = engine->forward({8, "v-8", "POST", "/generate", body}, {}, {});
  ASSERT_TRUE(reply) << to_string(reply.error());
  ASSERT_EQ(reply->status, 200) << reply->body;
  auto doc = json::parse(reply->body);
  // The same tokens the built-in model makes for SGLang's request.
  auto want = native_reference(versions[2]);
  ASSERT_TRUE(want);
  EXPECT_EQ(doc["output_ids"].get<std::vector<int32_t>>(), want->tokens);
  EXPECT_EQ(doc["meta_info"]["finish_reason"]["type"], want->finish_reason);
  EXPECT_EQ(reply->finish_reason, want->finish_reason);
  ASSERT_EQ(doc["meta_info"]["output_token_logprobs"].size(), want->logprobs.size());
  for (size_t i = 0; i < want->logprobs.size(); ++i) {
    EXPECT_NEAR(doc["meta_info"]["output_token_logprobs"][i][0].get<double>(), want->logprobs[i],
                1e-6);
    EXPECT_EQ(doc["meta_info"]["output_token_logprobs"][i][1], want->tokens[i]);
  }
  auto log = calls();
  EXPECT_NE(log.find("POST /v1/completions"), std::string::npos) << log;
  EXPECT_NE(log.find(R"("cache_salt":"r/weight_v000002")"), std::string::npos) << log;
  EXPECT_EQ(log.find("POST /generate"), std::string::npos) << "vLLM has no /generate";
  auto stamped = json::parse(engine->stamp_response("/generate", reply->body, {2, 2}, "r"));
  EXPECT_EQ(stamped["meta_info"]["weight_version_start"], 2);

  // A stream: SGLang's cumulative events, the last with the finish reason.
  std::string streamed = greedy_body;
  streamed.insert(1, R"("stream":true,)");
  std::vector<json> events;
  auto last = engine->forward({9, "v-9", "POST", "/generate", streamed},
                              [&](std::string ev) { events.push_back(json::parse(ev)); }, {});
  ASSERT_TRUE(last) << to_string(last.error());
  ASSERT_TRUE(last->stream);
  ASSERT_GT(events.size(), 2u);
  for (size_t i = 1; i < events.size(); ++i) {
    auto before = events[i - 1]["text"].get<std::string>();
    EXPECT_EQ(events[i]["text"].get<std::string>().rfind(before, 0), 0u) << "cumulative text";
    EXPECT_TRUE(events[i]["meta_info"]["finish_reason"].is_null());
  }
  auto end = json::parse(last->body);
  EXPECT_EQ(end["output_ids"].get<std::vector<int32_t>>(), want->tokens);
  EXPECT_EQ(end["meta_info"]["finish_reason"]["type"], want->finish_reason);

  // Counts of the wrong types from the engine are left out, never a throw.
  peer_get("/_peer/odd_usage?n=1", "POST");
  auto odd = engine->forward({10, "v-10", "POST", "/generate", body}, {}, {});
  ASSERT_TRUE(odd) << to_string(odd.error());
  auto oj = json::parse(odd->body);
  EXPECT_TRUE(oj["meta_info"]["prompt_tokens"].is_null()) << odd->body;
  EXPECT_EQ(oj["meta_info"]["completion_tokens"], want->tokens.size()) << odd->body;
}

TEST_P(vllm_engine_test, its_weight_version_routes_name_and_verify_each_version) {
  start_peer();
  make_engine(options());
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 1}), src));
  auto log = calls();
  EXPECT_NE(log.find(R"(POST /update_weight_version {"new_version":"r/weight_v000001"})"),
            std::string::npos)
    << log;
  EXPECT_NE(log.find("GET /weight_info"), std::string::npos) << log;
  EXPECT_TRUE(engine->verifies_versions());
  EXPECT_EQ(engine->health().detail.find("unverified"), std::string::npos)
    << engine->health().detail;
  // Someone else names other weights behind Stitch's back: the monitor sees
  // it, answers are refused (never stamped) until the activated version is
  // loaded and named again.
  // (Its reloads fail for a while, so that the refusal can be seen.)
  peer_get("/_peer/fail_updates?n=1000000", "POST");
  auto rogue = peer_get("/update_weight_version", "POST", R"({"new_version":"rogue"})");
  ASSERT_EQ(rogue.status, 200u) << rogue.body;
  ASSERT_TRUE(eventually([&] { return !engine->health().healthy; })) << engine->health().detail;
  auto refused = engine->forward({40, "t-40", "POST", generate_route(), generate_body()}, {}, {});
  ASSERT_FALSE(refused) << "an engine that reports another version must not be stamped";
  peer_get("/_peer/fail_updates?n=0", "POST");
  ASSERT_TRUE(eventually([&] {
    return engine->health().healthy
           && json::parse(peer_get("/weight_info").body)["weight_version"] == "r/weight_v000001";
  }))
    << engine->health().detail;
  EXPECT_EQ(served_tokens(), expected_tokens(versions[1]));
}

TEST_P(vllm_engine_test,
       a_vllm_without_weight_version_routes_is_trusted_on_its_reload_and_says_so) {
  start_peer(" --vllm-2025");
  make_engine(options());
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 1}), src));
  EXPECT_FALSE(engine->verifies_versions());
  auto h = engine->health();
  EXPECT_TRUE(h.healthy) << h.detail;
  EXPECT_NE(h.detail.find("unverified: this vLLM has no weight-version routes"), std::string::npos)
    << h.detail;
  EXPECT_EQ(served_tokens(), expected_tokens(versions[1]));
}

TEST_P(sglang_engine_test, loads_name_their_format_and_keep_the_pause_until_stitch_resumes) {
  // A server launched with --load-format dummy (a common RL launch) loads
  // random weights unless the update names its format.
  start_peer(" --load-format dummy");
  make_engine(options());
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 1}), src));
  EXPECT_EQ(served_tokens(), expected_tokens(versions[1]));
  auto log = calls();
  EXPECT_NE(log.find(R"("keep_pause":true)"), std::string::npos) << log;
  EXPECT_NE(log.find(R"("load_format":"safetensors")"), std::string::npos) << log;
  // The peer is faithful: without the format, the same load is noise.
  ASSERT_EQ(
    peer_get("/update_weights_from_disk", "POST",
             json{{"model_path", boot_dir.string()}, {"weight_version", "r/weight_v000001"}}.dump())
      .status,
    200u);
  EXPECT_NE(served_tokens(), expected_tokens(versions[0]));
}

/// The tensor names a folder of safetensors holds.
std::set<std::string> tensors_in(const fs::path& dir) {
  std::set<std::string> names;
  auto ckpt = pipeline::open_hf_directory(dir);
  if (ckpt)
    for (const auto& [name, t] : ckpt->tensors)
      names.insert(name);
  return names;
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

TEST_P(sglang_engine_test, a_delta_touching_few_tensors_is_loaded_alone_and_read_back) {
  serve_v0();
  auto first = engine->last_load();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->kind, "full");
  EXPECT_EQ(first->detail, "built from its anchor");
  EXPECT_EQ(first->tensors, versions[0].size());

  // v1 changes 2 of the model's tensors: the engine is given those two.
  auto p1 = plan(applied_state{{"r", 0}}, {"r", 1});
  ASSERT_EQ(p1.touched.size(), 2u);
  ASSERT_GT(versions[0].size(), 10u);
  auto before = calls();
  ASSERT_TRUE(activate(p1, source));
  auto partial_dir = root / "staging" / "r@weight_v000001@partial";
  EXPECT_EQ(tensors_in(partial_dir), p1.touched);
  auto load = engine->last_load();
  ASSERT_TRUE(load);
  EXPECT_EQ(load->kind, "partial") << load->detail;
  EXPECT_EQ(load->tensors, 2u);
  EXPECT_EQ(load->bytes, versions[1].at("lm_head.weight").bytes.size()
                           + versions[1].at("model.layers.1.mlp.up_proj.weight").bytes.size());
  auto log = calls().substr(before.size());
  EXPECT_NE(log.find(R"("model_path":")" + partial_dir.string() + "\""), std::string::npos) << log;
  EXPECT_EQ(occurrences(log, "POST /get_weights_by_name"), 2u) << log;
  for (const auto& name : p1.touched)
    EXPECT_NE(log.find(R"("name":")" + name + "\""), std::string::npos) << name << "\n" << log;
  // The engine serves v1 exactly: the two tensors over what it had.
  EXPECT_EQ(served_tokens(), expected_tokens(versions[1]));

  // A catch-up across an empty delta: the union of what changed, alone.
  auto p4 = plan(applied_state{{"r", 1}}, {"r", 4});
  ASSERT_TRUE(activate(p4, source));
  load = engine->last_load();
  ASSERT_TRUE(load);
  EXPECT_EQ(load->kind, "partial");
  EXPECT_EQ(load->tensors, p4.touched.size());
  EXPECT_EQ(served_tokens(), expected_tokens(versions[4]));
  EXPECT_FALSE(fs::exists(partial_dir)) << "a partial folder goes with its version";
  // What a full load of the committed folder gives is the same model.
  auto full = pipeline::load_hf_directory(engine->committed_dir());
  ASSERT_TRUE(full);
  EXPECT_EQ(*full, versions[4]);
}

TEST_P(sglang_engine_test, a_tensor_the_load_corrupted_is_caught_by_the_read_back) {
  serve_v0();
  ASSERT_EQ(peer_get("/_peer/corrupt_loads?tensor=lm_head.weight", "POST").status, 200u);
  auto p1 = plan(applied_state{{"r", 0}}, {"r", 1});
  ASSERT_TRUE(engine->stage(p1, false, source));
  ASSERT_TRUE(engine->pause());
  auto ok = engine->commit();
  ASSERT_FALSE(ok) << "a load that changed a tensor is never served";
  EXPECT_EQ(ok.error().code, errc::checksum_mismatch);
  EXPECT_NE(ok.error().message.find("tensor 'lm_head.weight'"), std::string::npos)
    << ok.error().message;
  auto h = engine->health();
  EXPECT_FALSE(h.healthy) << "out of rotation until rebuilt";
  EXPECT_NE(h.detail.find("lm_head.weight"), std::string::npos) << h.detail;
  // Rebuilt in full once the engine loads faithfully again.
  ASSERT_EQ(peer_get("/_peer/corrupt_loads", "POST").status, 200u);
  ASSERT_TRUE(engine->reset_to_boot({"r", 1}, source));
  EXPECT_TRUE(engine->health().healthy) << engine->health().detail;
  EXPECT_EQ(engine->last_load()->kind, "full");
  EXPECT_EQ(served_tokens(), expected_tokens(versions[1]));
}

TEST_P(sglang_engine_test, a_partial_folder_changed_on_disk_after_staging_is_never_served) {
  serve_v0();
  ASSERT_TRUE(engine->stage(plan(applied_state{{"r", 0}}, {"r", 1}), false, source));
  // The staged bytes change under the adapter (a bad disk, a stray writer):
  // the engine loads them and reads back the same wrong bytes, but the
  // staged tensor no longer has its manifest's checksum.
  auto dir = root / "staging" / "r@weight_v000001@partial";
  auto ckpt = pipeline::open_hf_directory(dir);
  ASSERT_TRUE(ckpt);
  const auto& t = ckpt->tensors.at("lm_head.weight");
  {
    std::fstream f{dir / t.file, std::ios::in | std::ios::out | std::ios::binary};
    f.seekg(static_cast<std::streamoff>(t.offset));
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(static_cast<std::streamoff>(t.offset));
    f.write(&c, 1);
  }
  ASSERT_TRUE(engine->pause());
  auto ok = engine->commit();
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error().code, errc::checksum_mismatch);
  EXPECT_NE(ok.error().message.find("'lm_head.weight'"), std::string::npos) << ok.error().message;
  EXPECT_FALSE(engine->health().healthy);
}

TEST_P(sglang_engine_test, an_engine_that_cannot_read_tensors_back_gets_full_reloads) {
  serve_v0();
  ASSERT_EQ(peer_get("/_peer/no_readback", "POST").status, 200u);
  ASSERT_TRUE(activate(plan(applied_state{{"r", 0}}, {"r", 1}), source));
  auto load = engine->last_load();
  ASSERT_TRUE(load);
  EXPECT_EQ(load->kind, "full");
  EXPECT_NE(load->detail.find("cannot read tensor"), std::string::npos) << load->detail;
  EXPECT_EQ(served_tokens(), expected_tokens(versions[1]));
  // Later versions are not tried partially again.
  ASSERT_TRUE(activate(plan(applied_state{{"r", 1}}, {"r", 2}), source));
  EXPECT_FALSE(fs::exists(root / "staging" / "r@weight_v000002@partial"));
  EXPECT_NE(engine->last_load()->detail.find("partial reloads are off"), std::string::npos);
  EXPECT_EQ(served_tokens(), expected_tokens(versions[2]));
}

TEST_P(sglang_engine_test, changed_tensors_over_the_partial_limit_are_loaded_in_full) {
  serve_v0([](external_engine_options& o) { o.partial_reload_max_bytes = 1024; });
  ASSERT_TRUE(activate(plan(applied_state{{"r", 0}}, {"r", 1}), source));
  auto load = engine->last_load();
  ASSERT_TRUE(load);
  EXPECT_EQ(load->kind, "full");
  EXPECT_NE(load->detail.find("more than engine.partial_reload_max_bytes (1024)"),
            std::string::npos)
    << load->detail;
  EXPECT_EQ(calls().find("/get_weights_by_name"), std::string::npos);
  EXPECT_EQ(served_tokens(), expected_tokens(versions[1]));
}

TEST_P(vllm_engine_test, reloads_in_full_and_says_why) {
  serve_v0();
  ASSERT_TRUE(activate(plan(applied_state{{"r", 0}}, {"r", 1}), source));
  auto load = engine->last_load();
  ASSERT_TRUE(load);
  EXPECT_EQ(load->kind, "full");
  EXPECT_NE(load->detail.find("layerwise reload"), std::string::npos) << load->detail;
  EXPECT_EQ(load->tensors, versions[1].size());
  EXPECT_FALSE(fs::exists(root / "staging" / "r@weight_v000001@partial"));
  EXPECT_EQ(served_tokens(), expected_tokens(versions[1]));
}

TEST_P(external_engine_test, a_launched_engine_whose_port_was_taken_meanwhile_starts_elsewhere) {
  auto o = options();
  o.url.clear();
  launch_options lo;
  lo.command = peer_command();
  lo.name = "replica-0";
  o.launch = lo;
  make_engine(o);
  // Before the first activation another listener of the node takes the
  // engine's port, and answers health checks there (as the status surface
  // does): the adapter must not take it for its engine.
  std::smatch m;
  const std::string before = engine->describe();
  ASSERT_TRUE(std::regex_search(before, m, std::regex{":([0-9]+)$"})) << before;
  transport::http_server squatter{
    {}, [](transport::server_request, std::shared_ptr<transport::http_responder> out) {
      transport::server_response r;
      r.status = 200;
      out->send(std::move(r));
    }};
  ASSERT_TRUE(squatter.listen("127.0.0.1", static_cast<uint16_t>(std::stoi(m[1]))));
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 1}), src));
  EXPECT_NE(engine->describe(), before);
  EXPECT_EQ(served_tokens(), expected_tokens(versions[1]));
  squatter.stop();
}

TEST_P(external_engine_test, a_launched_engine_that_answers_503_while_starting_is_waited_for) {
  auto o = options();
  o.url.clear();
  launch_options lo;
  lo.command = peer_command(" --starting-ms 1500");
  lo.name = "replica-0";
  o.launch = lo;
  make_engine(o);
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 1}), src));
  EXPECT_TRUE(engine->health().healthy) << engine->health().detail;
  EXPECT_EQ(served_tokens(), expected_tokens(versions[1]));
}

TEST_P(sglang_engine_test, weights_loaded_behind_its_back_are_never_stamped_and_are_replaced) {
  start_peer();
  make_engine(options());
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 1}), src));
  // Someone else loads the boot model into the engine, under another name.
  auto rogue =
    peer_get("/update_weights_from_disk", "POST",
             json{{"model_path", boot_dir.string()}, {"weight_version", "rogue"}}.dump());
  ASSERT_EQ(rogue.status, 200u) << rogue.body;
  auto refused = engine->forward({5, "x", "POST", generate_route(), generate_body()}, {}, {});
  ASSERT_FALSE(refused) << "an answer of other weights must not be stamped";
  EXPECT_NE(refused.error().message.find("rogue"), std::string::npos) << refused.error().message;
  // The monitor loads the activated version again.
  ASSERT_TRUE(eventually([&] { return engine->health().healthy; })) << engine->health().detail;
  EXPECT_EQ(served_tokens(), expected_tokens(versions[1]));
}

TEST_P(sglang_engine_test, an_adapter_stopped_during_a_hung_resync_stops_at_once) {
  start_peer();
  auto o = options();
  o.update_timeout = std::chrono::seconds{120};
  make_engine(o);
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 0}), src));
  ASSERT_EQ(peer_get("/update_weights_from_disk", "POST",
                     json{{"model_path", boot_dir.string()}, {"weight_version", "rogue"}}.dump())
              .status,
            200u);
  peer_get("/_peer/hang_updates?n=1", "POST");
  // The monitor's re-sync now waits on an update that never answers.
  ASSERT_TRUE(eventually([&] {
    return calls().find("\"weight_version\":\"r/weight_v000000\"")
           != calls().rfind("\"weight_version\":\"r/weight_v000000\"");
  }))
    << calls();
  auto t0 = std::chrono::steady_clock::now();
  engine.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds{10});
}

TEST_P(external_engine_test, a_launched_engine_starts_from_the_staged_version_and_is_restarted) {
  auto o = options();
  o.url.clear();
  launch_options lo;
  lo.command = peer_command();
  lo.name = "replica-0";
  lo.min_backoff = std::chrono::milliseconds{100};
  std::atomic<int> lines{0};
  lo.log = [&](std::string_view) { ++lines; };
  o.launch = lo;
  make_engine(o);
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_EQ(engine->process(), nullptr) << "nothing starts before there is a version";
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 0}), src));
  ASSERT_NE(engine->process(), nullptr);
  EXPECT_EQ(engine->process()->starts(), 1u);
  EXPECT_GT(lines.load(), 0) << "the engine's output reaches the log";
  ASSERT_TRUE(activate(plan(applied_state{{"r", 0}}, {"r", 2}), src));
  EXPECT_EQ(served_tokens(), expected_tokens(versions[2]));
  engine->process()->kill_now();
  ASSERT_TRUE(eventually([&] { return engine->process()->starts() == 2; }));
  ASSERT_TRUE(eventually([&] { return engine->health().healthy; }, std::chrono::seconds{60}))
    << engine->health().detail;
  EXPECT_EQ(served_tokens(), expected_tokens(versions[2]))
    << "the restarted engine serves the activated version";
}

TEST_P(external_engine_test, a_config_json_that_changes_the_architecture_is_refused) {
  start_peer();
  make_engine(options());
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 0}), src));
  model_config other = config;
  other.rope_theta = 500000.0;
  pipeline::publisher pub{db};
  pipeline::publish_request r{"default", "r", 5, false, false};
  r.files = {{"config.json", render_model_config(other)}};
  ASSERT_TRUE(pub.publish(r, versions[4]));
  auto p = plan(applied_state{{"r", 0}}, {"r", 5});
  auto refused = engine->stage(p, false, src);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, errc::invalid_argument);
  EXPECT_NE(refused.error().message.find("rope_theta"), std::string::npos)
    << refused.error().message;
  EXPECT_TRUE(engine->health().healthy) << "the engine keeps serving";
}

TEST_P(external_engine_test, a_caller_going_away_aborts_the_engine_request) {
  start_peer();
  make_engine(options());
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(activate(plan(std::nullopt, {"r", 0}), src));
  // Paused engines hold requests: this one waits until its caller leaves.
  ASSERT_TRUE(engine->pause());
  std::atomic<bool> gone{false};
  std::thread leave{[&] {
    std::this_thread::sleep_for(std::chrono::milliseconds{300});
    gone = true;
  }};
  auto t0 = std::chrono::steady_clock::now();
  auto out = engine->forward({4, "rep-4", "POST", generate_route(), generate_body()}, {},
                             [&] { return gone.load(); });
  leave.join();
  ASSERT_FALSE(out);
  EXPECT_NE(out.error().message.find("went away"), std::string::npos) << out.error().message;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds{10});
  ASSERT_TRUE(engine->resume());
  if (GetParam() == engine_kind::sglang) {
    auto log = calls();
    EXPECT_NE(log.find(R"(POST /abort_request {"rid":"stitch:rep-4:"})"), std::string::npos) << log;
  }
}

INSTANTIATE_TEST_SUITE_P(sglang, sglang_engine_test, ::testing::Values(engine_kind::sglang),
                         [](const auto& param_info) {
                           return std::string{to_string(param_info.param)};
                         });

INSTANTIATE_TEST_SUITE_P(vllm, vllm_engine_test, ::testing::Values(engine_kind::vllm),
                         [](const auto& param_info) {
                           return std::string{to_string(param_info.param)};
                         });

INSTANTIATE_TEST_SUITE_P(dialects, external_engine_test,
                         ::testing::Values(engine_kind::sglang, engine_kind::vllm),
                         [](const auto& param_info) {
                           return std::string{to_string(param_info.param)};
                         });

TEST(launch_command, placeholders_are_filled_and_quoted) {
  auto cmd = expand_launch_command("serve --port {port} --gpus {gpu} --model {model_dir} {{x}}",
                                   31000, {0, 3}, "/tmp/a b");
  ASSERT_TRUE(cmd) << to_string(cmd.error());
  EXPECT_EQ(*cmd, "serve --port 31000 --gpus '0,3' --model '/tmp/a b' {x}");
  auto bad = expand_launch_command("serve {modeldir}", 1, {}, "/m");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("modeldir"), std::string::npos);
  EXPECT_FALSE(expand_launch_command("serve {port", 1, {}, "/m"));
  auto quoted = expand_launch_command("x {model_dir}", 1, {}, "/it's");
  ASSERT_TRUE(quoted);
  EXPECT_EQ(*quoted, R"(x '/it'\''s')");
}

} // namespace
} // namespace stitch::engine
