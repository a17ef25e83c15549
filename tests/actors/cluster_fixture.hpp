#pragma once

// A cluster in one test process on real threads: a RocksDB store actor, built-in
// engine replicas, the gateway, and their HTTP fronts on loopback ports.

#include <gtest/gtest.h>

#include <caf/all.hpp>

#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <nlohmann/json.hpp>

#include "actors/gateway.hpp"
#include "actors/http_front.hpp"
#include "actors/mutable_backend.hpp"
#include "actors/replica.hpp"
#include "actors/store.hpp"
#include "actors/store_client.hpp"
#include "node/system_config.hpp"
#include "runtime/engine/builtin_engine.hpp"
#include "runtime/pipeline/publisher.hpp"
#include "runtime/pipeline/store_tensor_source.hpp"
#include "runtime/store/rocksdb_store.hpp"
#include "store/store_fixtures.hpp"
#include "transport/http_client.hpp"

namespace stitch::testing {

/// Runs jobs on a worker pool, except while held: then they wait.
class holdable_executor final : public executor {
public:
  explicit holdable_executor(std::string name) : pool_(1, std::move(name)) {}
  void post(std::function<void()> job) override {
    std::lock_guard g{m_};
    if (held_)
      waiting_.push_back(std::move(job));
    else
      pool_.post(std::move(job));
  }
  void hold() {
    std::lock_guard g{m_};
    held_ = true;
  }
  void release() {
    std::lock_guard g{m_};
    held_ = false;
    for (auto& j : waiting_)
      pool_.post(std::move(j));
    waiting_.clear();
  }

private:
  std::mutex m_;
  bool held_ = false;
  std::deque<std::function<void()>> waiting_;
  worker_pool pool_;
};

/// The built-in engine, observable: whether the request in flight was cancelled.
class probed_engine final : public engine_port {
public:
  explicit probed_engine(const engine::model_config& c) : inner(c) {}
  status prefetch(const chain_plan& p) override { return inner.prefetch(p); }
  status stage(const chain_plan& p, bool o, tensor_source& s) override {
    return inner.stage(p, o, s);
  }
  void discard_shadow() override { inner.discard_shadow(); }
  void relabel(const version_ref& ref) override { inner.relabel(ref); }
  status commit() override { return inner.commit(); }
  status pause() override { return inner.pause(); }
  status resume() override { return inner.resume(); }
  status flush_cache() override { return inner.flush_cache(); }
  status reset_to_boot(const version_ref& r, tensor_source& s) override {
    return inner.reset_to_boot(r, s);
  }
  result<engine_reply> forward(const engine_call& c, const event_sink& sink,
                               const std::function<bool()>& cancelled) override {
    {
      std::lock_guard g{m};
      last_cancelled = cancelled;
    }
    ++forwarded;
    return inner.forward(c, sink, cancelled);
  }
  result<generation_result> generate(const generation_request& r,
                                     const std::function<bool()>& cancelled) override {
    return inner.generate(r, cancelled);
  }
  std::string stamp_request(std::string_view route, std::string_view body,
                            const version_ref& served) override {
    return inner.stamp_request(route, body, served);
  }
  std::string stamp_response(std::string_view route, std::string_view body, const stamps& s,
                             std::string_view run) override {
    return inner.stamp_response(route, body, s, run);
  }
  engine_health health() override { return inner.health(); }
  std::optional<std::string> route_refusal(std::string_view method,
                                           std::string_view route) const override {
    return inner.route_refusal(method, route);
  }

  bool cancelled_now() {
    std::lock_guard g{m};
    return last_cancelled && last_cancelled();
  }

  engine::builtin_engine inner;
  std::atomic<int> forwarded{0};
  std::mutex m;
  std::function<bool()> last_cancelled;
};

struct http_reply {
  unsigned status = 0;
  transport::http_headers headers;
  std::string body;
  nlohmann::json json() const { return nlohmann::json::parse(body); }
  std::string header(std::string_view name) const {
    const auto* h = transport::find_header(headers, name);
    return h ? *h : std::string{};
  }
};

inline caf::actor_system_config& threaded_config(caf::actor_system_config& cfg) {
  register_stitch_types(cfg);
  cfg.set("logger.file-verbosity", caf::atom("quiet"));
  return cfg;
}

class cluster_test : public ::testing::Test {
protected:
  cluster_test() : sys(threaded_config(cfg)), self(sys) {
    auto opened = store::open_rocksdb_store((dir.path() / "db").string());
    EXPECT_TRUE(opened);
    backend = std::shared_ptr<store_backend>{std::move(*opened)};
    observed = std::make_shared<testing::mutable_backend>(backend);
    store = sys.spawn(store_service, observed, store_lanes::make(), store_options{});
    config = *engine::preset("tiny");
    pub = std::make_unique<pipeline::publisher>(*backend);
    gateway = sys.spawn(gateway_service, gateway_options{});
  }

