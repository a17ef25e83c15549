// The multi-node cluster of examples/loopback on one machine: separate
// stitch-node processes for coordinator+store+publisher, the front door
// (gateway+status), two replica nodes and a trainer. An experiment is
// submitted; while the trainer publishes, a client keeps sampling through the
// gateway and checks every answer's stamps against its constraint; a replica
// node is SIGKILLed and restarted, and the experiment scaled up mid-run.

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "common/eventually.hpp"
#include "node/node_process.hpp"
#include "store/store_fixtures.hpp"
#include "transport/http_client.hpp"

namespace stitch {
namespace {

using namespace stitch::testing;
using namespace std::chrono_literals;
using json = nlohmann::json;

const std::filesystem::path examples = std::filesystem::path{STITCH_SOURCE_DIR} / "examples";

std::optional<json> get_json(const std::string& port, const std::string& target) {
  return stitch::testing::get_json("127.0.0.1", static_cast<uint16_t>(std::stoi(port)), target);
}

/// Polls `ok` every 100 ms (each poll may run the CLI) until it holds or
/// `limit` passes.
template <class F>
bool eventually(F&& ok, std::chrono::milliseconds limit) {
  return testing::eventually(std::forward<F>(ok), limit, 100ms);
}

/// Samples through the gateway without pause: no constraint, `min_version`
/// of the newest version seen, or an exact pin of it; every 200 answer's
/// stamps are checked against its request's constraint.
class stamp_checker {
public:
  explicit stamp_checker(std::string gateway_port) : port_(std::move(gateway_port)) {
    thread_ = std::thread{[this] { loop(); }};
  }
  ~stamp_checker() { finish(); }
  void finish() {
    stop_ = true;
    if (thread_.joinable())
      thread_.join();
  }

  std::atomic<uint64_t> ok{0}, refused{0}, violations{0}, failures{0};
  std::string last_violation, last_refusal;
  std::map<int, uint64_t> codes;

private:
  void loop() {
    transport::http_client c{
      transport::http_endpoint{"http", "127.0.0.1", static_cast<uint16_t>(std::stoi(port_))}};
    uint64_t newest = 0;
    for (uint64_t i = 0; !stop_; ++i) {
      json body;
      body["text"] = "hi";
      body["sampling_params"] = {{"max_new_tokens", 2}, {"temperature", 0}};
      int64_t min = -1, exact = -1;
      if (i % 3 == 1)
        min = static_cast<int64_t>(newest);
      if (i % 3 == 2)
        exact = static_cast<int64_t>(newest);
      if (min >= 0 || exact >= 0)
        body["weight_version"] = {{"min_version", min >= 0 ? json(min) : json(nullptr)},
                                  {"exact_version", exact >= 0 ? json(exact) : json(nullptr)}};
      transport::http_request req;
      req.method = "POST";
      req.target = "/generate";
      std::string text = body.dump(); // the request only views its body
      req.body = text;
      req.headers = {{"Content-Type", "application/json"}};
      auto r = c.send(req);
      if (!r) {
        ++failures;
        std::this_thread::sleep_for(20ms);
        continue;
      }
      ++codes[r->status];
      if (r->status != 200 && r->status != 409 && r->status != 503)
        last_refusal = r->body.substr(0, 300);
      if (r->status != 200) {
        ++refused;
        std::this_thread::sleep_for(5ms);
        continue;
      }
      auto j = json::parse(r->body, nullptr, false);
      if (j.is_discarded() || !j.contains("meta_info")) {
        ++violations;
        last_violation = "unparsable 200 answer: " + r->body.substr(0, 200);
        continue;
      }
      auto start = j["meta_info"].value("weight_version_start", int64_t{-1});
      auto end = j["meta_info"].value("weight_version_end", int64_t{-1});
      bool bad = start < 0 || end < start || (min >= 0 && start < min)
                 || (exact >= 0 && (start != exact || end != exact));
      if (bad) {
        ++violations;
        last_violation = "asked min " + std::to_string(min) + " exact " + std::to_string(exact)
                         + ", got start " + std::to_string(start) + " end " + std::to_string(end);
      }
      newest = std::max<uint64_t>(newest, static_cast<uint64_t>(std::max<int64_t>(0, start)));
      ++ok;
    }
  }

