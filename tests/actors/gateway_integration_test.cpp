// The gateway and replica HTTP surfaces over real sockets, against built-in
// replicas at different versions (DESIGN §5).

#include "cluster_fixture.hpp"
#include "fakes.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

namespace stitch::testing {
namespace {

using namespace std::chrono_literals;

/// A fake replica that claims to serve `claims`. It either refuses every
/// request with a retryable 409 (the gateway must retry elsewhere, never
/// duplicate work) or, with `hold`, takes requests and never answers (its
/// node hung or died behind another node's route). Counts calls and cancels.
struct fake_counts {
  std::atomic<int> calls{0};
  std::atomic<int> cancels{0};
};

replica_actor spawn_fake_replica(caf::actor_system& sys, std::shared_ptr<fake_counts> counts,
                                 uint64_t claims, bool hold) {
  replica_info i;
  i.replica_id = "fake";
  i.pool = "default";
  i.ready = true;
  i.applied = version_ref{"r", claims};
  i.serving = claims;
  auto script = [counts, hold](scripted_replica_ptr self,
                               replica_call&) -> caf::result<replica_answer> {
    ++counts->calls;
    if (hold) {
      auto p = self->make_response_promise<replica_answer>();
      self->state.held.push_back(p);
      return p;
    }
    auto a = answer_of(not_ready_error(rejection{0, 0, true, "fake says no"}));
    a.replica_id = "fake";
    return a;
  };
  return sys.spawn(scripted_replica, i, generate_script{script},
                   std::function<void(uint64_t)>{[counts](uint64_t) { ++counts->cancels; }});
}

using gateway_test = cluster_test;

TEST_F(gateway_test, routes_by_constraint_and_answers_409_itself_when_none_satisfies) {
  publish(0);
  start_replica("a");
  start_replica("b");
  serve_gateway();
  await_ready({"a", "b"}, 0);
  workers[1]->hold(); // b stays at 0
  publish(1);
  await_ready({"a"}, 1);

  auto fresh = http(gateway_port, "POST", "/generate", generate_body(R"({"min_version":1})"));
  ASSERT_EQ(fresh.status, 200u) << fresh.body;
  EXPECT_EQ(fresh.header("X-Stitch-Replica"), "a");
  EXPECT_EQ(fresh.json()["meta_info"]["weight_version_start"], 1);
  EXPECT_EQ(fresh.json()["meta_info"]["weight_version_end"], 1);

  auto pinned = http(gateway_port, "POST", "/generate", generate_body(R"({"exact_version":"0"})"));
  ASSERT_EQ(pinned.status, 200u) << pinned.body;
  EXPECT_EQ(pinned.header("X-Stitch-Replica"), "b");
  EXPECT_EQ(pinned.json()["meta_info"]["weight_version_start"], 0);

  auto header =
    http(gateway_port, "POST", "/generate", generate_body(), {{"X-Stitch-Exact-Version", "1"}});
  ASSERT_EQ(header.status, 200u);
  EXPECT_EQ(header.header("X-Stitch-Replica"), "a");

  auto ahead = http(gateway_port, "POST", "/generate", generate_body(R"({"min_version":2})"));
  ASSERT_EQ(ahead.status, 409u) << ahead.body;
  auto j = ahead.json();
  EXPECT_EQ(j["type"], "WeightVersionNotReady");
  EXPECT_EQ(j["target_version"], 2);
  EXPECT_EQ(j["applied"], 1);
  EXPECT_EQ(j["retryable"], true);
  EXPECT_EQ(j["error"]["type"], "WeightVersionNotReady");
  EXPECT_EQ(ahead.header("Retry-After"), "1");

  // Every response's stamps satisfy its constraint; b catches up once released.
  workers[1]->release();
  await_ready({"a", "b"}, 1);
  auto health = http(gateway_port, "GET", "/health");
  EXPECT_EQ(health.status, 200u);
  EXPECT_EQ(health.json()["ready"], true);
  EXPECT_EQ(health.json()["ready_replicas"], 2);
  EXPECT_EQ(health.json()["replicas"], 2);
  auto view = http(gateway_port, "GET", "/pool").json();
  EXPECT_EQ(view["summary"]["ready"], 2);
  EXPECT_EQ(view["summary"]["versions"]["r/weight_v000001"], 2);
  EXPECT_EQ(view["replicas"].size(), 2u);
  EXPECT_EQ(http(gateway_port, "POST", "/wake").status, 200u);
  // Every replica moved past 0: an exact pin on it can never be served again.
  auto gone = http(gateway_port, "POST", "/generate", generate_body(R"({"exact_version":0})"));
  ASSERT_EQ(gone.status, 409u);
  EXPECT_EQ(gone.json()["retryable"], false);
  EXPECT_EQ(gone.header("Retry-After"), "");
}

TEST_F(gateway_test, a_session_sticks_to_its_replica_and_moves_once_when_it_goes_away) {
  publish(0);
  start_replica("a");
  start_replica("b");
  serve_gateway();
  await_ready({"a", "b"}, 0);
  auto first = http(gateway_port, "POST", "/generate", generate_body(), {{"X-Session-Id", "s1"}});
  ASSERT_EQ(first.status, 200u);
  std::string home = first.header("X-Stitch-Replica");
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(http(gateway_port, "POST", "/generate", generate_body(),
                   {{"Modal-Session-ID", "other"}, {"X-Session-Id", "s1"}})
                .header("X-Stitch-Replica"),
              home);
  // The reference clients' header works the same way.
  auto modal =
    http(gateway_port, "POST", "/generate", generate_body(), {{"Modal-Session-ID", "m"}});
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(http(gateway_port, "POST", "/generate", generate_body(), {{"Modal-Session-ID", "m"}})
                .header("X-Stitch-Replica"),
              modal.header("X-Stitch-Replica"));

  auto gone = home == "a" ? replicas[0] : replicas[1];
  self->send_exit(gone, caf::exit_reason::kill);
  std::string moved;
  for (int i = 0; i < 200 && moved.empty(); ++i) {
    auto r = http(gateway_port, "POST", "/generate", generate_body(), {{"X-Session-Id", "s1"}});
    if (r.status == 200 && r.header("X-Stitch-Replica") != home)
      moved = r.header("X-Stitch-Replica");
  }
  ASSERT_FALSE(moved.empty());
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(http(gateway_port, "POST", "/generate", generate_body(), {{"X-Session-Id", "s1"}})
                .header("X-Stitch-Replica"),
              moved);
}

TEST_F(gateway_test, a_refusing_replica_is_retried_elsewhere_without_duplicate_generation) {
  publish(0);
  start_replica("a");
  auto counts = std::make_shared<fake_counts>();
  auto fake = spawn_fake_replica(sys, counts, 7, false);
  caf::anon_send(gateway, atom::enroll_v, std::string{"default"}, fake, std::string{});
  serve_gateway();
  await_ready({"a"}, 0);
  // Only the fake claims 7: it refuses, nobody else can serve, its 409 is the answer.
  auto only = http(gateway_port, "POST", "/generate", generate_body(R"({"min_version":7})"),
                   {{"X-Session-Id", "x"}});
  EXPECT_EQ(only.status, 409u);
  EXPECT_EQ(only.header("X-Stitch-Replica"), "fake");
  EXPECT_EQ(counts->calls.load(), 1);
  // The session now prefers the fake; its refusal is retried on a.
  auto retried = http(gateway_port, "POST", "/generate", generate_body(), {{"X-Session-Id", "x"}});
  ASSERT_EQ(retried.status, 200u) << retried.body;
  EXPECT_EQ(retried.header("X-Stitch-Replica"), "a");
  EXPECT_EQ(counts->calls.load(), 2);
  EXPECT_EQ(engines.at(0)->forwarded.load(), 1) << "generated once";
  self->send_exit(fake, caf::exit_reason::user_shutdown);
}

TEST_F(gateway_test, a_dropped_replicas_requests_in_flight_are_cancelled_and_retried) {
  publish(0);
  auto counts = std::make_shared<fake_counts>();
  auto silent = spawn_fake_replica(sys, counts, 0, true);
  caf::anon_send(gateway, atom::enroll_v, std::string{"default"}, silent, std::string{});
  serve_gateway();
  // The silent replica is the only one: it takes the request and hangs.
  http_reply answer;
  std::thread client{[&] { answer = http(gateway_port, "POST", "/generate", generate_body()); }};
  for (int i = 0; i < 2000 && counts->calls.load() == 0; ++i)
    std::this_thread::sleep_for(5ms);
  ASSERT_EQ(counts->calls.load(), 1);
  start_replica("a");
  await_ready({"a"}, 0);
  // The coordinator removed the silent one's node: the request is retried on a.
  caf::anon_send(gateway, atom::retire_v, silent, std::string{});
  client.join();
  ASSERT_EQ(answer.status, 200u) << answer.body;
  EXPECT_EQ(answer.header("X-Stitch-Replica"), "a");
  EXPECT_EQ(counts->cancels.load(), 1) << "the abandoned attempt is cancelled";
  // It is out of routing: the next requests all go to a.
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(http(gateway_port, "POST", "/generate", generate_body()).header("X-Stitch-Replica"),
              "a");
  EXPECT_EQ(counts->calls.load(), 1);
  self->send_exit(silent, caf::exit_reason::user_shutdown);
}

TEST_F(gateway_test, a_client_that_disconnects_aborts_its_generation) {
  publish(0);
  start_replica("a");
  serve_gateway();
  await_ready({"a"}, 0);
  auto e = engines.at(0);
  auto steps_before = abandon_generation(gateway_port, e);
  ASSERT_TRUE(steps_before) << "the cancel reached the engine";
  EXPECT_EQ(e->inner.requests_in_flight(), 0u);
  EXPECT_LE(e->inner.stats().steps, *steps_before + 1) << "aborted, not generated to the end";
  for (int i = 0; i < 5000; ++i) {
    auto p = pool();
    if (!p.empty() && p[0].active_requests == 0)
      break;
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(pool().at(0).metrics.requests_completed_total, 0u);
}

TEST_F(gateway_test, streams_carry_the_stamps_on_the_last_event) {
  publish(0);
  start_replica("a");
  serve_gateway();
  await_ready({"a"}, 0);
  expect_stamped_stream(gateway_port);
}

TEST_F(gateway_test, oversized_bodies_and_bad_requests_are_4xx_with_a_json_error) {
  publish(0);
  start_replica("a");
  replica_http_options o;
  o.server.body_limit = 1024;
  serve_gateway(o);
  await_ready({"a"}, 0);
  auto big =
    http(gateway_port, "POST", "/generate", R"({"text":")" + std::string(4096, 'x') + R"("})");
  EXPECT_EQ(big.status, 413u);
  EXPECT_EQ(big.json()["type"], "PayloadTooLarge");
  auto bad =
    http(gateway_port, "POST", "/generate", R"({"text":"x","sampling_params":{"top_p":7}})");
  EXPECT_EQ(bad.status, 400u);
  EXPECT_EQ(bad.json()["message"], "sampling_params.top_p must be in (0, 1]");
  auto neg = http(gateway_port, "POST", "/generate", generate_body(R"({"min_version":-3})"));
  EXPECT_EQ(neg.status, 400u);
  EXPECT_NE(neg.json()["message"].get<std::string>().find("min_version"), std::string::npos);
}

TEST_F(gateway_test, the_reference_systems_shapes_keep_every_field_name) {
  publish(0);
  start_replica("a");
  serve_gateway();
  uint16_t direct = serve_replica(0);
  await_ready({"a"}, 0);
  for (uint16_t port : {gateway_port, direct}) {
    SCOPED_TRACE(port == direct ? "replica" : "gateway");
    // SGLang native, as the reference clients send it (both keys, one null).
    auto native = http(port, "POST", "/generate",
                       R"({"text":"abc","sampling_params":{"temperature":0,"max_new_tokens":4},
                           "return_logprob":true,
                           "weight_version":{"min_version":0,"exact_version":null}})");
    ASSERT_EQ(native.status, 200u) << native.body;
    auto n = native.json();
    for (const char* k : {"text", "output_ids", "meta_info"})
      EXPECT_TRUE(n.contains(k)) << k;
    for (const char* k :
         {"id", "finish_reason", "prompt_tokens", "completion_tokens", "output_token_logprobs",
          "weight_version", "weight_version_start", "weight_version_end", "run_id"})
      EXPECT_TRUE(n["meta_info"].contains(k)) << k;
    EXPECT_EQ(n["meta_info"]["weight_version"], "0");
    EXPECT_TRUE(n["meta_info"]["weight_version_start"].is_number_integer());

    auto completion = http(port, "POST", "/v1/completions",
                           R"({"model":"m","prompt":"abc","max_tokens":4,"temperature":0,
                               "logprobs":1,"weight_version":{"min_version":"0"}})");
    ASSERT_EQ(completion.status, 200u) << completion.body;
    auto c = completion.json();
    for (const char* k : {"id", "object", "created", "model", "choices", "usage",
                          "weight_version_start", "weight_version_end", "run_id"})
      EXPECT_TRUE(c.contains(k)) << k;
    for (const char* k : {"index", "text", "logprobs", "finish_reason"})
      EXPECT_TRUE(c["choices"][0].contains(k)) << k;
    for (const char* k : {"prompt_tokens", "completion_tokens", "total_tokens"})
      EXPECT_TRUE(c["usage"].contains(k)) << k;

    auto chat = http(port, "POST", "/v1/chat/completions",
                     R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4,
                         "logprobs":true})");
    ASSERT_EQ(chat.status, 200u) << chat.body;
    auto ch = chat.json();
    EXPECT_EQ(ch["object"], "chat.completion");
    EXPECT_EQ(ch["choices"][0]["message"]["role"], "assistant");
    EXPECT_TRUE(ch["choices"][0]["logprobs"]["content"].is_array());
    EXPECT_TRUE(ch.contains("weight_version_start"));

