// The replica actor on real threads: CAF's work-stealing scheduler, worker
// pools, the built-in engine, bytes fetched through the store actor. After
// every path to a version (cold start from the anchor, a delta, a folded
// catch-up, a run switch) the replica's greedy generations are token-for-token
// and logprob-for-logprob those of a fresh engine loaded from `stitch export`
// of that version — also while other requests share the decode batch.

#include <gtest/gtest.h>

#include <caf/all.hpp>

#include <thread>

#include <nlohmann/json.hpp>

#include "actors/replica.hpp"
#include "actors/store.hpp"
#include "actors/store_client.hpp"
#include "runtime/engine/builtin_engine.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/node/system_config.hpp"
#include "runtime/store/hf_directory.hpp"
#include "runtime/store/materialize.hpp"
#include "runtime/store/publisher.hpp"
#include "runtime/store/rocksdb_store.hpp"
#include "runtime/store/store_tensor_source.hpp"
#include "store/store_fixtures.hpp"

namespace stitch {
namespace {

using namespace std::chrono_literals;
using stitch::testing::temp_dir;

caf::actor_system_config& threaded(caf::actor_system_config& cfg) {
  register_stitch_types(cfg);
  cfg.set("logger.file-verbosity", caf::atom("quiet"));
  return cfg;
}

void nudge(store::host_tensor& t, uint32_t salt) {
  for (size_t i = salt % 5; i + 4 <= t.bytes.size(); i += 4 * 5)
    t.bytes[i + 2] ^= static_cast<std::byte>(1 + salt % 11);
}

class replica_integration_test : public ::testing::Test {
protected:
  replica_integration_test() : sys(threaded(cfg)), self(sys) {
    auto opened = store::open_rocksdb_store((dir.path() / "db").string());
    EXPECT_TRUE(opened);
    backend = std::shared_ptr<store_backend>{std::move(*opened)};
    store = sys.spawn<caf::detached>(store_service, backend, dir.path() / "spool");
    config = *engine::preset("tiny");
    pub = std::make_unique<store::publisher>(*backend);
    remote = std::make_shared<remote_store>(sys, store);
  }

  ~replica_integration_test() override {
    self->send_exit(replica, caf::exit_reason::user_shutdown);
    self->send_exit(store, caf::exit_reason::user_shutdown);
  }

  store::tensor_set weights_of(const std::string& run, uint64_t v) {
    auto w = *engine::random_init(config, run == "r" ? 42 : 99);
    for (uint64_t i = 1; i <= v; ++i) {
      nudge(w.at("lm_head.weight"), static_cast<uint32_t>(i));
      nudge(w.at("model.layers." + std::to_string(i % 2) + ".self_attn.q_proj.weight"),
            static_cast<uint32_t>(i));
    }
    return w;
  }

  void publish(const std::string& run, uint64_t v, bool notify) {
    auto r = pub->publish({pool, run, v, false, false}, weights_of(run, v));
    ASSERT_TRUE(r) << to_string(r.error());
    if (notify)
      caf::anon_send(store, atom::notify_v, pool);
  }

  void start() {
    replica_options o;
    o.pool = pool;
    o.backstop = 200ms;
    replica_deps d;
    d.store = store;
    d.make_engine = [this]() -> result<std::shared_ptr<engine_port>> {
      auto e = std::make_shared<engine::builtin_engine>(config);
      std::lock_guard guard{engines_mutex};
      engines.push_back(e);
      return std::shared_ptr<engine_port>{e};
    };
    // Bytes travel through the store actor, as for a replica on another node.
    d.bytes = std::make_shared<store::store_tensor_source>(*remote, pool);
    d.reconcile_worker = std::make_shared<worker_pool>(1, "reconcile");
    d.request_workers = std::make_shared<worker_pool>(8, "generate");
    replica = sys.spawn(replica_service, o, d);
  }

  replica_info info() {
    replica_info out;
    self->request(replica, caf::infinite, atom::server_info_v)
      .receive([&](const replica_info& i) { out = i; },
               [&](const caf::error& e) { ADD_FAILURE() << sys.render(e); });
    return out;
  }

  /// Polls server_info until `applied` is reached (a bound, not a speed check).
  void await_applied(const std::string& applied) {
    auto deadline = std::chrono::steady_clock::now() + 120s;
    replica_info i;
    while (std::chrono::steady_clock::now() < deadline) {
      i = info();
      if (i.ready && i.applied == applied)
        return;
      std::this_thread::sleep_for(5ms);
    }
    FAIL() << "never applied " << applied << "; at " << i.applied << " " << i.sync_state << " "
           << i.reason;
  }

  static replica_call call(uint64_t key, const std::string& prompt,
                           const std::string& sampling = R"("temperature":0,"max_new_tokens":16)") {
    replica_call c;
    c.key = key;
    c.route = "/generate";
    nlohmann::json body;
    body["text"] = prompt;
    body["sampling_params"] = nlohmann::json::parse("{" + sampling + "}");
    body["return_logprob"] = true;
    c.body = body.dump();
    return c;
  }

  static std::vector<int32_t> tokens_of(const replica_answer& a) {
    return nlohmann::json::parse(a.body)["output_ids"].get<std::vector<int32_t>>();
  }