  ~cluster_test() override {
    if (front)
      front->stop();
    for (auto& f : replica_fronts)
      f->stop();
    for (auto& r : replicas)
      self->send_exit(r, caf::exit_reason::user_shutdown);
    self->send_exit(gateway, caf::exit_reason::user_shutdown);
    self->send_exit(store, caf::exit_reason::user_shutdown);
  }

  /// The weights of `run` at version `v`: seeded per run, and every version
  /// changes the output head and one attention projection.
  pipeline::tensor_set weights_of(uint64_t v, const std::string& run = "r") {
    auto w = *engine::random_init(config, run == "r" ? 42 : 99);
    for (uint64_t i = 1; i <= v; ++i) {
      for (const auto& name :
           {std::string{"lm_head.weight"},
            "model.layers." + std::to_string(i % 2) + ".self_attn.q_proj.weight"}) {
        auto& bytes = w.at(name).bytes;
        for (size_t b = i % 9; b + 4 <= bytes.size(); b += 36)
          bytes[b + 2] ^= static_cast<std::byte>(1 + i % 11);
      }
    }
    return w;
  }

  /// Publishes straight into the store's backend, whose pointer move wakes
  /// the subscribers; without `notify` the store actor does not hear of it
  /// (only the backstop timer, or a wake, finds it).
  void publish(uint64_t v, const std::string& run = "r", bool notify = true) {
    observed->mute(!notify);
    auto r = pub->publish({"default", run, v, false, false}, weights_of(v, run));
    observed->mute(false);
    ASSERT_TRUE(r) << to_string(r.error());
  }

  /// Starts replica `id`, enrolled in the gateway. With `bytes_via_actor`
  /// tensor bytes come through the store actor (`remote_store`), as for a
  /// replica on another node.
  replica_actor start_replica(const std::string& id, bool bytes_via_actor = false) {
    replica_options o;
    o.replica_id = id;
    o.backstop = std::chrono::milliseconds{100};
    replica_deps d;
    d.store = store;
    d.make_engine = [this]() -> result<std::shared_ptr<engine_port>> {
      auto e = std::make_shared<probed_engine>(config);
      std::lock_guard g{engines_mutex};
      engines.push_back(e);
      return std::shared_ptr<engine_port>{e};
    };
    if (bytes_via_actor) {
      remote = std::make_shared<remote_store>(sys, store);
      d.bytes = std::make_shared<pipeline::store_tensor_source>(*remote, "default");
    } else {
      d.bytes = std::make_shared<pipeline::store_tensor_source>(*backend, "default");
    }
    auto worker = std::make_shared<holdable_executor>("reconcile");
    workers.push_back(worker);
    d.reconcile_worker = worker;
    d.request_workers = std::make_shared<worker_pool>(8, "generate");
    // The replica's own HTTP surface (`serve_replica`) runs its requests on
    // this lane, as a node's does.
    d.lane = std::make_shared<request_lane>(gate_options_of(o));
    lanes.push_back(d.lane);
    auto r = sys.spawn(replica_service, o, d);
    replicas.push_back(r);
    caf::anon_send(gateway, atom::enroll_v, std::string{"default"}, r, std::string{});
    return r;
  }

  void serve_gateway(replica_http_options o = {}) {
    front = std::make_unique<gateway_http>(sys, caf::actor_cast<caf::actor>(gateway), o);
    auto p = front->listen("127.0.0.1", 0);
    ASSERT_TRUE(p) << to_string(p.error());
    gateway_port = *p;
  }

  /// The replica's own HTTP surface; `lane` false sends every request
  /// through the actor instead of the replica's lane.
  uint16_t serve_replica(size_t i, bool lane = true) {
    replica_http_options o;
    if (lane)
      o.lane = lanes.at(i);
    replica_fronts.push_back(
      std::make_unique<replica_http>(sys, caf::actor_cast<caf::actor>(replicas.at(i)), o));
    auto p = replica_fronts.back()->listen("127.0.0.1", 0);
    EXPECT_TRUE(p);
    return p ? *p : 0;
  }

  std::vector<replica_info> pool() {
    std::vector<replica_info> out;
    self->request(gateway, caf::infinite, atom::pool_view_v, std::string{"default"})
      .receive([&](const std::vector<replica_info>& v) { out = v; },
               [&](const caf::error& e) { ADD_FAILURE() << sys.render(e); });
    return out;
  }

  /// Waits (bounded) until the gateway sees `want` replica ids ready at
  /// `version` of `run`.
  void await_ready(const std::vector<std::string>& want, int64_t version,
                   const std::string& run = "r") {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds{120};
    while (std::chrono::steady_clock::now() < deadline) {
      size_t ok = 0;
      for (const auto& i : pool())
        if (i.ready && i.serving && static_cast<int64_t>(*i.serving) == version && i.run_id() == run
            && std::find(want.begin(), want.end(), i.replica_id) != want.end())
          ++ok;
      if (ok == want.size())
        return;
      std::this_thread::sleep_for(std::chrono::milliseconds{5});
    }
    FAIL() << "replicas never became ready at " << run << "/" << version;
  }

