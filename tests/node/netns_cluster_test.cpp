// A cluster across network namespaces (examples/netns/netns.sh): every node
// in its own namespace with its own address, joined by veth pairs to a
// bridge, UCX restricted to TCP over that link (`UCX_TLS=tcp,self`,
// `UCX_NET_DEVICES=st0`), so weight bytes really cross the links. The hub
// (coordinator, store, publisher) holds the version; r1 stages it from the
// store, r2 from r1 (none from the store); r3 stripes over r1 and r2 with
// their links throttled, r1's link is taken down mid-transfer, and r3 still
// converges. Then deltas: a pool of four replicas follows ten small delta
// versions (and an anchor among them) with each delta's stored frames from
// peers, the store serving none of the bytes; and a holder killed while a
// receiver reads a delta's frames from it, the receiver finishing from the
// publisher without fetching a verified byte twice. Needs root (CI runs as
// root).

#include <gtest/gtest.h>

#include <unistd.h>

#include <regex>

#include <nlohmann/json.hpp>

#include "node/node_process.hpp"
#include "node/training_steps.hpp"
#include "store/store_fixtures.hpp"
#include "transport/http_client.hpp"
#include "transport/ucx_fixtures.hpp"

namespace stitch {
namespace {

using namespace stitch::testing;
using namespace std::chrono_literals;
using json = nlohmann::json;

const std::string netns = std::string{STITCH_SOURCE_DIR} + "/examples/netns/netns.sh";

std::string addr(int i) {
  return "10.231.0." + std::to_string(10 + i);
}

class netns_cluster : public ::testing::Test {
protected:
  void SetUp() override {
    if (::geteuid() != 0)
      GTEST_SKIP() << "network namespaces need root (CI runs as root)";
    STITCH_REQUIRE_UCX();
    tag = "stn" + std::to_string(::getpid() % 100000);
    // A machine that cannot make and enter namespaces (a chroot, where `ip
    // -n` cannot remount /; a container without CAP_NET_ADMIN) says so; one
    // that can must run the test.
    auto probe = run(netns + " probe");
    if (probe.code != 0)
      GTEST_SKIP() << "network namespaces cannot be made here: " << probe.output;
    auto up = run(netns + " up " + tag + " 4");
    ASSERT_EQ(up.code, 0) << up.output;
    made = true;
    hub = start(1, "hub",
                {"roles=coordinator,store,publisher", "replicas=0",
                 "coordinator.listen=" + addr(1) + ":4300"},
                "listening on " + std::regex_replace(addr(1), std::regex{"\\."}, "\\.") + ":4300");
    ASSERT_TRUE(hub->started()) << hub->log();
    auto boot = dir.path() / "boot";
    ASSERT_EQ(run(stitch("init-model --preset small --seed 3 --out " + boot.string())).code, 0);
    auto pub = run(stitch("publish --run r --version 0 " + boot.string()));
    ASSERT_EQ(pub.code, 0) << pub.output;
  }

  void TearDown() override {
    for (auto* n : {r3.get(), r2.get(), r1.get(), hub.get()})
      if (n)
        n->stop();
    if (made)
      run(netns + " down " + tag);
  }

  std::string stitch(const std::string& args) {
    return std::string{STITCH_BIN} + " --coordinator " + addr(1) + ":4300 " + args;
  }

  std::unique_ptr<node_process> start(int i, const std::string& name, std::vector<std::string> sets,
                                      const std::string& ready) {
    // Plain CAF between the namespaces' addresses: insecure, said so (the
    // namespaces' bridge reaches nothing else).
    std::vector<std::string> args = {"--data-dir", (dir.path() / name / "data").string(),
                                     "--set",      "name=" + name,
                                     "--set",      "cluster.insecure=true"};
    if (i != 1) // each node's mesh on its own address, as on real machines
      args.insert(args.end(), {"--set", "cluster.listen=" + addr(i) + ":0"});
    for (auto& s : sets)
      args.insert(args.end(), {"--set", s});
    std::vector<std::string> wrapper = {"ip",
                                        "netns",
                                        "exec",
                                        tag + "-" + std::to_string(i),
                                        "env",
                                        "UCX_TLS=tcp,self",
                                        "UCX_NET_DEVICES=st0"};
    return std::make_unique<node_process>(dir.path() / name, args, ready, wrapper);
  }