  static std::vector<float> logprobs_of(const replica_answer& a) {
    std::vector<float> out;
    auto doc = nlohmann::json::parse(a.body);
    for (const auto& lp : doc["meta_info"]["output_token_logprobs"])
      out.push_back(lp[0].get<float>());
    return out;
  }

  engine::generation_output exported_reference(const version_ref& ref, const std::string& prompt) {
    auto out_dir = dir.path() / ("export-" + ref.run_id + std::to_string(ref.version));
    EXPECT_TRUE(store::export_version(*backend, pool, ref, out_dir));
    auto tensors = store::load_hf_directory(out_dir);
    EXPECT_TRUE(tensors);
    auto w = engine::build_weights(config, *tensors);
    EXPECT_TRUE(w);
    engine::sampling_options o;
    o.max_tokens = 16;
    auto out = engine::generate(**w, config, engine::tokenizer{}, prompt, o);
    EXPECT_TRUE(out);
    return *out;
  }

  /// A greedy request alone, then again with four sampled requests sharing
  /// its batch: both equal the exported reference.
  void expect_exact(const version_ref& ref) {
    SCOPED_TRACE(to_string(ref));
    const std::string prompt = "reward is " + std::to_string(ref.version);
    auto want = exported_reference(ref, prompt);
    replica_answer alone;
    self->request(replica, caf::infinite, atom::generate_v, call(++key, prompt))
      .receive([&](const replica_answer& r) { alone = r; },
               [&](const caf::error& e) { ADD_FAILURE() << sys.render(e); });
    ASSERT_EQ(alone.status, 200) << alone.body;
    EXPECT_EQ(alone.run_id, ref.run_id);
    EXPECT_EQ(alone.weight_version_start, ref.version);
    EXPECT_EQ(alone.weight_version_end, ref.version);
    EXPECT_EQ(tokens_of(alone), want.tokens);
    EXPECT_EQ(logprobs_of(alone), want.logprobs);

    // Hold the decode loop so that all five provably share steps.
    std::shared_ptr<engine::builtin_engine> e;
    {
      std::lock_guard guard{engines_mutex};
      e = engines.back();
    }
    ASSERT_TRUE(e->pause());
    std::vector<replica_call> calls{call(++key, prompt)};
    for (int i = 0; i < 4; ++i)
      calls.push_back(
        call(++key, "noise " + std::to_string(i) + std::string(size_t(i) * 7, 'x'),
             R"("temperature":0.9,"max_new_tokens":24,"sampling_seed":)" + std::to_string(5 + i)));
    std::vector<replica_answer> got(calls.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < calls.size(); ++i)
      clients.emplace_back([&, i] {
        caf::scoped_actor client{sys};
        client->request(replica, caf::infinite, atom::generate_v, calls[i])
          .receive([&](const replica_answer& r) { got[i] = r; },
                   [&](const caf::error& err) { ADD_FAILURE() << sys.render(err); });
      });
    auto deadline = std::chrono::steady_clock::now() + 60s;
    while (e->requests_in_flight() < calls.size() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
    auto before = e->stats().largest_batch;
    ASSERT_TRUE(e->resume());
    for (auto& t : clients)
      t.join();
    EXPECT_GE(std::max(before, e->stats().largest_batch), calls.size());
    ASSERT_EQ(got[0].status, 200) << got[0].body;
    EXPECT_EQ(tokens_of(got[0]), want.tokens);
    EXPECT_EQ(logprobs_of(got[0]), want.logprobs);
    for (const auto& r : got) {
      EXPECT_EQ(r.status, 200);
      EXPECT_EQ(r.weight_version_start, ref.version);
      EXPECT_EQ(r.weight_version_end, ref.version);
    }
  }

  temp_dir dir;
  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scoped_actor self;
  const std::string pool = "default";
  std::shared_ptr<store_backend> backend;
  store_actor store;
  std::shared_ptr<remote_store> remote;
  engine::model_config config;
  std::unique_ptr<store::publisher> pub;
  std::mutex engines_mutex;
  std::vector<std::shared_ptr<engine::builtin_engine>> engines;
  replica_actor replica;
  uint64_t key = 0;
};

TEST_F(replica_integration_test, every_path_to_a_version_serves_exactly_the_exported_weights) {
  publish("r", 0, false);
  start();
  await_applied("r/weight_v000000"); // cold start from the anchor
  expect_exact({"r", 0});

  publish("r", 1, true);
  await_applied("r/weight_v000001"); // one delta
  expect_exact({"r", 1});

  for (uint64_t v = 2; v <= 5; ++v)
    publish("r", v, false);
  caf::anon_send(replica, atom::wake_v);
  await_applied("r/weight_v000005"); // a folded catch-up
  expect_exact({"r", 5});
  EXPECT_GE(info().metrics.last_folded, 1u);

  publish("s", 0, true);
  await_applied("s/weight_v000000"); // a run switch
  expect_exact({"s", 0});
  auto i = info();
  EXPECT_EQ(i.metrics.activation_failures_total, 0u);
  EXPECT_EQ(i.metrics.checksum_failures_total, 0u);
  EXPECT_GT(i.metrics.bytes_fetched_total, 0u);
  EXPECT_GT(i.metrics.last_pause_us, 0.0);
}

} // namespace
} // namespace stitch
