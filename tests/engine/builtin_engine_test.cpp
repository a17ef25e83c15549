#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/counted_store_source.hpp"
#include "common/plans.hpp"
#include "gpu/device.hpp"
#include "gpu/host_buffer.hpp"
#include "runtime/core/base64.hpp"
#include "runtime/core/chain_planner.hpp"
#include "runtime/core/checksum.hpp"
#include "runtime/engine/builtin_engine.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/materialize.hpp"
#include "runtime/pipeline/publisher.hpp"
#include "runtime/pipeline/store_tensor_source.hpp"
#include "store/memory_store.hpp"

namespace stitch::engine {
namespace {

using stitch::testing::memory_store;

/// Nudges the low mantissa bits of every `every`-th float of a tensor: a
/// training step's worth of change.
void nudge(pipeline::host_tensor& t, uint32_t salt, size_t every = 7) {
  for (size_t i = salt % every; i + 4 <= t.bytes.size(); i += 4 * every)
    t.bytes[i] ^= static_cast<std::byte>(1 + salt % 200);
}

using stitch::testing::manifest_cache;
using stitch::testing::plan_over;

class builtin_engine_test : public ::testing::Test {
protected:
  void SetUp() override {
    auto c = preset("tiny");
    ASSERT_TRUE(c);
    config = *c;
    auto w = random_init(config, 42);
    ASSERT_TRUE(w);
    versions.push_back(*w);
    for (uint32_t v = 1; v <= 3; ++v) {
      auto next = versions.back();
      nudge(next.at("lm_head.weight"), v);
      nudge(next.at("model.layers." + std::to_string(v % 2) + ".mlp.up_proj.weight"), v);
      versions.push_back(next);
    }
    pipeline::publisher pub{db};
    for (uint64_t v = 0; v < versions.size(); ++v) {
      auto r = pub.publish({"default", "r", v, false, false}, versions[v]);
      ASSERT_TRUE(r) << to_string(r.error());
      ASSERT_EQ(r->kind, v == 0 ? version_kind::full : version_kind::delta);
    }
  }

  chain_plan plan(std::optional<applied_state> applied, uint64_t to, std::string run = "r",
                  std::string pool = "default") {
    auto out = plan_over(db, cache, applied, {std::move(run), to}, pool);
    EXPECT_TRUE(out && std::holds_alternative<chain_plan>(*out));
    return std::get<chain_plan>(*out);
  }

  /// Greedy generation on a fresh engine built straight from `tensors`.
  generation_output reference(const pipeline::tensor_set& tensors, std::string_view prompt) {
    auto w = build_weights(config, tensors);
    EXPECT_TRUE(w);
    sampling_options o;
    o.max_tokens = 24;
    o.stop_at_eos = false;
    auto out = engine::generate(**w, config, tokenizer{}, prompt, o);
    EXPECT_TRUE(out);
    return *out;
  }

  static generation_request request(std::string prompt) {
    generation_request r;
    r.id = 1;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0;
    r.sampling.max_new_tokens = 24;
    r.return_logprob = true;
    return r;
  }

