// The replica actor on CAF's deterministic scheduler, over a real RocksDB
// store in a temp dir. Its worker threads are replaced by manual executors:
// the test decides when staging, activation and each generation run, so
// every interleaving below is exact.

#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <deque>

#include <nlohmann/json.hpp>

#include "actors/executors.hpp"
#include "actors/fakes.hpp"
#include "actors/mutable_backend.hpp"
#include "actors/replica.hpp"
#include "actors/store.hpp"
#include "node/system_config.hpp"
#include "runtime/core/engine_routes.hpp"
#include "runtime/engine/builtin_engine.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/pipeline/publisher.hpp"
#include "runtime/pipeline/store_tensor_source.hpp"
#include "runtime/store/rocksdb_store.hpp"
#include "store/store_fixtures.hpp"

namespace stitch {
namespace {

using namespace std::chrono_literals;
using stitch::testing::temp_dir;
using testing::deterministic;

/// Jobs wait until the test runs them.
class stepped_executor final : public executor {
public:
  void post(std::function<void()> job) override { jobs_.push_back(std::move(job)); }
  size_t pending() const { return jobs_.size(); }
  /// Runs job `i` (in posting order among those still pending).
  void run(size_t i = 0) {
    ASSERT_LT(i, jobs_.size());
    auto job = std::move(jobs_[i]);
    jobs_.erase(jobs_.begin() + static_cast<ptrdiff_t>(i));
    job();
  }
  size_t run_all() {
    size_t n = 0;
    while (!jobs_.empty()) {
      run(0);
      ++n;
    }
    return n;
  }

private:
  std::deque<std::function<void()>> jobs_;
};

/// The built-in engine with fault injection and call counters.
class test_engine final : public engine_port {
public:
  test_engine(const engine::model_config& c, std::shared_ptr<std::atomic<int>> fail_commits)
      : inner_(c), fail_commits_(std::move(fail_commits)) {}

  status prefetch(const chain_plan& p) override { return inner_.prefetch(p); }
  status stage(const chain_plan& p, bool onto, tensor_source& s) override {
    ++stages;
    return inner_.stage(p, onto, s);
  }
  void discard_shadow() override { inner_.discard_shadow(); }
  void relabel(const version_ref& ref) override { inner_.relabel(ref); }
  std::optional<host_weights> host_view() override { return inner_.host_view(); }
  status commit() override {
    ++commits;
    if (fail_commits_->load() > 0) {
      --*fail_commits_;
      return make_error(errc::activation_failed, "injected activation failure");
    }
    return inner_.commit();
  }
  status pause() override { return inner_.pause(); }
  status resume() override { return inner_.resume(); }
  status flush_cache() override {
    ++flushes;
    return inner_.flush_cache();
  }
  status reset_to_boot(const version_ref& ref, tensor_source& s) override {
    ++resets;
    return inner_.reset_to_boot(ref, s);
  }
  result<engine_reply> forward(const engine_call& c, const event_sink& sink,
                               const std::function<bool()>& cancelled) override {
    return inner_.forward(c, sink, cancelled);
  }
  result<generation_result> generate(const generation_request& r,
                                     const std::function<bool()>& cancelled) override {
    return inner_.generate(r, cancelled);
  }
  std::string stamp_request(std::string_view route, std::string_view body,
                            const version_ref& served) override {
    return inner_.stamp_request(route, body, served);
  }
  std::string stamp_response(std::string_view route, std::string_view body, const stamps& s,
                             std::string_view run_id) override {
    return inner_.stamp_response(route, body, s, run_id);
  }
  engine_health health() override {
    if (out_of_service)
      return {false, "injected: the engine restarted and is being re-synced"};
    return inner_.health();
  }
  std::optional<std::string> route_refusal(std::string_view method,
                                           std::string_view route) const override {
    // What an external engine would do: pass its read-only routes, refuse
    // the rest.
    static constexpr engine_route allowed[] = {{"GET", "/v1/models", "test"}};
    return stitch::route_refusal(allowed, "test engine", method, route);
  }

