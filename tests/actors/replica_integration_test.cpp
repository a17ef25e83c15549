// The replica actor on real threads: CAF's work-stealing scheduler, worker
// pools, the built-in engine, bytes fetched through the store actor. After
// every path to a version (cold start from the anchor, a delta, a folded
// catch-up, a run switch) the replica's greedy generations are token-for-token
// and logprob-for-logprob those of a fresh engine loaded from `stitch export`
// of that version — also while other requests share the decode batch.

#include "cluster_fixture.hpp"

#include "runtime/engine/sampler.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/materialize.hpp"

namespace stitch::testing {
namespace {

using namespace std::chrono_literals;

class replica_integration_test : public cluster_test {
protected:
  replica_info info() {
    for (const auto& i : pool())
      if (i.replica_id == "a")
        return i;
    return {};
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
    EXPECT_TRUE(pipeline::export_version(*backend, "default", ref, out_dir));
    auto tensors = pipeline::load_hf_directory(out_dir);
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
    self->request(replicas.at(0), caf::infinite, atom::generate_v, call(++key, prompt))
      .receive([&](const replica_answer& r) { alone = r; },
               [&](const caf::error& e) { ADD_FAILURE() << sys.render(e); });
    ASSERT_EQ(alone.status, 200) << alone.body;
    EXPECT_EQ(alone.run_id, ref.run_id);
    EXPECT_EQ(alone.stamped, (stamps{ref.version, ref.version}));
    EXPECT_EQ(tokens_of(alone), want.tokens);
    EXPECT_EQ(logprobs_of(alone), want.logprobs);

    // Hold the decode loop so that all five provably share steps.
    std::shared_ptr<probed_engine> pe;
    {
      std::lock_guard guard{engines_mutex};
      pe = engines.back();
    }
    auto* e = &pe->inner;
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
        client->request(replicas.at(0), caf::infinite, atom::generate_v, calls[i])
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
      EXPECT_EQ(r.stamped, (stamps{ref.version, ref.version}));
    }
  }

  uint64_t key = 0;
};

TEST_F(replica_integration_test, every_path_to_a_version_serves_exactly_the_exported_weights) {
  publish(0, "r", false);
  start_replica("a", true); // bytes through the store actor
  await_ready({"a"}, 0);    // cold start from the anchor
  expect_exact({"r", 0});

  publish(1);
  await_ready({"a"}, 1); // one delta
  expect_exact({"r", 1});

  for (uint64_t v = 2; v <= 5; ++v)
    publish(v, "r", false);
  caf::anon_send(replicas.at(0), atom::wake_v);
  await_ready({"a"}, 5); // a folded catch-up
  expect_exact({"r", 5});
  EXPECT_GE(info().metrics.last_folded, 1u);

  publish(0, "s");
  await_ready({"a"}, 0, "s"); // a run switch
  expect_exact({"s", 0});
  auto i = info();
  EXPECT_EQ(i.metrics.activation_failures_total, 0u);
  EXPECT_EQ(i.metrics.checksum_failures_total, 0u);
  EXPECT_GT(i.metrics.bytes_fetched_total, 0u);
  EXPECT_GT(i.metrics.last_pause_us, 0.0);
}

} // namespace
} // namespace stitch::testing