  model_config config;
  memory_store db;
  std::vector<pipeline::tensor_set> versions;
  manifest_cache cache;
};

TEST_F(builtin_engine_test, cold_start_from_anchor_matches_a_fresh_engine_exactly) {
  builtin_engine e{config};
  EXPECT_FALSE(e.health().healthy);
  pipeline::store_tensor_source src{db, "default"};
  auto p = plan(std::nullopt, 0);
  ASSERT_TRUE(e.stage(p, false, src));
  EXPECT_FALSE(e.served()) << "staging does not activate";
  ASSERT_TRUE(e.commit());
  auto got = e.generate(request("hello"), {});
  ASSERT_TRUE(got) << to_string(got.error());
  auto want = reference(versions[0], "hello");
  EXPECT_EQ(got->tokens, want.tokens);
  EXPECT_EQ(got->logprobs, want.logprobs);
  EXPECT_TRUE(e.health().healthy);
}

TEST_F(builtin_engine_test, folded_delta_chain_activates_exactly_the_published_weights) {
  builtin_engine e{config};
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(e.stage(plan(std::nullopt, 0), false, src));
  ASSERT_TRUE(e.commit());
  auto p = plan(applied_state{{"r", 0}}, 3);
  ASSERT_EQ(p.deltas.size(), 3u);
  ASSERT_TRUE(e.prefetch(p));
  ASSERT_TRUE(e.stage(p, false, src));
  auto before = e.served();
  ASSERT_TRUE(e.commit());
  EXPECT_NE(e.served(), before);
  auto got = e.generate(request("the policy"), {});
  ASSERT_TRUE(got);
  auto want = reference(versions[3], "the policy");
  EXPECT_EQ(got->tokens, want.tokens);
  EXPECT_EQ(got->logprobs, want.logprobs);
  EXPECT_NE(want.logprobs, reference(versions[0], "the policy").logprobs)
    << "the versions differ, so the comparison means something";
}

TEST_F(builtin_engine_test, catch_up_equals_a_fresh_engine_loaded_from_stitch_export) {
  builtin_engine e{config};
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(e.stage(plan(std::nullopt, 0), false, src));
  ASSERT_TRUE(e.commit());
  ASSERT_TRUE(e.stage(plan(applied_state{{"r", 0}}, 3), false, src));
  ASSERT_TRUE(e.commit());
  auto dir =
    std::filesystem::temp_directory_path() / ("stitch-engine-export-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(pipeline::export_version(db, "default", {"r", 3}, dir));
  auto exported = pipeline::load_hf_directory(dir);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(exported) << to_string(exported.error());
  for (const char* prompt : {"a", "exactness", "the quick brown fox"}) {
    auto got = e.generate(request(prompt), {});
    ASSERT_TRUE(got);
    auto want = reference(*exported, prompt);
    EXPECT_EQ(got->tokens, want.tokens) << prompt;
    EXPECT_EQ(got->logprobs, want.logprobs) << prompt;
  }
}

TEST_F(builtin_engine_test, run_switch_resets_to_the_new_runs_weights) {
  auto other = random_init(config, 7);
  ASSERT_TRUE(other);
  pipeline::publisher pub{db};
  ASSERT_TRUE(pub.publish({"default", "b", 0, false, false}, *other));
  builtin_engine e{config};
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(e.stage(plan(std::nullopt, 3), false, src));
  ASSERT_TRUE(e.commit());
  auto switched = plan_over(db, cache, applied_state{{"r", 3}}, {"b", 0});
  ASSERT_TRUE(switched);
  auto p = std::get<chain_plan>(*switched);
  EXPECT_TRUE(p.reset_to_boot);
  ASSERT_TRUE(e.stage(p, false, src));
  ASSERT_TRUE(e.commit());
  auto got = e.generate(request("switch"), {});
  ASSERT_TRUE(got);
  EXPECT_EQ(got->logprobs, reference(*other, "switch").logprobs);
}

TEST_F(builtin_engine_test, restaging_onto_the_shadow_continues_from_it) {
  builtin_engine e{config};
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(e.stage(plan(std::nullopt, 1), false, src));
  ASSERT_TRUE(e.stage(plan(applied_state{{"r", 1}}, 3), true, src));
  ASSERT_TRUE(e.commit());
  auto got = e.generate(request("x"), {});
  ASSERT_TRUE(got);
  EXPECT_EQ(got->logprobs, reference(versions[3], "x").logprobs);
}

TEST_F(builtin_engine_test, corrupt_bytes_are_never_activated) {
  builtin_engine e{config};
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(e.stage(plan(std::nullopt, 0), false, src));
  ASSERT_TRUE(e.commit());
  auto serving = e.served();
  ASSERT_TRUE(db.corrupt("default", {"r", 2}, "lm_head.weight", 20));
  auto staged = e.stage(plan(applied_state{{"r", 0}}, 2), false, src);
  ASSERT_FALSE(staged);
  EXPECT_TRUE(staged.error().code == errc::checksum_mismatch
              || staged.error().code == errc::decode_failure)
    << to_string(staged.error());
  EXPECT_NE(staged.error().message.find("lm_head.weight"), std::string::npos)
    << staged.error().message;
  EXPECT_FALSE(e.commit()) << "the failed shadow was dropped";
  EXPECT_EQ(e.served(), serving);
}

TEST_F(builtin_engine_test, a_request_waits_while_paused_and_continues_after) {
  builtin_engine e{config};
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(e.reset_to_boot({"r", 0}, src));
  ASSERT_TRUE(e.pause());
  std::atomic<bool> done{false};
  std::thread t{[&] {
    auto r = e.generate(request("wait"), {});
    EXPECT_TRUE(r);
    done = true;
  }};
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(done) << "a paused engine generates nothing";
  ASSERT_TRUE(e.resume());
  t.join();
  EXPECT_TRUE(done);
}

TEST_F(builtin_engine_test, concurrent_requests_share_steps_and_match_solo_runs_exactly) {
  builtin_engine e{config};
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(e.reset_to_boot({"r", 0}, src));
  // Paused, the decode loop holds at its first step; every request submitted
  // meanwhile joins the next one, so the batch provably holds all of them.
  ASSERT_TRUE(e.pause());
  const std::vector<std::string> prompts = {
    "alpha", "a much longer prompt than the others", "g", "delta delta", "eps", "zeta!"};
  std::vector<result<generation_result>> got(prompts.size(),
                                             make_error(errc::invalid_argument, "not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] {
      auto r = request(prompts[i]);
      r.id = i + 1;
      if (i % 2 == 1) {
        r.sampling.temperature = 0.8;
        r.sampling.top_k = 40;
        r.sampling.seed = 1000 + i;
      }
      got[i] = e.generate(r, {});
    });
  while (e.requests_in_flight() < prompts.size())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(e.resume());
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(e.stats().largest_batch, prompts.size());
  // Each alone on a fresh engine, with the same weights and seeds.
  builtin_engine solo{config};
  ASSERT_TRUE(solo.reset_to_boot({"r", 0}, src));
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto r = request(prompts[i]);
    r.id = i + 1;
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8;
      r.sampling.top_k = 40;
      r.sampling.seed = 1000 + i;
    }
    auto alone = solo.generate(r, {});
    ASSERT_TRUE(alone && got[i]) << prompts[i];
    EXPECT_EQ(got[i]->tokens, alone->tokens) << prompts[i];
    EXPECT_EQ(got[i]->logprobs, alone->logprobs) << prompts[i];
    EXPECT_EQ(got[i]->text, alone->text) << prompts[i];
  }
  EXPECT_EQ(solo.stats().largest_batch, 1u);
}

TEST_F(builtin_engine_test, cancelled_request_finishes_with_abort) {
  builtin_engine e{config};
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(e.reset_to_boot({"r", 0}, src));
  auto r = e.generate(request("stop me"), [] { return true; });
  ASSERT_TRUE(r);
  EXPECT_EQ(r->finish, finish_reason::abort);
}

TEST_F(builtin_engine_test, nothing_staged_or_served_is_refused) {
  builtin_engine e{config};
  EXPECT_FALSE(e.commit());
  EXPECT_FALSE(e.prefetch(plan(applied_state{{"r", 0}}, 2)));
  auto r = e.generate(request("x"), {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, errc::engine_unavailable);
}

TEST_F(builtin_engine_test, forward_serves_the_versioned_routes_and_streams_events) {
  builtin_engine e{config};
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(e.reset_to_boot({"r", 0}, src));
  engine_call call;
  call.id = 3;
  call.tag = "t3";
  call.route = "/generate";
  call.body =
    R"({"text":"abc","sampling_params":{"temperature":0,"max_new_tokens":12},"return_logprob":true})";
  auto whole = e.forward(call, {}, {});
  ASSERT_TRUE(whole) << to_string(whole.error());
  EXPECT_FALSE(whole->stream);
  auto j = nlohmann::json::parse(whole->body);
  auto want = reference(versions[0], "abc");
  want.tokens.resize(12);
  EXPECT_EQ(j["output_ids"].get<std::vector<int32_t>>(),
            std::vector<int32_t>(want.tokens.begin(), want.tokens.end()));
  EXPECT_EQ(j["meta_info"]["id"], "t3");
  EXPECT_EQ(j["meta_info"]["finish_reason"]["type"], whole->finish_reason);

  // The same request streamed: events before the last, whose texts add up.
  call.route = "/v1/completions";
  call.body = R"({"prompt":"abc","temperature":0,"max_tokens":12,"stream":true})";
  std::vector<std::string> events;
  auto streamed = e.forward(call, [&](std::string ev) { events.push_back(std::move(ev)); }, {});
  ASSERT_TRUE(streamed);
  EXPECT_TRUE(streamed->stream);
  EXPECT_FALSE(events.empty());
  std::string text;
  for (const auto& ev : events)
    text += nlohmann::json::parse(ev)["choices"][0]["text"].get<std::string>();
  auto last = nlohmann::json::parse(streamed->body);
  text += last["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, j["text"].get<std::string>());
  EXPECT_EQ(last["choices"][0]["finish_reason"], whole->finish_reason);

  call.body = R"({"prompt":"abc","temperature":"x"})";
  auto bad = e.forward(call, {}, {});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "temperature must be a number");
  call.method = "GET";
  call.route = "/v1/models";
  auto models = e.forward(call, {}, {});
  ASSERT_TRUE(models);
  EXPECT_EQ(nlohmann::json::parse(models->body)["data"][0]["id"], "stitch-builtin");
  call.route = "/nope";
  auto missing = e.forward(call, {}, {});
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

TEST_F(builtin_engine_test, requests_are_namespaced_by_the_version_they_run_on) {
  builtin_engine e{config};
  auto stamped = nlohmann::json::parse(
    e.stamp_request("/generate", R"({"text":"hi","sampling_params":{}})", {"r1", 7}));
  EXPECT_EQ(stamped["extra_key"], "r1/weight_v000007");
  EXPECT_EQ(stamped["text"], "hi");
  auto other = nlohmann::json::parse(
    e.stamp_request("/v1/completions", R"({"prompt":"hi","extra_key":"mine"})", {"r1", 8}));
  EXPECT_EQ(other["extra_key"], "r1/weight_v000008:mine")
    << "a client's namespace is kept, within the version's: it cannot pick another";
  EXPECT_EQ(e.stamp_request("/v1/models", R"({"a":1})", {"r", 1}), R"({"a":1})");
  EXPECT_EQ(e.stamp_request("/generate", "[1,2]", {"r", 1}), "[1,2]");
}

TEST_F(builtin_engine_test, stamps_follow_the_reference_shapes) {
  builtin_engine e{config};
  auto native = nlohmann::json::parse(
    e.stamp_response("/generate", R"({"text":"hi","meta_info":{"id":"a"}})", {5, 6}, "r1"));
  EXPECT_EQ(native["meta_info"]["weight_version_start"], 5);
  EXPECT_EQ(native["meta_info"]["weight_version_end"], 6);
  EXPECT_EQ(native["meta_info"]["weight_version"], "5");
  EXPECT_EQ(native["meta_info"]["id"], "a");
  auto openai = nlohmann::json::parse(
    e.stamp_response("/v1/chat/completions", R"({"choices":[]})", {7, 7}, "r1"));
  EXPECT_EQ(openai["weight_version_start"], 7);
  EXPECT_EQ(openai["weight_version_end"], 7);
  EXPECT_EQ(openai["run_id"], "r1");
  EXPECT_EQ(e.stamp_response("/v1/models", R"({"a":1})", {1, 1}, "r"), R"({"a":1})");
  EXPECT_EQ(e.stamp_response("/generate", "not json", {1, 1}, "r"), "not json");
}

// -- peers ---------------------------------------------------------------------

/// A tensor source whose peers are another engine's served weights (what a
/// holder exposes), copied and verified as the UCX fetch does; it counts the
/// stored bytes read and can refuse some tensors.
class peer_backed_source final : public stitch::testing::counted_store_source, public transfer {
public:
  peer_backed_source(store_backend& db, builtin_engine& holder) : counted_store_source(db) {
    if (auto v = holder.host_view())
      held_ = std::move(*v);
  }
  transfer* peers() override { return this; }
  fetch_report fetch(const version_ref& ref, std::span<const fetch_target> targets,
                     const std::function<void(const transfer_progress&)>&) override {
    fetch_report r;
    r.fetched.assign(targets.size(), false);
    if (ref != held_.version)
      return r;
    for (size_t i = 0; i < targets.size(); ++i) {
      if (refused.contains(targets[i].name))
        continue;
      for (const auto& t : held_.tensors)
        if (t.name == targets[i].name && t.bytes.size() == targets[i].destination.size()) {
          std::memcpy(targets[i].destination.data(), t.bytes.data(), t.bytes.size());
          r.fetched[i] =
            checksum::tree_checksum(targets[i].destination) == targets[i].expected_checksum;
          r.bytes_by_source["holder"] += t.bytes.size();
          whole_bytes += t.bytes.size();
        }
    }
    return r;
  }
  /// A holder of the stored frames when `lend_frames`.
  fetch_report fetch_frames(const version_ref& ref, std::span<const fetch_target> targets,
                            const std::function<void(const transfer_progress&)>&) override {
    if (!lend_frames) {
      fetch_report none;
      none.frames = true;
      none.fetched.assign(targets.size(), false);
      return none;
    }
    return frames_from_store(ref, targets);
  }

  std::set<std::string> refused;
  bool lend_frames = false;
  uint64_t whole_bytes = 0;

private:
  host_weights held_;
};

TEST_F(builtin_engine_test, host_view_names_the_served_version_and_keeps_its_bytes) {
  builtin_engine e{config};
  EXPECT_FALSE(e.host_view()) << "nothing served yet";
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(e.stage(plan(std::nullopt, 2), false, src));
  EXPECT_FALSE(e.host_view()) << "staged is not served";
  ASSERT_TRUE(e.commit());
  auto view = e.host_view();
  ASSERT_TRUE(view);
  EXPECT_EQ(view->version, (version_ref{"r", 2}));
  ASSERT_EQ(view->tensors.size(), versions[2].size());
  for (const auto& t : view->tensors) {
    EXPECT_TRUE(std::equal(t.bytes.begin(), t.bytes.end(), versions[2].at(t.name).bytes.begin(),
                           versions[2].at(t.name).bytes.end()))
      << t.name;
  }
  // The next activation replaces the served weights; the view keeps its own.
  ASSERT_TRUE(e.stage(plan(applied_state{{"r", 2}}, 3), false, src));
  ASSERT_TRUE(e.commit());
  EXPECT_EQ(e.host_view()->version, (version_ref{"r", 3}));
  const auto& head = versions[2].at("lm_head.weight").bytes;
  for (const auto& t : view->tensors) {
    if (t.name == "lm_head.weight") {
      EXPECT_TRUE(std::equal(t.bytes.begin(), t.bytes.end(), head.begin(), head.end()));
    }
  }
}

TEST_F(builtin_engine_test, a_cold_start_takes_every_tensor_whole_from_a_peer_holding_the_target) {
  builtin_engine holder{config};
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(holder.stage(plan(std::nullopt, 3), false, src));
  ASSERT_TRUE(holder.commit());
  builtin_engine e{config};
  peer_backed_source peers{db, holder};
  auto p = plan(std::nullopt, 3);
  ASSERT_TRUE(p.anchor);
  ASSERT_EQ(p.deltas.size(), 3u);
  ASSERT_TRUE(e.stage(p, false, peers));
  ASSERT_TRUE(e.commit());
  EXPECT_TRUE(peers.stored_reads.empty()) << "no anchor byte or delta frame from the store";
  auto got = e.generate(request("the policy"), {});
  ASSERT_TRUE(got);
  auto want = reference(versions[3], "the policy");
  EXPECT_EQ(got->tokens, want.tokens);
  EXPECT_EQ(got->logprobs, want.logprobs);
}

TEST_F(builtin_engine_test,
       a_delta_takes_the_touched_tensors_from_peers_and_the_rest_from_the_store) {
  builtin_engine holder{config};
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(holder.stage(plan(std::nullopt, 3), false, src));
  ASSERT_TRUE(holder.commit());
  builtin_engine e{config};
  ASSERT_TRUE(e.stage(plan(std::nullopt, 0), false, src));
  ASSERT_TRUE(e.commit());
  peer_backed_source peers{db, holder};
  // The holder cannot give lm_head: it is patched from the stored deltas.
  peers.refused.insert("lm_head.weight");
  auto p = plan(applied_state{{"r", 0}}, 3);
  ASSERT_TRUE(p.touched.contains("lm_head.weight"));
  ASSERT_TRUE(e.stage(p, false, peers));
  ASSERT_TRUE(e.commit());
  ASSERT_EQ(peers.stored_reads.size(), 1u);
  EXPECT_TRUE(peers.stored_reads.contains("lm_head.weight"));
  auto got = e.generate(request("the policy"), {});
  ASSERT_TRUE(got);
  auto want = reference(versions[3], "the policy");
  EXPECT_EQ(got->tokens, want.tokens);
  EXPECT_EQ(got->logprobs, want.logprobs);

  // A peer holding another version gives nothing: all from the store.
  builtin_engine fresh{config};
  ASSERT_TRUE(fresh.stage(plan(std::nullopt, 0), false, src));
  ASSERT_TRUE(fresh.commit());
  peer_backed_source stale{db, fresh};
  builtin_engine other{config};
  ASSERT_TRUE(other.stage(plan(std::nullopt, 1), false, stale));
  ASSERT_TRUE(other.commit());
  EXPECT_FALSE(stale.stored_reads.empty());
}

TEST_F(builtin_engine_test, a_delta_chain_comes_from_peers_as_its_stored_frames) {
  builtin_engine holder{config};
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(holder.stage(plan(std::nullopt, 3), false, src));
  ASSERT_TRUE(holder.commit());
  // An engine serving version 0, as the receivers below are.
  auto at_v0 = [&]() -> std::unique_ptr<builtin_engine> {
    auto x = std::make_unique<builtin_engine>(config);
    if (!x->stage(plan(std::nullopt, 0), false, src) || !x->commit())
      return nullptr;
    return x;
  };
  uint64_t frames_total = 0;
  for (uint64_t v = 1; v <= 3; ++v) {
    auto m = db.read_manifest("default", {"r", v});
    ASSERT_TRUE(m);
    ASSERT_EQ(m->frames.size(), m->touched.size()) << "a delta lists its frames";
    frames_total += m->total_size;
  }
  auto e_at_v0 = at_v0();
  ASSERT_TRUE(e_at_v0);
  auto& e = *e_at_v0;
  peer_backed_source peers{db, holder};
  peers.lend_frames = true;
  auto p = plan(applied_state{{"r", 0}}, 3);
  ASSERT_TRUE(e.stage(p, false, peers));
  ASSERT_TRUE(e.commit());
  EXPECT_TRUE(peers.stored_reads.empty()) << "every frame came from the peer";
  EXPECT_EQ(peers.whole_bytes, 0u) << "no touched tensor whole";
  EXPECT_EQ(peers.frame_bytes, frames_total);
  auto want = reference(versions[3], "the policy");
  auto got = e.generate(request("the policy"), {});
  ASSERT_TRUE(got);
  EXPECT_EQ(got->tokens, want.tokens);
  EXPECT_EQ(got->logprobs, want.logprobs);

  // A frame whose bytes fail their digest is never decoded: that tensor
  // comes whole from the holder instead, the rest still as frames.
  auto again_at_v0 = at_v0();
  ASSERT_TRUE(again_at_v0);
  auto& again = *again_at_v0;
  peer_backed_source bad{db, holder};
  bad.lend_frames = true;
  bad.corrupt_frame = "lm_head.weight";
  ASSERT_TRUE(again.stage(p, false, bad));
  ASSERT_TRUE(again.commit());
  EXPECT_TRUE(bad.stored_reads.empty());
  EXPECT_EQ(bad.whole_bytes, versions[3].at("lm_head.weight").bytes.size());
  EXPECT_GT(bad.frame_bytes, 0u);
  got = again.generate(request("the policy"), {});
  ASSERT_TRUE(got);
  EXPECT_EQ(got->tokens, want.tokens);
  EXPECT_EQ(got->logprobs, want.logprobs);

  // With no holder of the frames nor the tensors, the store gives the
  // frames.
  auto alone_at_v0 = at_v0();
  ASSERT_TRUE(alone_at_v0);
  auto& alone = *alone_at_v0;
  peer_backed_source none{db, holder};
  none.lend_frames = true;
  none.corrupt_frame = "lm_head.weight";
  none.refused.insert("lm_head.weight");
  ASSERT_TRUE(alone.stage(p, false, none));
  ASSERT_TRUE(alone.commit());
  ASSERT_EQ(none.stored_reads.size(), 1u);
  EXPECT_TRUE(none.stored_reads.contains("lm_head.weight"));
  got = alone.generate(request("the policy"), {});
  ASSERT_TRUE(got);
  EXPECT_EQ(got->logprobs, want.logprobs);
}

TEST_F(builtin_engine_test, a_version_is_served_with_its_own_config_json) {
  // The same tensors under another rope_theta and rms_norm_eps: the engine
  // serves them with those settings (the logprobs follow them), not its own.
  model_config other = config;
  other.rope_theta = 500000.0;
  other.rms_norm_eps = 1e-3;
  pipeline::publisher pub{db};
  pipeline::publish_request r{"cfg", "c", 0, false, false};
  r.files = {{"config.json", render_model_config(other)}};
  ASSERT_TRUE(pub.publish(r, versions[0]));
  builtin_engine e{config};
  pipeline::store_tensor_source src{db, "cfg"};
  chain_plan p;
  p.target = {"c", 0};
  p.anchor = version_ref{"c", 0};
  p.activation_needed = true;
  ASSERT_TRUE(e.stage(p, false, src));
  ASSERT_TRUE(e.commit());
  EXPECT_EQ(e.served_config(), other);
  EXPECT_EQ(e.config(), config) << "the engine's own settings stay";
  auto got = e.generate(request("hello"), {});
  ASSERT_TRUE(got) << to_string(got.error());
  auto w = build_weights(other, versions[0]);
  ASSERT_TRUE(w);
  sampling_options o;
  o.max_tokens = 24;
  o.stop_at_eos = false;
  auto expected = engine::generate(**w, other, tokenizer{}, "hello", o);
  ASSERT_TRUE(expected);
  EXPECT_EQ(got->tokens, expected->tokens);
  EXPECT_EQ(got->logprobs, expected->logprobs);
  auto with_preset = reference(versions[0], "hello");
  EXPECT_NE(got->logprobs, with_preset.logprobs) << "the config made no difference";
}

TEST_F(builtin_engine_test, a_version_whose_config_json_does_not_fit_its_tensors_is_refused) {
  pipeline::publisher pub{db};
  model_config wider = config;
  wider.intermediate_size *= 2;
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
         {"shapes", render_model_config(wider)}, {"garbage", "{not json"}}) {
    pipeline::publish_request r{"bad-" + name, "c", 0, false, false};
    r.files = {{"config.json", text}};
    ASSERT_TRUE(pub.publish(r, versions[0]));
    builtin_engine e{config};
    pipeline::store_tensor_source src{db, "bad-" + name};
    chain_plan p;
    p.target = {"c", 0};
    p.anchor = version_ref{"c", 0};
    p.activation_needed = true;
    auto staged = e.stage(p, false, src);
    ASSERT_FALSE(staged) << name;
    EXPECT_EQ(staged.error().code, errc::invalid_argument);
    EXPECT_NE(staged.error().message.find("config.json"), std::string::npos)
      << staged.error().message;
    EXPECT_FALSE(e.served());
  }
}

TEST_F(builtin_engine_test, a_generation_crossing_activations_says_which_version_made_each_token) {
  // The prompt "hi" is three tokens (BOS, h, i): step 3 samples token 0, step
  // s token s - 3. Versions 1 and 3 are committed just before steps 7 and
  // 12 (the engine asks `cancelled` before every step), so tokens 0-3 come
  // from version 0, 4-8 from 1 and 9-23 from 3.
  builtin_engine e{config};
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(e.reset_to_boot({"r", 0}, src));
  int step = 0;
  auto activate = [&](uint64_t from, uint64_t to) {
    auto p = plan(applied_state{{"r", from}}, to);
    ASSERT_TRUE(e.stage(p, false, src));
    ASSERT_TRUE(e.commit());
  };
  auto got = e.generate(request("hi"), [&] {
    ++step;
    if (step == 7)
      activate(0, 1);
    if (step == 12)
      activate(1, 3);
    return false;
  });
  ASSERT_TRUE(got) << to_string(got.error());
  ASSERT_GE(got->tokens.size(), 10u) << "the generation ended (EOS) before crossing both";
  const auto last = static_cast<uint32_t>(got->tokens.size() - 1);
  EXPECT_EQ(got->spans, (std::vector<version_span>{{0, 0, 3}, {1, 4, 8}, {3, 9, last}}));
  // The HTTP shapes carry them: SGLang's in meta_info, OpenAI's at the top.
  engine_call call;
  call.id = 9;
  call.tag = "t9";
  call.route = "/generate";
  call.body = R"({"text":"hi","sampling_params":{"temperature":0,"max_new_tokens":4}})";
  auto native = e.forward(call, {}, {});
  ASSERT_TRUE(native);
  auto j = nlohmann::json::parse(native->body);
  EXPECT_EQ(j["meta_info"]["weight_version_spans"],
            nlohmann::json::parse(R"([{"version":3,"first_token":0,"last_token":3}])"));
  call.route = "/v1/chat/completions";
  call.body = R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true})";
  std::vector<std::string> events;
  auto streamed =
    e.forward(call, [&](std::string event) { events.push_back(std::move(event)); }, {});
  ASSERT_TRUE(streamed);
  auto final_event = nlohmann::json::parse(streamed->body);
  ASSERT_TRUE(final_event.contains("weight_version_spans")) << streamed->body;
  EXPECT_EQ(final_event["weight_version_spans"][0]["version"], 3);
  for (const auto& ev : events)
    EXPECT_EQ(ev.find("weight_version_spans"), std::string::npos) << "only the last event";
}