  std::atomic<int> stages{0}, commits{0}, flushes{0}, resets{0};
  /// What an external engine's monitor reports while it re-syncs.
  std::atomic<bool> out_of_service{false};

private:
  engine::builtin_engine inner_;
  std::shared_ptr<std::atomic<int>> fail_commits_;
};

/// Flips a byte of one tensor's reads while `corrupt` is set; fails them
/// half way (after filling half the buffer) while `fail` is set, as a disk
/// read error or a peer lost mid-transfer would.
class corrupting_source final : public tensor_source {
public:
  explicit corrupting_source(std::shared_ptr<tensor_source> inner) : inner_(std::move(inner)) {}
  result<manifest> manifest_of(const version_ref& ref) override { return inner_->manifest_of(ref); }
  status read(const version_ref& ref, std::string_view tensor, uint64_t offset,
              std::span<std::byte> out) override {
    auto ok = inner_->read(ref, tensor, offset, out);
    if (ok && fail && tensor == "lm_head.weight") {
      ++failed_reads;
      return make_error(errc::backend_failure, "read of lm_head.weight: Input/output error");
    }
    if (ok && corrupt && tensor == "lm_head.weight" && !out.empty())
      out[out.size() / 2] ^= std::byte{0x40};
    return ok;
  }
  std::atomic<bool> corrupt{false};
  std::atomic<bool> fail{false};
  std::atomic<int> failed_reads{0};

private:
  std::shared_ptr<tensor_source> inner_;
};

/// Nudges some floats of a tensor: a training step's worth of change.
void nudge(pipeline::host_tensor& t, uint32_t salt) {
  for (size_t i = salt % 7; i + 4 <= t.bytes.size(); i += 4 * 7)
    t.bytes[i + 3] ^= static_cast<std::byte>(1 + salt % 3);
}

/// Receives the answer of a request already made: true when it is a `T`
/// (handed to `on_value`), false (and a failure) for an error.
template <class T, class Handle, class F>
bool answer_of(caf::actor_system& sys, Handle& handle, F&& on_value) {
  bool got = false;
  handle.receive(
    [&](T& value) {
      got = true;
      on_value(value);
    },
    [&](caf::error& err) { ADD_FAILURE() << sys.render(err); });
  return got;
}

class replica_actor_test : public ::testing::Test {
protected:
  replica_actor_test()
      : sys(deterministic(cfg)), self(sys, true),
        sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {
    auto opened = store::open_rocksdb_store((dir.path() / "db").string());
    EXPECT_TRUE(opened);
    backend = std::shared_ptr<store_backend>{std::move(*opened)};
    observed = std::make_shared<testing::mutable_backend>(backend);
    store = sys.spawn(store_service, observed, testing::inline_lanes(), store_options{});
    sched.run();
    config = *engine::preset("tiny");
    pub = std::make_unique<pipeline::publisher>(*backend);
    bytes = std::make_shared<corrupting_source>(
      std::make_shared<pipeline::store_tensor_source>(*backend, pool));
  }