  std::unique_ptr<node_process> start_replica(int i, const std::string& name) {
    auto n = start(i, name,
                   {"roles=replica", "replicas=1", "model.preset=small", "replica.backstop=1",
                    "replica.listen=" + addr(i) + ":0", "cluster.listen=" + addr(i) + ":0",
                    "coordinator.address=" + addr(1) + ":4300"},
                   name + "-replica-0 serves http://");
    EXPECT_TRUE(n->started()) << n->log();
    return n;
  }

  /// The HTTP port replica `replica` of node `n` serves on (0: not yet).
  static uint16_t port_of(const node_process& n, const std::string& replica) {
    std::smatch m;
    auto log = n.log();
    if (!std::regex_search(log, m, std::regex{replica + " serves http://[0-9.]+:([0-9]+)"}))
      return 0;
    return static_cast<uint16_t>(std::stoi(m[1]));
  }

  /// Replica `replica`'s server_info (node `n`, namespace `i`) once it
  /// serves `version` (bounded wait).
  std::optional<json> at_version(int i, const node_process& n, const std::string& replica,
                                 int64_t version, std::chrono::seconds limit) {
    auto port = port_of(n, replica);
    if (port == 0)
      return std::nullopt;
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      auto info = get_json(addr(i), port, "/server_info");
      if (info && (*info)["applied_version"] == version)
        return info;
      std::this_thread::sleep_for(100ms);
    }
    return std::nullopt;
  }

  /// The replica's server_info once it serves version 0 (bounded wait).
  std::optional<json> converged(int i, const node_process& n, const std::string& name,
                                std::chrono::seconds limit) {
    return at_version(i, n, name + "-replica-0", 0, limit);
  }