/// SGLang's `routed_experts`: base64 of little-endian int32 ids.
std::vector<int32_t> decode_routed(const nlohmann::json& meta) {
  auto bytes = base64_decode(meta["routed_experts"].get<std::string>());
  EXPECT_TRUE(bytes);
  std::vector<int32_t> ids(bytes ? bytes->size() / 4 : 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t v = 0;
    for (size_t b = 0; b < 4; ++b)
      v |= uint32_t{static_cast<unsigned char>((*bytes)[i * 4 + b])} << (8 * b);
    ids[i] = static_cast<int32_t>(v);
  }
  return ids;
}

TEST_F(builtin_engine_test, a_mixture_of_experts_returns_its_routing_as_sglang_does) {
  // A moe-tiny run served by an engine built for the dense preset: the
  // version's config.json decides the architecture.
  auto moe = *preset("moe-tiny");
  std::vector<pipeline::tensor_set> moe_versions{*random_init(moe, 9)};
  moe_versions.push_back(moe_versions[0]);
  nudge(moe_versions[1].at("model.layers.0.mlp.gate.weight"), 5, 1);
  pipeline::publisher pub{db};
  for (uint64_t v = 0; v < 2; ++v) {
    pipeline::publish_request r{"moe", "m", v, false, false};
    r.files = {{"config.json", render_model_config(moe)}};
    ASSERT_TRUE(pub.publish(r, moe_versions[v]));
  }
  builtin_engine e{config};
  pipeline::store_tensor_source src{db, "moe"};
  ASSERT_TRUE(e.reset_to_boot({"m", 0}, src));
  ASSERT_EQ(e.served_config(), moe);

  engine_call call;
  call.id = 3;
  call.tag = "t3";
  call.route = "/generate";
  call.body = R"({"text":"hi","sampling_params":{"temperature":0,"max_new_tokens":6},
                  "return_routed_experts":true})";
  auto got = e.forward(call, {}, {});
  ASSERT_TRUE(got) << to_string(got.error());
  auto j = nlohmann::json::parse(got->body);
  const auto& meta = j["meta_info"];
  ASSERT_TRUE(meta["routed_experts"].is_string()) << got->body;
  auto ids = decode_routed(meta);
  // The same generation on a reference: its sequence's routing, every fed
  // position (BOS, the prompt, all generated tokens but the last).
  auto w = build_weights(moe, moe_versions[0]);
  ASSERT_TRUE(w);
  sampling_options o;
  o.max_tokens = 6;
  auto expected = engine::generate(**w, moe, tokenizer{}, "hi", o);
  ASSERT_TRUE(expected);
  EXPECT_EQ(j["output_ids"].get<std::vector<int32_t>>(), expected->tokens);
  const size_t per_row = size_t{moe.num_hidden_layers} * moe.num_experts_per_tok;
  EXPECT_EQ(ids.size(), (3 + expected->tokens.size() - 1) * per_row);
  EXPECT_EQ(ids, expected->routed_experts);
  const auto last_row = static_cast<uint32_t>(ids.size() / per_row - 1);
  EXPECT_EQ(meta["routed_experts_version_spans"],
            nlohmann::json::parse(R"([{"version":0,"first_row":0,"last_row":)"
                                  + std::to_string(last_row) + "}]"));
  // Without the flag, no routing.
  call.body = R"({"text":"hi","sampling_params":{"temperature":0,"max_new_tokens":6}})";
  auto plain = e.forward(call, {}, {});
  ASSERT_TRUE(plain);
  EXPECT_FALSE(nlohmann::json::parse(plain->body)["meta_info"].contains("routed_experts"));

  // Crossing an activation: rows fed before the commit were routed by
  // version 0's router, the others by version 1's. The commit lands before
  // the 5th step: rows 0-3 are version 0's.
  int step = 0;
  call.body = R"({"text":"hi","sampling_params":{"temperature":0,"max_new_tokens":8},
                  "return_routed_experts":true})";
  auto crossed = e.forward(call, {}, [&] {
    if (++step == 5) {
      auto p = plan(applied_state{{"m", 0}}, 1, "m", "moe");
      EXPECT_TRUE(e.stage(p, false, src));
      EXPECT_TRUE(e.commit());
    }
    return false;
  });
  ASSERT_TRUE(crossed) << to_string(crossed.error());
  auto cj = nlohmann::json::parse(crossed->body);
  auto crossed_ids = decode_routed(cj["meta_info"]);
  ASSERT_GE(crossed_ids.size(), 6 * per_row) << "the generation ended before crossing";
  const auto crossed_last = static_cast<uint32_t>(crossed_ids.size() / per_row - 1);
  EXPECT_EQ(cj["meta_info"]["routed_experts_version_spans"],
            nlohmann::json::parse(R"([{"version":0,"first_row":0,"last_row":3},)"
                                  R"({"version":1,"first_row":4,"last_row":)"
                                  + std::to_string(crossed_last) + "}]"));
  for (int32_t id : crossed_ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, static_cast<int32_t>(moe.num_experts));
  }
}