  ~replica_actor_test() override {
    if (replica)
      caf::anon_send_exit(replica, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(store, caf::exit_reason::user_shutdown);
    sched.run();
  }

  /// The weights of `run` at version `v`: seeded per run, nudged per version.
  pipeline::tensor_set weights_of(const std::string& run, uint64_t v) {
    auto w = *engine::random_init(config, run == "r" ? 42 : 7);
    for (uint64_t i = 1; i <= v; ++i)
      nudge(w.at("lm_head.weight"), static_cast<uint32_t>(i));
    return w;
  }

  /// Publishes straight into the backend, whose pointer move tells the
  /// store actor (and so the subscribed replica); without `notify` the
  /// store actor does not hear of it: the wake is "lost".
  void publish(const std::string& run, uint64_t v, bool notify = true,
               std::optional<pipeline::tensor_set> w = std::nullopt, bool anchor = false) {
    observed->mute(!notify);
    auto r = pub->publish({pool, run, v, anchor, false}, w ? *w : weights_of(run, v));
    observed->mute(false);
    ASSERT_TRUE(r) << to_string(r.error());
    if (notify)
      sched.run();
  }

  void start(replica_options o = {}) {
    o.pool = pool;
    if (o.backstop == 5000ms && !keep_backstop)
      o.backstop = 0ms;
    replica_deps d;
    d.store = store;
    d.make_engine = [this]() -> result<std::shared_ptr<engine_port>> {
      auto e = std::make_shared<test_engine>(config, fail_commits);
      engines.push_back(e);
      return std::shared_ptr<engine_port>{e};
    };
    d.bytes = bytes;
    d.source_for = [this](const std::string& p) -> std::shared_ptr<tensor_source> {
      return std::make_shared<pipeline::store_tensor_source>(*backend, p);
    };
    d.reconcile_worker = reconcile;
    d.request_workers = requests;
    replica = sys.spawn(replica_service, o, d);
    sched.run();
  }

  /// Runs messages and reconcile jobs (not generations) until both are idle.
  void settle() {
    for (;;) {
      size_t n = sched.run();
      n += reconcile->run_all();
      if (n == 0)
        return;
    }
  }

  /// `server_info` in the words of its JSON (DESIGN §5).
  struct info_view {
    bool ready = false;
    std::string applied, pointer, run_id, sync_state, commit_mode, terminal_error, reason;
    int64_t applied_version = -1;
    uint64_t active_requests = 0;
    replica_metrics metrics;
  };

  info_view info() {
    self->send(replica, atom::server_info_v);
    sched.run();
    replica_info i;
    self->receive([&](const replica_info& r) { i = r; },
                  caf::after(0s) >> [&] { ADD_FAILURE() << "no server_info"; });
    info_view v;
    v.ready = i.ready;
    v.applied = i.applied ? to_string(*i.applied) : "";
    v.pointer = i.pointer ? to_string(*i.pointer) : "";
    v.run_id = i.run_id();
    v.sync_state = std::string{to_string(i.state)};
    v.commit_mode = std::string{to_string(i.mode)};
    v.terminal_error = i.terminal_error.value_or("");
    v.reason = i.reason;
    v.applied_version = i.serving ? static_cast<int64_t>(*i.serving) : -1;
    v.active_requests = i.active_requests;
    v.metrics = i.metrics;
    return v;
  }

  static replica_call call(uint64_t key, int64_t min = -1, int64_t exact = -1,
                           std::string sampling = R"("temperature":0,"max_new_tokens":8)") {
    replica_call c;
    c.key = key;
    if (min >= 0)
      c.c.min_version = static_cast<uint64_t>(min);
    if (exact >= 0)
      c.c.exact_version = static_cast<uint64_t>(exact);
    c.route = "/generate";
    c.body =
      R"({"text":"policy says","sampling_params":{)" + sampling + R"(},"return_logprob":true})";
    return c;
  }

  void send(const replica_call& c) {
    self->send(replica, atom::generate_v, c);
    sched.run();
  }

  /// A replica answer with its JSON body read back.
  struct reply_view {
    uint16_t status = 0;
    std::string error_type, message, run_id;
    bool retryable = false;
    uint64_t target_version = 0;
    int64_t applied = -1;
    uint64_t weight_version_start = 0, weight_version_end = 0;
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
  };

  /// The next reply, which must be there.
  reply_view reply() {
    replica_answer a;
    a.status = 0;
    self->receive([&](const replica_answer& r) { a = r; },
                  caf::after(0s) >> [&] { ADD_FAILURE() << "no reply arrived"; });
    reply_view v;
    v.status = a.status;
    v.error_type = a.error_type;
    v.retryable = a.retryable;
    v.run_id = a.run_id;
    EXPECT_EQ(a.replica_id, "replica-0");
    auto body = nlohmann::json::parse(a.body, nullptr, false);
    if (a.status == 0 || body.is_discarded()) {
      ADD_FAILURE() << "unreadable body: " << a.body;
      return v;
    }
    if (a.status != 200) {
      v.message = body.value("message", "");
      EXPECT_EQ(body["type"], a.error_type);
      EXPECT_EQ(body["error"]["type"], a.error_type);
      if (a.status == 409) {
        v.target_version = body["target_version"].get<uint64_t>();
        v.applied = body["applied"].is_null() ? -1 : body["applied"].get<int64_t>();
      }
      if (a.retryable) {
        EXPECT_EQ(a.retry_after, 1u);
      }
      return v;
    }
    EXPECT_TRUE(a.stamped);
    if (!a.stamped)
      return v;
    v.weight_version_start = a.stamped->start;
    v.weight_version_end = a.stamped->end;
    const auto& meta = body["meta_info"];
    EXPECT_EQ(meta["weight_version_start"], v.weight_version_start);
    EXPECT_EQ(meta["weight_version_end"], v.weight_version_end);
    EXPECT_EQ(meta["weight_version"], std::to_string(v.weight_version_start));
    EXPECT_EQ(meta["run_id"], a.run_id);
    // Which version made each token agrees with the stamps.
    for (const auto& span : meta.value("weight_version_spans", nlohmann::json::array())) {
      EXPECT_GE(span["version"].get<uint64_t>(), v.weight_version_start) << a.body;
      EXPECT_LE(span["version"].get<uint64_t>(), v.weight_version_end) << a.body;
    }
    v.tokens = body["output_ids"].get<std::vector<int32_t>>();
    for (const auto& lp : meta["output_token_logprobs"])
      v.logprobs.push_back(lp[0].get<float>());
    return v;
  }

  bool no_reply() {
    bool none = true;
    self->receive([&](const replica_answer&) { none = false; }, caf::after(0s) >> [] {});
    return none;
  }

  /// Greedy tokens and logprobs of `call`'s prompt on a fresh engine built
  /// from `w`.
  engine::generation_output reference(const pipeline::tensor_set& w) {
    auto built = engine::build_weights(config, w);
    EXPECT_TRUE(built);
    engine::sampling_options o;
    o.max_tokens = 8;
    auto out = engine::generate(**built, config, engine::tokenizer{}, "policy says", o);
    EXPECT_TRUE(out);
    return *out;
  }

  temp_dir dir;
  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scoped_actor self;
  caf::scheduler::test_coordinator& sched;
  const std::string pool = "default";
  std::shared_ptr<store_backend> backend;
  /// What the store actor hosts: `backend`, its moves hidden on request.
  std::shared_ptr<testing::mutable_backend> observed;
  store_actor store;
  engine::model_config config;
  std::unique_ptr<pipeline::publisher> pub;
  /// Serves r/0, publishes anchor r/1 while `fault` is set, and checks the
  /// failed fetch: nothing activated, v0 still served. Then clears `fault`,
  /// wakes the replica and checks the whole version is fetched anew and
  /// served. Returns the replica's state while it failed.
  info_view fetch_while(std::atomic<bool>& fault) {
    publish("r", 0);
    start();
    settle();
    fault = true;
    publish("r", 1, true, std::nullopt, true);
    settle();
    auto bad = info();
    EXPECT_EQ(bad.sync_state, "ERROR");
    EXPECT_EQ(bad.applied_version, 0);
    EXPECT_TRUE(bad.ready) << "the serving weights are untouched and keep serving";
    EXPECT_EQ(engines.at(0)->commits.load(), 1);
    expect_served(1, 0);
    fault = false;
    self->send(replica, atom::wake_v);
    settle();
    auto good = info();
    EXPECT_EQ(good.applied_version, 1);
    EXPECT_EQ(good.sync_state, "IDLE");
    expect_served(2, 1);
    return bad;
  }

  /// A request with `key` is answered 200 with version `v`'s tokens.
  void expect_served(uint64_t key, uint64_t v) {
    send(call(key));
    requests->run_all();
    sched.run();
    auto r = reply();
    ASSERT_EQ(r.status, 200);
    EXPECT_EQ(r.tokens, reference(weights_of("r", v)).tokens);
  }

  std::shared_ptr<corrupting_source> bytes;
  std::shared_ptr<stepped_executor> reconcile = std::make_shared<stepped_executor>();
  std::shared_ptr<stepped_executor> requests = std::make_shared<stepped_executor>();
  std::shared_ptr<std::atomic<int>> fail_commits = std::make_shared<std::atomic<int>>(0);
  std::vector<std::shared_ptr<test_engine>> engines;
  bool keep_backstop = false;
  replica_actor replica;
};

TEST_F(replica_actor_test, fresh_replica_catches_up_and_only_then_reports_ready) {
  for (uint64_t v = 0; v <= 2; ++v)
    publish("r", v);
  start();
  // The pass has read the pointer and the chain and posted the stage.
  auto before = info();
  EXPECT_FALSE(before.ready);
  EXPECT_EQ(before.sync_state, "STAGING");
  EXPECT_EQ(before.applied_version, -1);
  EXPECT_EQ(before.applied, "");
  send(call(1));
  auto early = reply();
  EXPECT_EQ(early.status, 503);
  EXPECT_EQ(early.error_type, "EngineUnavailable");
  EXPECT_TRUE(early.retryable);

  settle();
  auto after = info();
  EXPECT_TRUE(after.ready);
  EXPECT_EQ(after.applied, "r/weight_v000002");
  EXPECT_EQ(after.applied_version, 2);
  EXPECT_EQ(after.run_id, "r");
  EXPECT_EQ(after.sync_state, "IDLE");
  EXPECT_EQ(after.commit_mode, "in_place");
  EXPECT_EQ(after.metrics.activations_total, 1u);
  EXPECT_EQ(after.metrics.stages_total, 1u);
  EXPECT_EQ(after.metrics.last_folded, 3u);
  EXPECT_GT(after.metrics.bytes_fetched_total, 0u);
  EXPECT_EQ(engines.size(), 1u);

  send(call(2));
  ASSERT_EQ(requests->pending(), 1u);
  requests->run();
  sched.run();
  auto ok = reply();
  ASSERT_EQ(ok.status, 200) << ok.message;
  EXPECT_EQ(ok.weight_version_start, 2u);
  EXPECT_EQ(ok.weight_version_end, 2u);
  EXPECT_EQ(ok.run_id, "r");
  auto ref = reference(weights_of("r", 2));
  EXPECT_EQ(ok.tokens, ref.tokens);
  EXPECT_EQ(ok.logprobs, ref.logprobs);
}

TEST_F(replica_actor_test, an_engine_out_of_service_takes_the_replica_out_of_rotation) {
  publish("r", 0);
  start();
  settle();
  ASSERT_TRUE(info().ready);
  engines.back()->out_of_service = true;
  auto down = info();
  EXPECT_FALSE(down.ready);
  EXPECT_NE(down.reason.find("engine unavailable"), std::string::npos) << down.reason;
  EXPECT_NE(down.reason.find("re-synced"), std::string::npos) << down.reason;
  engines.back()->out_of_service = false;
  EXPECT_TRUE(info().ready);
}

TEST_F(replica_actor_test, folding_eight_versions_is_one_stage_and_one_commit) {
  publish("r", 0);
  start();
  settle();
  ASSERT_EQ(info().applied_version, 0);
  for (uint64_t v = 1; v <= 8; ++v)
    publish("r", v, false);
  self->send(replica, atom::wake_v);
  settle();
  auto i = info();
  EXPECT_EQ(i.applied, "r/weight_v000008");
  EXPECT_EQ(i.metrics.stages_total, 2u);
  EXPECT_EQ(i.metrics.activations_total, 2u);
  EXPECT_EQ(i.metrics.last_folded, 8u);
  EXPECT_EQ(engines.at(0)->stages.load(), 2);
  EXPECT_EQ(engines.at(0)->commits.load(), 2);
  send(call(1));
  requests->run_all();
  sched.run();
  auto r = reply();
  ASSERT_EQ(r.status, 200);
  auto ref = reference(weights_of("r", 8));
  EXPECT_EQ(r.tokens, ref.tokens);
  EXPECT_EQ(r.logprobs, ref.logprobs);
}

TEST_F(replica_actor_test, an_all_empty_tail_advances_the_version_without_an_activation) {
  publish("r", 0);
  start();
  settle();
  // Same weights again: empty deltas.
  publish("r", 1, false, weights_of("r", 0));
  publish("r", 2, true, weights_of("r", 0));
  settle();
  auto i = info();
  EXPECT_EQ(i.applied_version, 2);
  EXPECT_TRUE(i.ready);
  EXPECT_EQ(i.metrics.activations_total, 1u);
  EXPECT_GE(i.metrics.skipped_activations_total, 1u);
  EXPECT_EQ(engines.at(0)->commits.load(), 1);
  send(call(1, 2));
  requests->run_all();
  sched.run();
  auto r = reply();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.weight_version_start, 2u);
  // The engine counts its tokens as version 2 too (reply() checks the spans
  // against the stamps), and offers its weights to peers as version 2.
  auto view = engines.at(0)->host_view();
  ASSERT_TRUE(view);
  EXPECT_EQ(view->version, (version_ref{"r", 2}));
}

TEST_F(replica_actor_test, a_run_switch_drains_every_request_and_resets_to_the_boot) {
  publish("r", 0);
  publish("r", 1);
  start();
  settle();
  send(call(1)); // in flight on r/1, no constraint
  ASSERT_EQ(requests->pending(), 1u);
  publish("s", 0);
  settle();
  auto mid = info();
  EXPECT_EQ(mid.sync_state, "COMMITTING");
  EXPECT_EQ(mid.applied, "r/weight_v000001");
  EXPECT_EQ(engines.at(0)->commits.load(), 1) << "in_place must still drain for a run switch";
  send(call(2)); // queued behind the closed gate
  EXPECT_TRUE(no_reply());

  requests->run(); // the r request finishes, the commit proceeds
  settle();
  auto first = reply();
  ASSERT_EQ(first.status, 200);
  EXPECT_EQ(first.run_id, "r");
  EXPECT_EQ(first.weight_version_start, 1u);
  EXPECT_EQ(first.weight_version_end, 1u);
  EXPECT_EQ(info().applied, "s/weight_v000000");
  EXPECT_EQ(engines.at(0)->flushes.load(), 1);

  ASSERT_EQ(requests->pending(), 1u);
  requests->run();
  sched.run();
  auto second = reply();
  ASSERT_EQ(second.status, 200);
  EXPECT_EQ(second.run_id, "s");
  EXPECT_EQ(second.weight_version_start, 0u);
  EXPECT_EQ(second.weight_version_end, 0u);
  auto ref = reference(weights_of("s", 0));
  EXPECT_EQ(second.tokens, ref.tokens);
  EXPECT_EQ(second.logprobs, ref.logprobs);
}

TEST_F(replica_actor_test, a_lost_wake_converges_on_the_next_backstop_tick) {
  keep_backstop = true;
  publish("r", 0);
  start();
  settle();
  publish("r", 1, false); // nobody is told
  settle();
  EXPECT_EQ(info().applied_version, 0);
  sched.advance_time(5s);
  settle();
  EXPECT_EQ(info().applied_version, 1);
}

TEST_F(replica_actor_test, a_409_answers_with_the_applied_version_and_triggers_a_wake) {
  publish("r", 0);
  start();
  settle();
  publish("r", 1, false);
  send(call(1, 1));
  auto r = reply();
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(r.error_type, "WeightVersionNotReady");
  EXPECT_EQ(r.target_version, 1u);
  EXPECT_EQ(r.applied, 0);
  EXPECT_TRUE(r.retryable);
  settle();
  EXPECT_EQ(info().applied_version, 1);
  send(call(2, 1));
  requests->run_all();
  sched.run();
  auto ok = reply();
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.weight_version_start, 1u);
  // An exact pin below the applied version can never be served again.
  send(call(3, -1, 0));
  auto old = reply();
  EXPECT_EQ(old.status, 409);
  EXPECT_FALSE(old.retryable);
}

TEST_F(replica_actor_test, quiesce_waits_for_every_request_before_activating) {
  publish("r", 0);
  replica_options o;
  o.mode = commit_mode::quiesce;
  start(o);
  settle();
  send(call(1));
  publish("r", 1);
  settle();
  EXPECT_EQ(info().sync_state, "COMMITTING");
  EXPECT_EQ(engines.at(0)->commits.load(), 1);
  requests->run();
  settle();
  auto r = reply();
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.weight_version_start, 0u);
  EXPECT_EQ(r.weight_version_end, 0u);
  auto i = info();
  EXPECT_EQ(i.applied_version, 1);
  EXPECT_EQ(i.commit_mode, "quiesce");
}