    auto refused = http(port, "POST", "/generate", generate_body(R"({"exact_version":5})"));
    ASSERT_EQ(refused.status, 409u);
    auto r = refused.json();
    for (const char* k : {"type", "target_version", "applied", "message", "retryable", "error"})
      EXPECT_TRUE(r.contains(k)) << k;
    EXPECT_EQ(r["error"]["target_version"], 5);

    auto health = http(port, "GET", "/health");
    EXPECT_EQ(health.status, 200u);
    EXPECT_EQ(health.json()["ready"], true);
    auto models = http(port, "GET", "/v1/models");
    EXPECT_EQ(models.status, 200u);
    EXPECT_EQ(models.json()["object"], "list");
  }
  auto info = http(direct, "GET", "/server_info").json();
  for (const char* k : {"ready", "applied", "applied_version", "run_id", "sync_state", "reason",
                        "terminal_error", "commit_mode", "active_requests", "metrics"})
    EXPECT_TRUE(info.contains(k)) << k;
  EXPECT_EQ(info["applied"], "r/weight_v000000");
  EXPECT_EQ(info["applied_version"], 0);
  EXPECT_EQ(info["sync_state"], "IDLE");
  for (const char* k :
       {"stage_s", "drain_ms", "pause_us", "folded_versions", "skipped_activations_total",
        "bytes_fetched_total", "checksum_failures_total"})
    EXPECT_TRUE(info["metrics"].contains(k)) << k;
  EXPECT_EQ(http(direct, "GET", "/generate").status, 405u);
  EXPECT_EQ(http(direct, "POST", "/generate", R"({"text":1})").status, 400u);
}

} // namespace
} // namespace stitch::testing