TEST_F(builtin_engine_test, routed_experts_from_a_dense_model_are_refused_by_name) {
  builtin_engine e{config};
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(e.reset_to_boot({"r", 0}, src));
  engine_call call;
  call.id = 4;
  call.tag = "t4";
  call.route = "/generate";
  call.body = R"({"text":"hi","return_routed_experts":true})";
  auto got = e.forward(call, {}, {});
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code, errc::invalid_argument);
  EXPECT_NE(got.error().message.find("return_routed_experts"), std::string::npos);
}

} // namespace
} // namespace stitch::engine

namespace stitch::engine {
namespace {

builtin_engine::options on_cuda() {
  builtin_engine::options o;
  o.device = engine_device::cuda;
  o.max_batch = 8;
  return o;
}

TEST_F(builtin_engine_test, a_cuda_engine_without_a_device_is_refused_with_the_reason) {
  if (gpu::why_no_device().empty())
    GTEST_SKIP() << "a CUDA device is present: the refusal cannot be seen here";
  auto made = builtin_engine::create(config, on_cuda());
  ASSERT_FALSE(made);
  EXPECT_EQ(made.error().code, errc::engine_unavailable);
  EXPECT_NE(made.error().message.find(gpu::why_no_device()), std::string::npos)
    << made.error().message;
  EXPECT_NE(made.error().message.find("engine.device = cuda"), std::string::npos);
  auto cpu = builtin_engine::create(config, {});
  ASSERT_TRUE(cpu);
  EXPECT_EQ((*cpu)->device_usage().device, "cpu");
}

/// Greedy tokens equal, logprobs within `tolerance`, over several prompts.
void expect_same_answers(builtin_engine& gpu_engine, builtin_engine& cpu_engine, float tolerance) {
  for (const char* prompt : {"a", "the policy", "exactness over many positions"}) {
    generation_request r;
    r.id = 1;
    r.prompt = prompt;
    r.sampling.temperature = 0;
    r.sampling.max_new_tokens = 24;
    r.return_logprob = true;
    auto got = gpu_engine.generate(r, {});
    auto want = cpu_engine.generate(r, {});
    ASSERT_TRUE(got) << to_string(got.error());
    ASSERT_TRUE(want);
    EXPECT_EQ(got->tokens, want->tokens) << prompt;
    ASSERT_EQ(got->logprobs.size(), want->logprobs.size());
    for (size_t i = 0; i < got->logprobs.size(); ++i)
      EXPECT_NEAR(got->logprobs[i], want->logprobs[i], tolerance) << prompt << " token " << i;
  }
}

builtin_engine::options device_copy_on_host() {
  builtin_engine::options o;
  o.device_copy_on_host = true;
  // Small pieces: every anchor tensor is read and copied in many.
  o.device_read_piece = 1000;
  return o;
}

/// Every tensor of the served device copy holds `want`'s bytes.
void expect_device_copy(const builtin_engine& e, const pipeline::tensor_set& want) {
  auto w = e.served();
  ASSERT_TRUE(w && w->device);
  ASSERT_EQ(w->device->buffers.size(), want.size());
  for (const auto& [name, t] : want) {
    const auto& b = w->device->buffers.at(name);
    ASSERT_EQ(b->size(), t.bytes.size()) << name;
    EXPECT_TRUE(std::equal(t.bytes.begin(), t.bytes.end(), b->host_bytes().begin())) << name;
  }
}

// The device staging path (anchors copied in, delta pieces applied to device
// copies of the served tensors, checksums computed where the copy is, the
// fan-out between local replicas), run with gpu/'s host stand-in for a
// device, so it is tested on machines without a GPU.
TEST_F(builtin_engine_test, the_device_staging_path_builds_exact_copies_across_deltas) {
  auto made = builtin_engine::create(config, device_copy_on_host());
  ASSERT_TRUE(made) << to_string(made.error());
  auto& e = **made;
  pipeline::store_tensor_source src{db, "default"};
  // An anchor and three deltas in one stage: the anchor's copies are done
  // before the deltas patch its host bytes.
  ASSERT_TRUE(e.stage(plan(std::nullopt, 3), false, src));
  ASSERT_TRUE(e.commit());
  expect_device_copy(e, versions[3]);
  EXPECT_EQ(e.generate(request("p"), {})->logprobs, reference(versions[3], "p").logprobs);
  // Then deltas onto the served copy, shared where untouched.
  auto fresh = builtin_engine::create(config, device_copy_on_host());
  ASSERT_TRUE(fresh);
  ASSERT_TRUE((*fresh)->stage(plan(std::nullopt, 0), false, src));
  ASSERT_TRUE((*fresh)->commit());
  expect_device_copy(**fresh, versions[0]);
  auto before = (*fresh)->served();
  ASSERT_TRUE((*fresh)->stage(plan(applied_state{{"r", 0}}, 3), false, src));
  ASSERT_TRUE((*fresh)->commit());
  expect_device_copy(**fresh, versions[3]);
  const auto& untouched = "model.layers.0.self_attn.q_proj.weight";
  EXPECT_EQ((*fresh)->served()->device->buffers.at(untouched),
            before->device->buffers.at(untouched))
    << "an untouched tensor's device copy is shared, not copied";
  EXPECT_NE((*fresh)->served()->device->buffers.at("lm_head.weight"),
            before->device->buffers.at("lm_head.weight"));
  EXPECT_GT((*fresh)->device_usage().staged_bytes_total, 0u);
  EXPECT_EQ((*fresh)->device_usage().device, "host");
}

/// Stages versions 0..3 (deltas to 4 MiB MLP tensors: mapped host buffers,
/// which the allocator recycles) on an engine made with `o`, each answering
/// as a CPU engine on the same versions does (within `tolerance`); on the
/// host stand-in, its device copy is checked byte for byte too.
void expect_exact_versions_in_recycled_buffers(builtin_engine::options o, float tolerance) {
  auto c = preset("tiny");
  ASSERT_TRUE(c);
  model_config config = *c;
  config.hidden_size = 512;
  config.intermediate_size = 2048;
  std::vector<pipeline::tensor_set> versions;
  versions.push_back(*random_init(config, 7));
  memory_store db;
  pipeline::publisher pub{db};
  for (uint64_t v = 0; v < 4; ++v) {
    if (v > 0) {
      versions.push_back(versions.back());
      for (const char* part : {"up_proj", "down_proj"})
        nudge(
          versions.back().at("model.layers." + std::to_string(v % 2) + ".mlp." + part + ".weight"),
          static_cast<uint32_t>(v));
    }
    ASSERT_TRUE(pub.publish({"default", "r", v, false, false}, versions[v]));
  }
  auto made = builtin_engine::create(config, o);
  ASSERT_TRUE(made) << to_string(made.error());
  auto& e = **made;
  builtin_engine cpu{config};
  pipeline::store_tensor_source src{db, "default"};
  auto& alloc = gpu::staging_allocator();
  EXPECT_GT(alloc.recycling().limit, 0u);
  const uint64_t reused_at_start = alloc.recycling().reused;
  manifest_cache manifests;
  for (uint64_t v = 0; v < versions.size(); ++v) {
    std::optional<applied_state> applied;
    if (v > 0)
      applied = applied_state{{"r", v - 1}};
    auto p = plan_over(db, manifests, applied, {"r", v});
    ASSERT_TRUE(p && std::holds_alternative<chain_plan>(*p)) << v;
    ASSERT_EQ(std::get<chain_plan>(*p).deltas.size(), v == 0 ? 0u : 1u);
    for (builtin_engine* engine : {&e, &cpu}) {
      ASSERT_TRUE(engine->stage(std::get<chain_plan>(*p), false, src)) << v;
      ASSERT_TRUE(engine->commit()) << v;
    }
    if (o.device_copy_on_host)
      expect_device_copy(e, versions[v]);
    expect_same_answers(e, cpu, tolerance);
  }
  // From the third version on, the patched tensors (host copies, and on the
  // stand-in the device copies) were built in buffers the last but one
  // released, old bytes and all.
  EXPECT_GE(alloc.recycling().reused - reused_at_start, 2u);
  EXPECT_LE(alloc.recycling().kept_bytes, alloc.recycling().limit);
  // What /status and /metrics show: the process's recycling, as it stands.
  const auto usage = e.device_usage();
  EXPECT_EQ(usage.host_recycled_bytes_total, alloc.recycling().reused_bytes);
  EXPECT_GT(usage.host_recycled_bytes_total, 0u);
  EXPECT_EQ(usage.host_recycled_kept_bytes, alloc.recycling().kept_bytes);
}

TEST(builtin_engine_recycling, versions_built_in_recycled_host_buffers_are_exact) {
  expect_exact_versions_in_recycled_buffers(device_copy_on_host(), 0.0F);
}

TEST(builtin_engine_recycling, a_cpu_engine_builds_versions_in_recycled_host_buffers) {
  // Staging into fresh mappings is paced by their page faults: a CPU engine
  // keeps released tensors for the next versions too.
  expect_exact_versions_in_recycled_buffers(builtin_engine::options{}, 0.0F);
}

TEST(builtin_engine_recycling, a_cuda_engine_builds_versions_in_recycled_page_locked_buffers) {
  if (auto why = gpu::why_no_device(); !why.empty())
    GTEST_SKIP() << "needs a CUDA device: " << why;
  expect_exact_versions_in_recycled_buffers(on_cuda(), 1e-3F);
}

TEST_F(builtin_engine_test, a_version_another_local_device_holds_is_taken_from_it_not_fetched) {
  pipeline::store_tensor_source src{db, "default"};
  auto holder = builtin_engine::create(config, device_copy_on_host());
  ASSERT_TRUE(holder);
  ASSERT_TRUE((*holder)->stage(plan(std::nullopt, 3), false, src));
  ASSERT_TRUE((*holder)->commit());
  auto taker = builtin_engine::create(config, device_copy_on_host());
  ASSERT_TRUE(taker);
  const size_t reads = db.range_reads();
  ASSERT_TRUE((*taker)->stage(plan(std::nullopt, 3), false, src));
  ASSERT_TRUE((*taker)->commit());
  EXPECT_EQ(db.range_reads(), reads) << "no tensor bytes read from the store";
  uint64_t total = 0;
  for (const auto& [name, t] : versions[3])
    total += t.bytes.size();
  EXPECT_EQ((*taker)->bytes_from_local_gpus(), total);
  expect_device_copy(**taker, versions[3]);
  auto view = (*taker)->host_view();
  ASSERT_TRUE(view);
  for (const auto& t : view->tensors)
    EXPECT_TRUE(std::equal(t.bytes.begin(), t.bytes.end(), versions[3].at(t.name).bytes.begin()))
      << "the host copy peers read is made from the taken one: " << t.name;
  EXPECT_EQ((*taker)->generate(request("q"), {})->logprobs, reference(versions[3], "q").logprobs);
  // A holder that goes away is no longer offered: the next one fetches.
  holder->reset();
  auto third = builtin_engine::create(config, device_copy_on_host());
  ASSERT_TRUE(third);
  ASSERT_TRUE((*third)->stage(plan(std::nullopt, 3), false, src));
  EXPECT_EQ((*third)->bytes_from_local_gpus(), total) << "taken from the second engine";
  taker->reset();
  auto fourth = builtin_engine::create(config, device_copy_on_host());
  ASSERT_TRUE(fourth);
  (*third).reset();
  ASSERT_TRUE((*fourth)->stage(plan(std::nullopt, 3), false, src));
  EXPECT_EQ((*fourth)->bytes_from_local_gpus(), 0u) << "nobody holds it: fetched";
  EXPECT_GT(db.range_reads(), reads);
}

TEST_F(builtin_engine_test, a_cuda_engine_serves_what_the_cpu_engine_serves_across_deltas) {
  if (auto why = gpu::why_no_device(); !why.empty())
    GTEST_SKIP() << "needs a CUDA device: " << why;
  auto made = builtin_engine::create(config, on_cuda());
  ASSERT_TRUE(made) << to_string(made.error());
  auto& e = **made;
  builtin_engine cpu{config};
  pipeline::store_tensor_source src{db, "default"};
  ASSERT_TRUE(e.stage(plan(std::nullopt, 0), false, src));
  ASSERT_TRUE(e.commit());
  ASSERT_TRUE(cpu.stage(plan(std::nullopt, 0), false, src));
  ASSERT_TRUE(cpu.commit());
  expect_same_answers(e, cpu, 1e-3F);
  auto usage = e.device_usage();
  EXPECT_EQ(usage.device, "cuda:0");
  EXPECT_GT(usage.memory_used, config.parameter_count() * 4);
  const uint64_t after_anchor = usage.staged_bytes_total;
  EXPECT_GE(after_anchor, config.parameter_count() * 4);
  // A folded chain: xor pieces applied on the device, checked there.
  ASSERT_TRUE(e.stage(plan(applied_state{{"r", 0}}, 3), false, src));
  ASSERT_TRUE(e.commit());
  ASSERT_TRUE(cpu.stage(plan(applied_state{{"r", 0}}, 3), false, src));
  ASSERT_TRUE(cpu.commit());
  expect_same_answers(e, cpu, 1e-3F);
  EXPECT_GT(e.device_usage().staged_bytes_total, after_anchor);
  // The peers' view is the host copy, which the delta patched as well.
  auto view = e.host_view();
  ASSERT_TRUE(view);
  for (const auto& t : view->tensors)
    EXPECT_EQ(checksum::tree_checksum(t.bytes),
              checksum::tree_checksum(versions[3].at(t.name).bytes))
      << t.name;
}

TEST_F(builtin_engine_test, a_cuda_engine_refuses_a_budget_its_device_cannot_hold) {
  if (auto why = gpu::why_no_device(); !why.empty())
    GTEST_SKIP() << "needs a CUDA device: " << why;
  auto big = config;
  big.max_position_embeddings = 1u << 20;
  auto o = on_cuda();
  o.max_batch = 4096;
  auto made = builtin_engine::create(big, o);
  ASSERT_FALSE(made);
  EXPECT_EQ(made.error().code, errc::limit_exceeded);
  EXPECT_NE(made.error().message.find("KV cache"), std::string::npos) << made.error().message;
}

} // namespace
} // namespace stitch::engine