TEST_F(replica_actor_test, in_place_waits_only_for_exact_pins_and_others_cross_with_both_stamps) {
  publish("r", 0);
  start();
  settle();
  send(call(1));        // job 0: no constraint
  send(call(2, -1, 0)); // job 1: pinned to 0
  publish("r", 1);
  settle();
  EXPECT_EQ(info().sync_state, "COMMITTING");
  EXPECT_EQ(engines.at(0)->commits.load(), 1) << "the exact pin holds the activation";
  requests->run(1); // the pin finishes on 0
  settle();
  auto pinned = reply();
  ASSERT_EQ(pinned.status, 200);
  EXPECT_EQ(pinned.weight_version_start, 0u);
  EXPECT_EQ(pinned.weight_version_end, 0u);
  EXPECT_EQ(info().applied_version, 1);
  EXPECT_EQ(engines.at(0)->commits.load(), 2);
  EXPECT_EQ(engines.at(0)->flushes.load(), 0);
  // The unpinned request was admitted on 0 and ran after the activation.
  requests->run();
  sched.run();
  auto crossed = reply();
  ASSERT_EQ(crossed.status, 200);
  EXPECT_EQ(crossed.weight_version_start, 0u);
  EXPECT_EQ(crossed.weight_version_end, 1u);
  EXPECT_EQ(crossed.tokens, reference(weights_of("r", 1)).tokens);
  EXPECT_GT(info().metrics.last_pause_us, 0.0);
}