  temp_dir dir;
  std::string tag;
  bool made = false;
  std::unique_ptr<node_process> hub, r1, r2, r3;
};

uint64_t peer_bytes(const json& info, const std::string& from) {
  const auto& peers = info["last_fetch"]["from_peers"];
  return peers.contains(from) ? peers[from].get<uint64_t>() : 0;
}

TEST_F(netns_cluster, replicas_fetch_peer_to_peer_across_links_and_survive_a_cut_link) {
  r1 = start_replica(2, "r1");
  auto first = converged(2, *r1, "r1", 60s);
  ASSERT_TRUE(first) << r1->log();
  EXPECT_EQ((*first)["transport"], "ucx (tcp,self)");
  // No replica holds the version yet: the first reads it from the publisher
  // that published it, across the hub's link, and nothing from the store.
  uint64_t model = 0;
  for (const auto& [source, n] : (*first)["last_fetch"]["from_peers"].items()) {
    EXPECT_EQ(source.rfind("publisher@hub/", 0), 0u) << source;
    model += n.get<uint64_t>();
  }
  EXPECT_GT(model, 40u << 20) << first->dump();
  // Tensors from peers; only the small config.json from the store.
  EXPECT_LE((*first)["last_fetch"]["from_store"].get<uint64_t>(), 4096u) << first->dump();

  r2 = start_replica(3, "r2");
  auto second = converged(3, *r2, "r2", 60s);
  ASSERT_TRUE(second) << r2->log();
  EXPECT_EQ(peer_bytes(*second, "r1-replica-0"), model) << second->dump();
  EXPECT_LE((*second)["last_fetch"]["from_store"].get<uint64_t>(), 4096u) << second->dump();

  // r3 reads from both; r1's link goes down while it does.
  ASSERT_EQ(run(netns + " throttle " + tag + " 2 60mbit").code, 0);
  ASSERT_EQ(run(netns + " throttle " + tag + " 3 60mbit").code, 0);
  r3 = start_replica(4, "r3");
  std::this_thread::sleep_for(1500ms);
  ASSERT_EQ(run(netns + " link " + tag + " 2 down").code, 0);
  auto third = converged(4, *r3, "r3", 150s);
  run(netns + " link " + tag + " 2 up");
  ASSERT_TRUE(third) << r3->log();
  const auto& f = (*third)["last_fetch"];
  uint64_t from_r1 = peer_bytes(*third, "r1-replica-0");
  uint64_t from_r2 = peer_bytes(*third, "r2-replica-0");
  EXPECT_GT(from_r2, 0u) << third->dump();
  // What r1 could not give came from the backups (r2 and the publisher)
  // or, last, the store.
  uint64_t from_peers = 0;
  for (const auto& [source, n] : f["from_peers"].items())
    from_peers += n.get<uint64_t>();
  EXPECT_GE(from_peers + f["from_store"].get<uint64_t>(), model) << third->dump();
  std::fprintf(stderr,
               "[netns] r3 fetched %llu bytes from r1, %llu from r2, %llu from the publisher, "
               "%llu from the store\n",
               static_cast<unsigned long long>(from_r1), static_cast<unsigned long long>(from_r2),
               static_cast<unsigned long long>(from_peers - from_r1 - from_r2),
               static_cast<unsigned long long>(f["from_store"].get<uint64_t>()));
}

TEST_F(netns_cluster, a_pool_of_four_follows_ten_delta_versions_from_peers) {
  // Four replicas (r3's node runs two) each on their own side of a link.
  r1 = start_replica(2, "r1");
  r2 = start_replica(3, "r2");
  r3 = start(4, "r3",
             {"roles=replica", "replicas=2", "model.preset=small", "replica.backstop=1",
              "replica.listen=" + addr(4) + ":0", "cluster.listen=" + addr(4) + ":0",
              "coordinator.address=" + addr(1) + ":4300"},
             "r3-replica-1 serves http://");
  ASSERT_TRUE(r3->started()) << r3->log();
  struct member {
    int ns;
    const node_process* n;
    std::string id;
  };
  const std::vector<member> pool = {{2, r1.get(), "r1-replica-0"},
                                    {3, r2.get(), "r2-replica-0"},
                                    {4, r3.get(), "r3-replica-0"},
                                    {4, r3.get(), "r3-replica-1"}};
  for (const auto& m : pool)
    ASSERT_TRUE(at_version(m.ns, *m.n, m.id, 0, 90s)) << m.id << "\n" << m.n->log();

  // Eleven trainer steps, each a small delta but the tenth (the publisher's
  // anchor cadence makes it full): every replica follows each delta with its
  // frames from peers (the publisher and each other), the store giving none
  // of the tensor bytes, and the anchor with full tensors.
  auto from = dir.path() / "boot";
  uint64_t stored_total = 0, peer_total = 0;
  int deltas = 0;
  for (int v = 1; v <= 11; ++v) {
    auto step = dir.path() / ("step" + std::to_string(v));
    flip_step(from, step, static_cast<size_t>(v) * 7);
    from = step;
    auto pub = run(stitch("publish --run r --version " + std::to_string(v) + " " + step.string()));
    ASSERT_EQ(pub.code, 0) << pub.output;
    for (const auto& m : pool) {
      auto info = at_version(m.ns, *m.n, m.id, v, 60s);
      ASSERT_TRUE(info) << m.id << " at version " << v << "\n" << m.n->log();
      const auto& f = (*info)["last_fetch"];
      EXPECT_LE(f["from_store"].get<uint64_t>(), 4096u)
        << "only config.json from the store: " << info->dump();
      if (v == 10) {
        EXPECT_EQ(f["peer_bytes"]["delta"], 0u) << "an anchor moves whole: " << info->dump();
        EXPECT_GT(f["peer_bytes"]["full"].get<uint64_t>(), 40u << 20) << info->dump();
        continue;
      }
      const uint64_t stored = f["stored_bytes"].get<uint64_t>();
      const uint64_t delta = f["peer_bytes"]["delta"].get<uint64_t>();
      ASSERT_GT(stored, 0u) << info->dump();
      EXPECT_EQ(f["peer_bytes"]["full"], 0u) << m.id << " at " << v << ": " << info->dump();
      EXPECT_EQ(delta, stitch::testing::peer_bytes(f)) << info->dump();
      EXPECT_LE(static_cast<double>(delta), 1.5 * static_cast<double>(stored))
        << m.id << " at " << v << ": " << info->dump();
      EXPECT_GE(delta, stored) << "every frame came from peers: " << info->dump();
      stored_total += stored;
      peer_total += delta;
    }
    deltas += v == 10 ? 0 : 1;
  }
  EXPECT_EQ(deltas, 10);
  std::fprintf(stderr, "[netns] 4 replicas x 10 deltas: %llu delta bytes from peers, %llu stored\n",
               static_cast<unsigned long long>(peer_total),
               static_cast<unsigned long long>(stored_total));
}

TEST_F(netns_cluster, a_holder_killed_mid_delta_leaves_its_receiver_to_finish_elsewhere) {
  r1 = start_replica(2, "r1");
  r2 = start_replica(3, "r2");
  ASSERT_TRUE(converged(2, *r1, "r1", 60s)) << r1->log();
  ASSERT_TRUE(converged(3, *r2, "r2", 60s)) << r2->log();
  // r2 is cut off while version 1 (a small delta) is published, so r1
  // holds its frames, complete, when r2 asks: r1 is its primary, the
  // publisher a backup. r1's uplink is slow; r1 dies while r2 reads it.
  ASSERT_EQ(run(netns + " link " + tag + " 3 down").code, 0);
  auto step = dir.path() / "step1";
  flip_step(dir.path() / "boot", step, 3);
  auto pub = run(stitch("publish --run r --version 1 " + step.string()));
  ASSERT_EQ(pub.code, 0) << pub.output;
  ASSERT_TRUE(at_version(2, *r1, "r1-replica-0", 1, 60s)) << r1->log();
  ASSERT_EQ(run(netns + " throttle " + tag + " 2 1mbit").code, 0);
  ASSERT_EQ(run(netns + " link " + tag + " 3 up").code, 0);
  auto r2_port = port_of(*r2, "r2-replica-0");
  ASSERT_NE(r2_port, 0);
  bool fetching = false;
  for (auto until = std::chrono::steady_clock::now() + 30s;
       !fetching && std::chrono::steady_clock::now() < until;) {
    auto info = get_json(addr(3), r2_port, "/server_info");
    fetching = info && (*info)["sync_state"] != "IDLE";
    if (!fetching)
      std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(fetching) << r2->log();
  std::this_thread::sleep_for(1500ms);
  r1->kill9();
  auto done = at_version(3, *r2, "r2-replica-0", 1, 90s);
  ASSERT_TRUE(done) << r2->log();
  const auto& f = (*done)["last_fetch"];
  const uint64_t stored = f["stored_bytes"].get<uint64_t>();
  const uint64_t from_store = f["from_store"].get<uint64_t>();
  const uint64_t delta = f["peer_bytes"]["delta"].get<uint64_t>();
  EXPECT_GT(peer_bytes(*done, "r1-replica-0"), 0u) << "r1 gave some frames: " << done->dump();
  EXPECT_LT(peer_bytes(*done, "r1-replica-0"), stored) << done->dump();
  EXPECT_EQ(f["peer_bytes"]["full"], 0u) << done->dump();
  // Every frame byte was verified once: what r1 gave before it died is not
  // fetched again (the rest came from the publisher or, for whole frames
  // no peer finished, the store; config.json too).
  EXPECT_GE(delta + from_store, stored) << done->dump();
  EXPECT_LE(delta + from_store, stored + 4096) << done->dump();
  std::fprintf(stderr,
               "[netns] r2 took %llu frame bytes from r1 before it died, %llu from the "
               "publisher, %llu from the store (%llu stored)\n",
               static_cast<unsigned long long>(peer_bytes(*done, "r1-replica-0")),
               static_cast<unsigned long long>(delta - peer_bytes(*done, "r1-replica-0")),
               static_cast<unsigned long long>(from_store),
               static_cast<unsigned long long>(stored));
}

} // namespace
} // namespace stitch