  std::string port_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class loopback_cluster : public ::testing::Test {
protected:
  void SetUp() override {
    began = std::chrono::steady_clock::now();
    coord = start("coordinator", {"coordinator.listen=127.0.0.1:0"}, "listening on 127");
    ASSERT_TRUE(coord->started()) << coord->log();
    frontdoor = start("frontdoor", {"gateway.listen=127.0.0.1:0", "status.listen=127.0.0.1:0"},
                      "joined the coordinator; heartbeat");
    ASSERT_TRUE(frontdoor->started()) << frontdoor->log();
    replica_a = start("replica-a", {"replica.listen=127.0.0.1:0"}, "joined the coordinator; ");
    ASSERT_TRUE(replica_a->started()) << replica_a->log();
    replica_b = start_replica_b();
    ASSERT_TRUE(replica_b->started()) << replica_b->log();
    driver = start("driver", {}, "joined the coordinator; heartbeat");
    ASSERT_TRUE(driver->started()) << driver->log();
    trainer = start("trainer", {}, "joined the coordinator; heartbeat");
    ASSERT_TRUE(trainer->started()) << trainer->log();
  }

  void TearDown() override {
    for (auto* n : {trainer.get(), driver.get(), replica_b.get(), replica_a.get(), frontdoor.get(),
                    coord.get()})
      if (n) {
        auto t0 = std::chrono::steady_clock::now();
        EXPECT_TRUE(n->stop()) << n->log();
        std::fprintf(stderr, "[loopback] a node stopped in %.1f s\n",
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
  }

  std::unique_ptr<node_process> start(const std::string& name, std::vector<std::string> sets,
                                      const std::string& ready) {
    auto home = dir.path() / name;
    std::vector<std::string> args = {
      "--config",   (examples / "loopback" / (name + ".toml")).string(),
      "--data-dir", (home / "data").string(),
      "--set",      "coordinator.heartbeat_timeout=2"};
    if (name != "coordinator")
      sets.push_back("coordinator.address=127.0.0.1:" + coord->coordinator_port);
    for (auto& s : sets)
      args.insert(args.end(), {"--set", s});
    return std::make_unique<node_process>(home, args, ready);
  }

  std::unique_ptr<node_process> start_replica_b() {
    return start("replica-b", {"replica.listen=127.0.0.1:0"}, "joined the coordinator; ");
  }

  run_result cli(const std::string& args) {
    return run(std::string{STITCH_BIN} + " --coordinator 127.0.0.1:" + coord->coordinator_port + " "
               + args);
  }

  json cluster() {
    auto r = cli("status --json");
    auto j = json::parse(r.output, nullptr, false);
    return j.is_discarded() || !j.contains("cluster") ? json{} : j["cluster"];
  }

  /// Ready replicas in the gateway's view: id -> applied version.
  std::map<std::string, int64_t> ready_replicas() {
    std::map<std::string, int64_t> out;
    auto pool = get_json(frontdoor->gateway_port, "/pool");
    if (!pool)
      return out;
    for (const auto& r : (*pool)["replicas"]) {
      if (r.value("ready", false))
        out[r.value("replica_id", "")] =
          r["applied_version"].is_number() ? r["applied_version"].get<int64_t>() : -1;
    }
    return out;
  }

  /// The replica ids the coordinator placed on `node`.
  std::set<std::string> placed_on(const std::string& node) {
    std::set<std::string> out;
    auto c = cluster();
    if (c.is_object())
      for (const auto& e : c["experiments"])
        for (const auto& r : e["replicas"])
          if (r.value("node", "") == node)
            out.insert(r.value("replica_id", ""));
    return out;
  }

  temp_dir dir;
  std::unique_ptr<node_process> coord, frontdoor, replica_a, replica_b, driver, trainer;
  std::chrono::steady_clock::time_point began;
};

TEST_F(loopback_cluster, survives_a_killed_replica_node_and_scales_mid_run_without_a_stale_answer) {
  // An experiment long enough to outlive the kill, the restart and the scale,
  // booting from a checkpoint directory (the publisher's node reads it; the
  // trainer starts from it as stored).
  auto boot = dir.path() / "boot";
  auto init =
    run(std::string{STITCH_BIN} + " init-model --preset tiny --seed 5 --out " + boot.string());
  ASSERT_EQ(init.code, 0) << init.output;
  auto experiment = dir.path() / "experiment.toml";
  {
    std::ifstream in{examples / "loopback" / "experiment.toml"};
    std::stringstream text;
    text << in.rdbuf();
    auto edited = std::regex_replace(text.str(), std::regex{"steps = 40"}, "steps = 150");
    edited = std::regex_replace(edited, std::regex{"seed = 7"},
                                "seed = 7\ndir = \"" + boot.string() + "\"");
    std::ofstream out{experiment};
    out << edited;
  }
  std::fprintf(stderr, "[loopback %6.1f s] nodes up\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  auto submitted = cli("submit " + experiment.string());
  ASSERT_EQ(submitted.code, 0) << submitted.output << coord->log();
  EXPECT_NE(submitted.output.find("submitted loop"), std::string::npos) << submitted.output;
  // The same run again is refused with the reason.
  auto again = cli("submit " + experiment.string());
  EXPECT_NE(again.code, 0);
  EXPECT_NE(again.output.find("already active"), std::string::npos) << again.output;

  // The run's anchor is the directory's weights, byte for byte.
  auto exported = dir.path() / "exported";
  auto exp = cli("export --version loop/0 --out " + exported.string());
  ASSERT_EQ(exp.code, 0) << exp.output;
  size_t compared = 0;
  for (const auto& f : std::filesystem::directory_iterator{boot})
    if (f.path().extension() == ".safetensors") {
      auto bytes = [](const std::filesystem::path& p) {
        std::ifstream in{p, std::ios::binary};
        return std::string{std::istreambuf_iterator<char>{in}, {}};
      };
      EXPECT_EQ(bytes(f.path()), bytes(exported / f.path().filename())) << f.path();
      ++compared;
    }
  EXPECT_GT(compared, 0u);

  stamp_checker checker{frontdoor->gateway_port};
  auto phase = [&](const char* what) {
    std::fprintf(stderr, "[loopback %6.1f s] %s\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count(),
                 what);
  };

  // 10 published versions, both replicas converge past them.
  ASSERT_TRUE(eventually(
    [&] {
      auto ready = ready_replicas();
      return ready.size() == 2
             && std::all_of(ready.begin(), ready.end(), [](auto& kv) { return kv.second >= 10; });
    },
    120s))
    << frontdoor->log() << coord->log() << trainer->log();

  phase("converged past v10");
  // The trainer samples through the rollout driver node.
  EXPECT_NE(trainer->log().find("samples through the cluster's rollout driver"), std::string::npos)
    << trainer->log();
  EXPECT_NE(driver->log().find("rollout batches served"), std::string::npos) << driver->log();

  // SIGKILL the trainer node mid-run and restart it: the coordinator places
  // the trainer there again, and it resumes from the pool's latest version
  // (re-publishing from the boot checkpoint would conflict with what exists).
  trainer->kill9();
  ASSERT_TRUE(
    eventually([&] { return coord->log().find("node trainer removed") != std::string::npos; }, 6s))
    << coord->log();
  trainer = start("trainer", {}, "joined the coordinator; heartbeat");
  ASSERT_TRUE(trainer->started()) << trainer->log();
  ASSERT_TRUE(eventually(
    [&] { return trainer->log().find("[trainer/trainer] loop step ") != std::string::npos; }, 60s))
    << trainer->log() << coord->log();
  {
    std::smatch m;
    auto log = trainer->log();
    ASSERT_TRUE(std::regex_search(log, m, std::regex{"loop step ([0-9]+):"})) << log;
    EXPECT_GE(std::stoi(m[1]), 10) << "the restarted trainer began again from the boot: " << log;
  }

  phase("trainer restarted");
  // The front door's status surface shows every member and the experiment.
  EXPECT_TRUE(eventually(
    [&] {
      auto st = get_json(frontdoor->status_port, "/status");
      if (!st)
        return false;
      std::set<std::string> names;
      for (const auto& n : (*st)["nodes"])
        names.insert(n.value("name", ""));
      return names == std::set<std::string>{"coord",     "driver",    "frontdoor",
                                            "replica-a", "replica-b", "trainer"}
             && (*st)["experiments"].size() == 1
             && (*st)["experiments"][0].value("run_id", "") == "loop"
             && (*st)["experiments"][0].contains("last_step");
    },
    10s))
    << get_json(frontdoor->status_port, "/status").value_or(json{}).dump();

  phase("status checked");
  // SIGKILL the replica node b: the gateway stops routing to its replicas
  // within the heartbeat bound, and the coordinator logs the removal.
  std::set<std::string> on_b;
  ASSERT_TRUE(eventually([&] { return (on_b = placed_on("replica-b")).size() == 1; }, 10s))
    << cluster().dump();
  replica_b->kill9();
  ASSERT_TRUE(eventually(
    [&] {
      auto ready = ready_replicas();
      return std::none_of(on_b.begin(), on_b.end(), [&](auto& id) { return ready.contains(id); });
    },
    6s))
    << frontdoor->log();
  EXPECT_TRUE(eventually(
    [&] { return coord->log().find("node replica-b removed") != std::string::npos; }, 6s))
    << coord->log();
  // replica-a has no free slot: the run is one replica short until b returns.
  EXPECT_EQ(ready_replicas().size(), 1u);

  phase("replica-b killed and out of routing");
  // Restart b: it rejoins, gets a replica again, which catches up and enters.
  replica_b = start_replica_b();
  ASSERT_TRUE(replica_b->started()) << replica_b->log();
  ASSERT_TRUE(eventually(
    [&] {
      auto now_on_b = placed_on("replica-b");
      auto ready = ready_replicas();
      return now_on_b.size() == 1 && !on_b.contains(*now_on_b.begin())
             && ready.contains(*now_on_b.begin()) && ready.size() == 2;
    },
    60s))
    << replica_b->log() << coord->log();

  phase("replica-b back");
  // Scale to three mid-run: the new replica self-syncs and enters when ready.
  auto scaled = cli("scale --replicas 3");
  ASSERT_EQ(scaled.code, 0) << scaled.output;
  EXPECT_NE(scaled.output.find("1 placed"), std::string::npos) << scaled.output;
  ASSERT_TRUE(eventually([&] { return ready_replicas().size() == 3; }, 60s))
    << coord->log() << replica_b->log();
  phase("scaled to 3");
  // SIGSTOP replica-a: its connections stay open, only the missed heartbeats
  // tell. The coordinator removes it within the bound and the gateway stops
  // routing there; on SIGCONT it hears it is no longer a member, retires its
  // stale replica, joins again and gets a fresh one.
  // One `status` can come back without the cluster view when the CLI's
  // query times out on this busy machine: asked until it has it.
  std::set<std::string> on_a;
  ASSERT_TRUE(eventually([&] { return (on_a = placed_on("replica-a")).size() == 1; }, 10s))
    << cluster().dump();
  replica_a->signal(SIGSTOP);
  ASSERT_TRUE(eventually(
    [&] {
      return coord->log().find("node replica-a removed: it missed its heartbeats")
             != std::string::npos;
    },
    8s))
    << coord->log();
  ASSERT_TRUE(eventually(
    [&] {
      auto ready = ready_replicas();
      return std::none_of(on_a.begin(), on_a.end(), [&](auto& id) { return ready.contains(id); });
    },
    4s))
    << frontdoor->log();
  replica_a->signal(SIGCONT);
  ASSERT_TRUE(eventually(
    [&] {
      auto now_on_a = placed_on("replica-a");
      return now_on_a.size() == 1 && !on_a.contains(*now_on_a.begin())
             && ready_replicas().size() == 3;
    },
    60s))
    << replica_a->log() << coord->log();
  EXPECT_NE(replica_a->log().find("no longer counts this node as a member"), std::string::npos);

  phase("replica-a stopped, removed, continued and back");
  // More replicas than slots are refused with the reason.
  auto too_many = cli("scale --replicas 5");
  EXPECT_NE(too_many.code, 0);
  EXPECT_NE(too_many.output.find("slots free"), std::string::npos) << too_many.output;

  phase("scale refusal checked");
  // The trainer finishes; every replica converges to its last version.
  ASSERT_TRUE(eventually(
    [&] {
      auto c = cluster();
      return c.is_object() && !c["experiments"].empty()
             && c["experiments"][0].value("trainer_outcome", "") == "finished";
    },
    300s))
    << trainer->log() << cluster().dump();
  ASSERT_TRUE(eventually(
    [&] {
      auto ready = ready_replicas();
      return ready.size() == 3
             && std::all_of(ready.begin(), ready.end(), [](auto& kv) { return kv.second == 150; });
    },
    60s))
    << json(ready_replicas()).dump();

  phase("converged at 150");
  // The coordinator's directory knows which nodes hold the last version.
  EXPECT_TRUE(eventually(
    [&] {
      auto c = cluster();
      return c.is_object() && c["directory"].contains("default/loop/weight_v000150")
             && c["directory"]["default/loop/weight_v000150"]
                  == json::array({"replica-a", "replica-b"});
    },
    10s))
    << cluster().dump();
  checker.finish();
  phase("checker finished");
  EXPECT_EQ(checker.violations.load(), 0u) << checker.last_violation;
  EXPECT_GT(checker.ok.load(), 50u) << json(checker.codes).dump() << checker.last_refusal;

  // Stop: every replica drains and leaves the gateway's pool.
  auto stopped = cli("stop loop");
  ASSERT_EQ(stopped.code, 0) << stopped.output;
  EXPECT_TRUE(eventually(
    [&] {
      auto pool = get_json(frontdoor->gateway_port, "/pool");
      return pool && (*pool)["replicas"].empty();
    },
    30s))
    << coord->log();
  EXPECT_TRUE(cluster()["experiments"].empty()) << cluster().dump();
  phase("stopped");
}

TEST_F(loopback_cluster,
       a_killed_hub_restarts_from_its_store_and_adopts_the_replicas_that_kept_serving) {
  // The hub (coordinator, store, publisher) is SIGKILLed mid-run and started
  // again on its address and data: replicas keep serving what they hold
  // meanwhile, every node reconnects, and the coordinator recovers the
  // experiment from its persisted record and adopts the running replicas and
  // trainer instead of placing new ones.
  auto experiment = dir.path() / "experiment.toml";
  {
    std::ifstream in{examples / "loopback" / "experiment.toml"};
    std::stringstream text;
    text << in.rdbuf();
    std::ofstream out{experiment};
    out << std::regex_replace(text.str(), std::regex{"steps = 40"}, "steps = 400");
  }
  auto submitted = cli("submit " + experiment.string());
  ASSERT_EQ(submitted.code, 0) << submitted.output << coord->log();
  stamp_checker checker{frontdoor->gateway_port};
  ASSERT_TRUE(eventually(
    [&] {
      auto ready = ready_replicas();
      return ready.size() == 2
             && std::all_of(ready.begin(), ready.end(), [](auto& kv) { return kv.second >= 5; });
    },
    120s))
    << coord->log() << trainer->log();
  auto placed = placed_on("replica-a");
  for (const auto& id : placed_on("replica-b"))
    placed.insert(id);
  ASSERT_EQ(placed.size(), 2u) << cluster().dump();
  const std::string port = coord->coordinator_port;
  std::smatch m;
  auto a_log = replica_a->log();
  ASSERT_TRUE(std::regex_search(a_log, m, std::regex{"serves http://127\\.0\\.0\\.1:([0-9]+)"}))
    << a_log;
  const std::string replica_port = m[1];

  coord->kill9();
  ASSERT_TRUE(eventually(
    [&] { return replica_a->log().find("lost the coordinator") != std::string::npos; }, 10s))
    << replica_a->log();
  // The replicas serve what they hold, on their own HTTP surfaces and
  // through the gateway (whose node reaches them directly).
  {
    const uint64_t through_gateway = checker.ok.load();
    stamp_checker direct{replica_port};
    std::this_thread::sleep_for(2s);
    direct.finish();
    EXPECT_GT(direct.ok.load(), 5u) << json(direct.codes).dump() << direct.last_refusal;
    EXPECT_EQ(direct.violations.load(), 0u) << direct.last_violation;
    EXPECT_GT(checker.ok.load(), through_gateway + 5) << json(checker.codes).dump();
  }

  // The hub comes back on its address, from its data directory.
  coord = start("coordinator", {"coordinator.listen=127.0.0.1:" + port}, "listening on 127");
  ASSERT_TRUE(coord->started()) << coord->log();
  ASSERT_TRUE(eventually(
    [&] { return coord->log().find("recovered experiment(s) loop") != std::string::npos; }, 10s))
    << coord->log();
  // Both replicas adopted where they run, under their names; nothing placed
  // anew, the trainer adopted where it runs.
  ASSERT_TRUE(eventually(
    [&] {
      auto now = placed_on("replica-a");
      for (const auto& id : placed_on("replica-b"))
        now.insert(id);
      return now == placed && coord->log().find("recovery window over") != std::string::npos;
    },
    30s))
    << coord->log() << cli("status --json").output;
  auto log = coord->log();
  EXPECT_NE(log.find("adopting"), std::string::npos) << log;
  EXPECT_EQ(log.find("placing "), std::string::npos) << log;
  EXPECT_EQ(log.find("starting the trainer"), std::string::npos) << log;
  auto c = cluster();
  ASSERT_TRUE(c.is_object() && !c["experiments"].empty()) << c.dump();
  EXPECT_EQ(c["experiments"][0].value("trainer_node", ""), "trainer") << c.dump();
  // Every node rejoined and enrolled its roles again: `stitch status` finds
  // the front door's status surface, which lists both replicas.
  auto status = cli("status");
  EXPECT_EQ(status.code, 0) << status.output;
  for (const auto& id : placed)
    EXPECT_NE(status.output.find(id), std::string::npos) << status.output;

  // Nodes reach each other directly, not through the hub: no node is
  // restarted, the trainer goes on where it was and the replicas converge
  // past what they held.
  const int64_t held =
    std::max(ready_replicas().begin()->second, ready_replicas().rbegin()->second);
  ASSERT_TRUE(eventually(
    [&] {
      auto ready = ready_replicas();
      return ready.size() == 2 && std::all_of(ready.begin(), ready.end(), [&](auto& kv) {
               return kv.second >= held + 3;
             });
    },
    240s))
    << json(ready_replicas()).dump() << trainer->log() << coord->log();
  // Still the two adopted replicas.
  auto now = placed_on("replica-a");
  for (const auto& id : placed_on("replica-b"))
    now.insert(id);
  EXPECT_EQ(now, placed);
  checker.finish();
  EXPECT_EQ(checker.violations.load(), 0u) << checker.last_violation;
  auto stopped = cli("stop loop");
  EXPECT_EQ(stopped.code, 0) << stopped.output;
}

} // namespace
} // namespace stitch