TEST_F(replica_actor_test,
       an_exact_pin_outliving_the_drain_deadline_is_aborted_with_drain_timeout) {
  publish("r", 0);
  replica_options o;
  o.drain_timeout = 2s;
  start(o);
  settle();
  send(call(1, -1, 0));
  publish("r", 1);
  settle();
  EXPECT_EQ(info().applied_version, 0);
  sched.advance_time(3s);
  settle();
  auto i = info();
  EXPECT_EQ(i.applied_version, 1);
  EXPECT_EQ(i.metrics.drain_timeouts_total, 1u);
  requests->run_all();
  sched.run();
  auto r = reply();
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.error_type, "DrainTimeout");
  EXPECT_TRUE(r.retryable);
}

TEST_F(replica_actor_test,
       corrupt_bytes_are_never_activated_and_are_refetched_on_the_next_trigger) {
  auto bad = fetch_while(bytes->corrupt); // an anchor: the flipped byte decodes fine
  EXPECT_NE(bad.reason.find("lm_head.weight"), std::string::npos) << bad.reason;
  EXPECT_EQ(bad.metrics.checksum_failures_total, 1u);
}

TEST_F(replica_actor_test, a_read_error_mid_fetch_never_activates_and_the_fetch_is_retried_later) {
  auto bad = fetch_while(bytes->fail);
  EXPECT_GT(bytes->failed_reads.load(), 0);
  EXPECT_NE(bad.reason.find("Input/output error"), std::string::npos) << bad.reason;
}