  http_reply http(uint16_t port, const std::string& method, const std::string& target,
                  const std::string& body = {}, transport::http_headers headers = {}) {
    transport::http_client c{transport::http_endpoint{"http", "127.0.0.1", port}};
    transport::http_request req;
    req.method = method;
    req.target = target;
    req.body = body;
    if (!body.empty())
      headers.push_back({"Content-Type", "application/json"});
    req.headers = std::move(headers);
    auto got = c.send(req);
    EXPECT_TRUE(got) << (got ? "" : to_string(got.error()));
    http_reply out;
    if (got) {
      out.status = got->status;
      out.headers = got->headers;
      out.body = got->body;
    }
    return out;
  }

  /// Holds engine `e` paused until the returned guard goes (whatever fails
  /// in between, the engine does not stay paused).
  static std::shared_ptr<void> paused(const std::shared_ptr<probed_engine>& e) {
    EXPECT_TRUE(e->pause());
    return {nullptr, [e](void*) { (void) e->resume(); }};
  }

  /// Sends a long generation to `port` on a connection of its own and closes
  /// it once engine `e` (paused meanwhile) holds the request; waits until
  /// the cancel reached the engine (false if it never did), then lets the
  /// engine run again. Answers the engine's step count when it resumed.
  std::optional<uint64_t> abandon_generation(uint16_t port,
                                             const std::shared_ptr<probed_engine>& e) {
    auto hold = paused(e);
    {
      namespace net = boost::asio;
      net::io_context io;
      net::ip::tcp::socket s{io};
      s.connect({net::ip::make_address("127.0.0.1"), port});
      auto body = generate_body("null", 400);
      net::write(s, net::buffer("POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                "application/json\r\nContent-Length: "
                                + std::to_string(body.size()) + "\r\n\r\n" + body));
      for (int i = 0; i < 5000 && e->inner.requests_in_flight() == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds{1});
      EXPECT_EQ(e->inner.requests_in_flight(), 1u);
    } // the client goes away
    for (int i = 0; i < 5000 && !e->cancelled_now(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds{1});
    if (!e->cancelled_now())
      return std::nullopt;
    auto steps = e->inner.stats().steps;
    hold.reset();
    for (int i = 0; i < 5000 && e->inner.requests_in_flight() != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds{1});
    return steps;
  }

  /// A chat-completions stream through `port` at version 0 of run r: its
  /// events pass one by one, only the last carries the stamps, then [DONE].
  void expect_stamped_stream(uint16_t port) {
    auto r = http(port, "POST", "/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"hi"}],"temperature":0,"max_tokens":12,
                    "stream":true,"weight_version":{"min_version":0,"exact_version":null}})");
    ASSERT_EQ(r.status, 200u) << r.body;
    EXPECT_EQ(r.header("Content-Type"), "text/event-stream");
    std::vector<nlohmann::json> events;
    bool done = false;
    size_t at = 0;
    while ((at = r.body.find("data: ", at)) != std::string::npos) {
      auto end = r.body.find("\n\n", at);
      auto data = r.body.substr(at + 6, end - at - 6);
      at = end;
      if (data == "[DONE]") {
        done = true;
        continue;
      }
      events.push_back(nlohmann::json::parse(data));
    }
    EXPECT_TRUE(done);
    ASSERT_GE(events.size(), 2u) << r.body;
    for (size_t i = 0; i + 1 < events.size(); ++i)
      EXPECT_FALSE(events[i].contains("weight_version_start"));
    EXPECT_EQ(events.back()["weight_version_start"], 0);
    EXPECT_EQ(events.back()["weight_version_end"], 0);
    EXPECT_EQ(events.back()["run_id"], "r");
    EXPECT_FALSE(events.back()["choices"][0]["finish_reason"].is_null());
  }

  static std::string generate_body(const std::string& constraint_json = "null",
                                   int max_tokens = 8) {
    return R"({"text":"policy says","sampling_params":{"temperature":0,"max_new_tokens":)"
           + std::to_string(max_tokens) + R"(},"weight_version":)" + constraint_json + "}";
  }

  temp_dir dir;
  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scoped_actor self;
  std::shared_ptr<store_backend> backend;
  /// What the store actor hosts: `backend`, its moves hidden on request.
  std::shared_ptr<testing::mutable_backend> observed;
  store_actor store;
  std::shared_ptr<remote_store> remote;
  engine::model_config config;
  std::unique_ptr<pipeline::publisher> pub;
  gateway_actor gateway;
  std::unique_ptr<gateway_http> front;
  uint16_t gateway_port = 0;
  std::vector<std::unique_ptr<replica_http>> replica_fronts;
  std::vector<replica_actor> replicas;
  std::vector<std::shared_ptr<request_lane>> lanes;
  std::vector<std::shared_ptr<holdable_executor>> workers;
  std::mutex engines_mutex;
  std::vector<std::shared_ptr<probed_engine>> engines;
};

} // namespace stitch::testing