TEST_F(replica_actor_test, a_failed_activation_leaves_rotation_until_the_engine_is_rebuilt) {
  publish("r", 0);
  start();
  settle();
  send(call(1)); // in flight across the failing in_place activation
  *fail_commits = 1;
  publish("r", 1);
  // Step until the failure is reported, before the rebuild runs.
  info_view down;
  for (int i = 0; i < 20; ++i) {
    sched.run();
    down = info();
    if (!down.terminal_error.empty() || reconcile->pending() == 0)
      break;
    reconcile->run();
  }
  ASSERT_FALSE(down.terminal_error.empty());
  EXPECT_FALSE(down.ready);
  EXPECT_EQ(down.sync_state, "ERROR");
  send(call(2));
  auto refused = reply();
  EXPECT_EQ(refused.status, 503);
  requests->run_all();
  sched.run();
  auto crossed = reply();
  EXPECT_EQ(crossed.status, 503) << "nothing finishes on uncertain weights";

  settle();
  auto up = info();
  EXPECT_TRUE(up.ready);
  EXPECT_EQ(up.terminal_error, "");
  EXPECT_EQ(up.applied_version, 1);
  EXPECT_EQ(up.metrics.rebuilds_total, 1u);
  EXPECT_EQ(up.metrics.activation_failures_total, 1u);
  ASSERT_EQ(engines.size(), 2u) << "a failed engine instance is never reused";
  EXPECT_EQ(engines.at(1)->resets.load(), 1);
  send(call(3));
  requests->run_all();
  sched.run();
  auto ok = reply();
  ASSERT_EQ(ok.status, 200);
  EXPECT_EQ(ok.tokens, reference(weights_of("r", 1)).tokens);
}

TEST_F(replica_actor_test, no_claimed_run_answers_503_until_a_run_is_claimed) {
  start();
  settle();
  auto i = info();
  EXPECT_FALSE(i.ready);
  EXPECT_EQ(i.reason, "no run claimed");
  send(call(1));
  auto r = reply();
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.message, "no run claimed");
  publish("r", 0);
  settle();
  EXPECT_TRUE(info().ready);
}

TEST_F(replica_actor_test, a_boot_version_above_zero_works) {
  publish("r", 5);
  publish("r", 6);
  start();
  settle();
  auto i = info();
  EXPECT_TRUE(i.ready);
  EXPECT_EQ(i.applied, "r/weight_v000006");
  EXPECT_EQ(i.pointer, "r/weight_v000006");
}

TEST_F(replica_actor_test, a_cancelled_request_answers_499_and_leaves_the_gate) {
  publish("r", 0);
  start();
  settle();
  send(call(7));
  self->send(replica, atom::cancel_v, uint64_t{7});
  sched.run();
  requests->run_all();
  sched.run();
  auto r = reply();
  EXPECT_EQ(r.status, 499);
  EXPECT_EQ(info().active_requests, 0u);
}

TEST_F(replica_actor_test, keys_are_unique_per_caller_not_per_replica) {
  publish("r", 0);
  start();
  settle();
  // The gateway and the replica's own HTTP front count keys independently.
  caf::scoped_actor other{sys, true};
  send(call(1));
  other->send(replica, atom::generate_v, call(1));
  sched.run();
  requests->run_all();
  sched.run();
  EXPECT_EQ(reply().status, 200);
  bool other_ok = false;
  other->receive([&](const replica_answer& a) { other_ok = a.status == 200; },
                 caf::after(0s) >> [] {});
  EXPECT_TRUE(other_ok);
  // The same caller reusing a key in flight is refused.
  send(call(2));
  send(call(2));
  EXPECT_EQ(reply().status, 400);
  requests->run_all();
  sched.run();
  EXPECT_EQ(reply().status, 200);
}

TEST_F(replica_actor_test, malformed_calls_are_refused_with_400) {
  publish("r", 0);
  start();
  settle();
  send(call(1, 5, 3));
  auto r = reply();
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.message.find("exact_version"), std::string::npos);
  // (Negative bounds cannot be expressed: the constraint is typed, and its
  // one parser at the HTTP surface refuses them; see the gateway tests.)
  send(call(3, -1, -1, R"("temperature":-1)"));
  requests->run_all();
  sched.run();
  EXPECT_EQ(reply().status, 400);
}

TEST_F(replica_actor_test, other_routes_pass_through_and_control_routes_are_blocked) {
  publish("r", 0);
  start();
  settle();
  replica_call models;
  models.key = 1;
  models.method = "GET";
  models.route = "/v1/models";
  send(models);
  requests->run_all();
  sched.run();
  replica_answer a;
  self->receive([&](const replica_answer& r) { a = r; }, caf::after(0s) >> [] {});
  EXPECT_EQ(a.status, 200);
  EXPECT_FALSE(a.stamped);
  EXPECT_EQ(nlohmann::json::parse(a.body)["object"], "list");

  replica_call control;
  control.key = 2;
  control.route = "/update_weights_from_disk";
  control.body = "{}";
  send(control);
  EXPECT_EQ(requests->pending(), 0u) << "a blocked route never reaches the engine";
  auto r = reply();
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(r.error_type, "RouteBlocked");
}

TEST_F(replica_actor_test, a_retiring_replica_leaves_rotation_finishes_what_runs_then_quits) {
  publish("r", 0);
  start();
  settle();
  self->monitor(replica);
  // One versioned and one pass-through request are running when it retires.
  send(call(1));
  replica_call models;
  models.key = 2;
  models.method = "GET";
  models.route = "/v1/models";
  send(models);
  self->send(replica, atom::retire_v, std::string{});
  sched.run();
  auto now = info();
  EXPECT_FALSE(now.ready);
  EXPECT_EQ(now.reason, "retiring");
  // New requests are refused, retryably, so the gateway goes elsewhere.
  send(call(3));
  auto refused = reply();
  EXPECT_EQ(refused.status, 503);
  EXPECT_TRUE(refused.retryable);
  EXPECT_NE(refused.message.find("retiring"), std::string::npos);
  // The running ones finish, whichever kind finishes last; then it quits.
  requests->run_all();
  sched.run();
  int answered = 0;
  bool down = false;
  for (int i = 0; i < 3; ++i)
    self->receive([&](const replica_answer& a) { answered += a.status == 200 ? 1 : 0; },
                  [&](const caf::down_msg&) { down = true; }, caf::after(0s) >> [] {});
  EXPECT_EQ(answered, 2);
  EXPECT_TRUE(down) << "the replica quits once drained";
}

TEST_F(replica_actor_test,
       retire_and_profile_need_the_member_capability_and_internals_are_its_own) {
  publish("r", 0);
  replica_options o;
  o.member_token = "member-cap";
  start(o);
  settle();
  ASSERT_TRUE(info().ready);
  // A retire without the capability leaves it in rotation.
  self->send(replica, atom::retire_v, std::string{"member-caq"});
  settle();
  EXPECT_TRUE(info().ready);
  // A profile (which takes it out of rotation to follow another pool) is
  // refused, naming what is missing.
  auto refused = self->request(replica, caf::infinite, atom::profile_v, std::string{"scratch"},
                               true, std::string{});
  settle();
  refused.receive([](const replica_info&) { ADD_FAILURE() << "profiled without the capability"; },
                  [&](caf::error& err) {
                    EXPECT_NE(sys.render(err).find("member capability"), std::string::npos)
                      << sys.render(err);
                  });
  EXPECT_TRUE(info().ready);
  // An offer (registered memory and its remote keys) goes to members only.
  auto offer = self->request(replica, caf::infinite, atom::offer_v, version_ref{"r", 0}, false,
                             std::string{"guess"});
  settle();
  offer.receive([](const peer_offer&) { ADD_FAILURE() << "an offer without the capability"; },
                [&](caf::error& err) {
                  EXPECT_NE(sys.render(err).find("member capability"), std::string::npos)
                    << sys.render(err);
                });
  // Forged reports of its own workers (a failed commit, a finished
  // generation) from anyone else are dropped: it serves on as before.
  work_report failed;
  failed.err = to_caf_error({errc::engine_unavailable, "forged"});
  caf::anon_send(replica, atom::committed_v, failed);
  caf::anon_send(replica, atom::rebuilt_v, failed);
  caf::anon_send(replica, atom::generated_v, uint64_t{1}, replica_answer{}, caf::error{},
                 caf::optional<uint64_t>{});
  settle();
  auto now = info();
  EXPECT_TRUE(now.ready);
  EXPECT_EQ(now.applied_version, 0);
  EXPECT_TRUE(now.terminal_error.empty()) << now.terminal_error;
  send(call(7));
  requests->run_all();
  settle();
  EXPECT_EQ(reply().status, 200);
  // With the capability, it retires (and, idle, quits at once).
  self->monitor(replica);
  self->send(replica, atom::retire_v, std::string{"member-cap"});
  settle();
  bool down = false;
  self->receive([&](const caf::down_msg&) { down = true; }, caf::after(0s) >> [] {});
  EXPECT_TRUE(down);
}

TEST_F(replica_actor_test, a_profile_drains_first_follows_only_its_steps_and_goes_home) {
  publish("r", 0);
  replica_options o;
  o.profile_lease = 60s;
  start(o);
  settle();
  // In rotation: refused without take_out, naming the flag.
  auto refused = self->request(replica, caf::infinite, atom::profile_v, std::string{"scratch"},
                               false, std::string{});
  settle();
  refused.receive([](const replica_info&) { ADD_FAILURE() << "a replica in rotation profiled"; },
                  [&](caf::error& err) {
                    EXPECT_NE(sys.render(err).find("--take-out"), std::string::npos)
                      << sys.render(err);
                  });
  // A request is running: the profile begins only once it finished, and new
  // requests are refused (retryable) meanwhile.
  send(call(1));
  auto begin = self->request(replica, caf::infinite, atom::profile_v, std::string{"scratch"}, true,
                             std::string{});
  settle();
  send(call(2));
  auto out = reply();
  EXPECT_EQ(out.status, 503);
  EXPECT_TRUE(out.retryable);
  EXPECT_NE(out.message.find("profiling"), std::string::npos) << out.message;
  EXPECT_FALSE(info().ready);
  requests->run_all();
  settle();
  auto first = reply();
  EXPECT_EQ(first.status, 200) << "the running request finished on its own weights";
  EXPECT_EQ(first.run_id, "r");
  EXPECT_TRUE(
    answer_of<replica_info>(sys, begin, [](replica_info& i) { EXPECT_EQ(i.pool, "scratch"); }));

  // The scratch pool's versions, and a home pointer move the replica must
  // not follow until it goes home.
  auto w1 = weights_of("s", 1);
  ASSERT_TRUE(pub->publish({"scratch", "s", 1, false, false}, w1));
  auto w2 = weights_of("s", 2);
  ASSERT_TRUE(pub->publish({"scratch", "s", 2, false, false}, w2));
  publish("r", 1);
  settle();
  auto waiting = info();
  EXPECT_EQ(waiting.applied, "") << "it starts cold in the scratch pool";
  EXPECT_EQ(waiting.pointer, "") << "no pass without a step";
  auto cold =
    self->request(replica, caf::infinite, atom::profile_v, version_ref{"s", 2}, std::string{});
  settle();
  EXPECT_TRUE(answer_of<profile_step>(sys, cold, [](profile_step& s) {
    EXPECT_FALSE(s.from) << "a cold start";
    EXPECT_TRUE(s.activated);
    EXPECT_EQ(s.folded, 2u) << "the anchor and one delta";
    EXPECT_GT(s.stage_s, 0);
    EXPECT_GT(s.fetch_s, 0);
    EXPECT_GT(s.decode_s, 0);
    EXPECT_GT(s.bytes_from_store, 0u);
    EXPECT_TRUE(s.checksum_ok) << s.checksum_detail;
    EXPECT_EQ(s.checksum_basis, "served weights");
  }));
  EXPECT_EQ(info().applied, "s/weight_v000002");
  ASSERT_TRUE(pub->publish({"scratch", "s", 3, false, false}, weights_of("s", 3)));
  auto next =
    self->request(replica, caf::infinite, atom::profile_v, version_ref{"s", 3}, std::string{});
  settle();
  EXPECT_TRUE(answer_of<profile_step>(sys, next, [](profile_step& s) {
    EXPECT_EQ(s.from, (version_ref{"s", 2}));
    EXPECT_EQ(s.folded, 1u);
    EXPECT_TRUE(s.checksum_ok) << s.checksum_detail;
  }));
  // A step whose target the pointer does not name fails, saying where the
  // pass stopped.
  auto missing =
    self->request(replica, caf::infinite, atom::profile_v, version_ref{"s", 9}, std::string{});
  settle();
  missing.receive([](const profile_step&) { ADD_FAILURE() << "reached a missing version"; },
                  [&](caf::error& err) {
                    EXPECT_NE(sys.render(err).find("s/weight_v000003"), std::string::npos)
                      << sys.render(err);
                  });
  // Nobody ends it: the lease runs out and it goes home, to the pointer as
  // it is now, back in rotation.
  sched.advance_time(61s);
  settle();
  auto home = info();
  EXPECT_TRUE(home.ready) << home.reason;
  EXPECT_EQ(home.applied, "r/weight_v000001");
  expect_served(3, 1);
  auto late =
    self->request(replica, caf::infinite, atom::profile_v, version_ref{"s", 3}, std::string{});
  settle();
  late.receive([](const profile_step&) { ADD_FAILURE() << "a step after the profile ended"; },
               [](caf::error&) {});
}

TEST_F(replica_actor_test, streamed_events_reach_the_caller_before_the_stamped_last_event) {
  publish("r", 0);
  start();
  settle();
  auto c = call(1, 0);
  c.route = "/v1/completions";
  c.body = R"({"prompt":"policy says","temperature":0,"max_tokens":6,"stream":true})";
  send(c);
  requests->run_all();
  sched.run();
  std::vector<std::string> events;
  replica_answer last;
  last.status = 0;
  for (int i = 0; i < 64 && last.status != 200; ++i)
    self->receive(
      [&](atom::event, uint64_t key, const std::string& ev) {
        EXPECT_EQ(key, 1u);
        EXPECT_NE(last.status, 200) << "no event after the answer";
        events.push_back(ev);
      },
      [&](const replica_answer& r) { last = r; }, caf::after(0s) >> [] {});
  ASSERT_EQ(last.status, 200);
  EXPECT_TRUE(last.stream) << last.body;
  EXPECT_FALSE(events.empty()) << last.body;
  auto final_event = nlohmann::json::parse(last.body);
  EXPECT_EQ(final_event["weight_version_start"], 0);
  EXPECT_EQ(final_event["weight_version_end"], 0);
  EXPECT_EQ(final_event["run_id"], "r");
  EXPECT_FALSE(nlohmann::json::parse(events.front()).contains("weight_version_start"));
}

TEST(counting_source, reports_progress_at_every_boundary_crossed) {
  class zeros final : public tensor_source {
  public:
    result<manifest> manifest_of(const version_ref&) override {
      return make_error(errc::not_found, "none");
    }
    status read(const version_ref&, std::string_view, uint64_t, std::span<std::byte>) override {
      return {};
    }
  };
  std::vector<uint64_t> seen;
  counting_source src{std::make_shared<zeros>(), [&](uint64_t total) { seen.push_back(total); },
                      100};
  std::vector<std::byte> buf(60);
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(src.read({"r", 0}, "t", 0, buf));
  EXPECT_EQ(src.bytes(), 300u);
  EXPECT_EQ(seen, (std::vector<uint64_t>{120, 240, 300}));
}

} // namespace
} // namespace stitch
