// Replicas fetch weights from whoever holds them, over UCX, across
// stitch-node processes: a hub node (coordinator, store, publisher, one
// replica) publishes a version, which its replica stages from the publisher;
// a replica node started later stages it from the hub's holders and reads
// none of its tensor bytes from the store; with `transfer.peers = off` it
// reads them all from the store.

#include <gtest/gtest.h>

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

std::optional<json> get_json(uint16_t port, const std::string& target) {
  return stitch::testing::get_json("127.0.0.1", port, target);
}

/// The HTTP port replica `id` serves, from its node's log.
uint16_t replica_port(const node_process& n, const std::string& id) {
  std::smatch m;
  auto log = n.log();
  if (std::regex_search(log, m, std::regex{id + " serves http://127\\.0\\.0\\.1:([0-9]+)"}))
    return static_cast<uint16_t>(std::stoi(m[1]));
  return 0;
}

/// Polls the replica's server_info until it serves `version`.
std::optional<json> await_version(uint16_t port, int64_t version) {
  for (int i = 0; i < 600; ++i) {
    auto info = get_json(port, "/server_info");
    if (info && (*info)["applied_version"].is_number()
        && (*info)["applied_version"].get<int64_t>() == version)
      return info;
    std::this_thread::sleep_for(50ms);
  }
  return std::nullopt;
}

/// Both replicas answer a greedy /generate with the same text.
void expect_same_generation(uint16_t one, uint16_t other) {
  transport::http_request req;
  req.method = "POST";
  req.target = "/generate";
  req.body = R"({"text": "hello", "sampling_params": {"max_new_tokens": 6, "temperature": 0}})";
  transport::http_client a{transport::http_endpoint{"http", "127.0.0.1", one}};
  transport::http_client b{transport::http_endpoint{"http", "127.0.0.1", other}};
  auto ra = a.send(req);
  auto rb = b.send(req);
  ASSERT_TRUE(ra && rb);
  ASSERT_EQ(ra->status, 200) << ra->body;
  ASSERT_EQ(rb->status, 200) << rb->body;
  EXPECT_EQ(json::parse(ra->body)["text"], json::parse(rb->body)["text"]);
}

class peer_transfer : public ::testing::Test {
protected:
  void SetUp() override {
    std::filesystem::create_directories(dir.path() / "hub");
    hub = std::make_unique<node_process>(
      dir.path() / "hub",
      std::vector<std::string>{"replicas=1", "model.preset=tiny", "replica.backstop=1"});
    ASSERT_TRUE(hub->started()) << hub->log();
    auto boot = dir.path() / "boot";
    ASSERT_EQ(run(stitch("init-model --preset tiny --seed 5 --out " + boot.string())).code, 0);
    auto pub = run(stitch("publish --run r --version 0 " + boot.string()));
    ASSERT_EQ(pub.code, 0) << pub.output;
    hub_port = replica_port(*hub, "replica-0");
    ASSERT_NE(hub_port, 0) << hub->log();
    auto held = await_version(hub_port, 0);
    ASSERT_TRUE(held) << hub->log();
    // Where UCX cannot move bytes (a chroot without /sys) the node says so.
    if (transport::ucx::testing::ucx_unusable().empty())
      EXPECT_EQ((*held)["transport"].get<std::string>().rfind("ucx (", 0), 0u) << held->dump();
    else
      EXPECT_EQ((*held)["transport"].get<std::string>().rfind("store only (UCX unavailable", 0), 0u)
        << held->dump();
  }

  void TearDown() override {
    if (edge) {
      EXPECT_TRUE(edge->stop()) << edge->log();
    }
    EXPECT_TRUE(hub->stop()) << hub->log();
  }

  std::string stitch(const std::string& args) {
    return std::string{STITCH_BIN} + " --coordinator 127.0.0.1:" + hub->coordinator_port + " "
           + args;
  }

  void start_edge(std::vector<std::string> extra) {
    std::vector<std::string> args = {"--data-dir", (dir.path() / "edge" / "data").string()};
    std::vector<std::string> sets = {"name=edge",
                                     "roles=replica",
                                     "replicas=1",
                                     "model.preset=tiny",
                                     "replica.listen=127.0.0.1:0",
                                     "replica.backstop=1",
                                     "coordinator.address=127.0.0.1:" + hub->coordinator_port};
    sets.insert(sets.end(), extra.begin(), extra.end());
    for (auto& s : sets)
      args.insert(args.end(), {"--set", s});
    edge = std::make_unique<node_process>(dir.path() / "edge", args, "joined the coordinator; ");
    ASSERT_TRUE(edge->started()) << edge->log();
  }

  temp_dir dir;
  std::unique_ptr<node_process> hub, edge;
  uint16_t hub_port = 0;
};

TEST_F(peer_transfer, a_new_replica_stages_from_the_replica_that_holds_the_version) {
  // Where UCX finds no network device (a chroot without /sys) the replica
  // falls back to the store (see the log); peer bytes cannot be checked.
  STITCH_REQUIRE_UCX();
  start_edge({});
  auto port = replica_port(*edge, "edge-replica-0");
  ASSERT_NE(port, 0) << edge->log();
  auto info = await_version(port, 0);
  ASSERT_TRUE(info) << edge->log();
  const auto& fetch = (*info)["last_fetch"];
  EXPECT_EQ(fetch["version"], "r/weight_v000000") << info->dump();
  // Every tensor byte came from the hub's holders (its replica and its
  // publisher); none from the store.
  uint64_t from_peers = 0;
  for (const auto& [source, n] : fetch["from_peers"].items()) {
    EXPECT_TRUE(source == "replica-0" || source.rfind("publisher@", 0) == 0) << source;
    from_peers += n.get<uint64_t>();
  }
  EXPECT_GT(from_peers, 400'000u) << info->dump() << edge->log();
  // Every tensor byte from the peer; only the small config.json from the store.
  EXPECT_LE(fetch["from_store"].get<uint64_t>(), 4096u) << info->dump();
  EXPECT_EQ((*info)["metrics"]["bytes_from_peers_total"], from_peers);
  EXPECT_LE((*info)["metrics"]["bytes_from_store_total"].get<uint64_t>(), 4096u) << info->dump();
  // It generates on those weights exactly as the holder does.
  expect_same_generation(hub_port, port);
  EXPECT_NE(edge->log().find("staged r/weight_v000000 from peers: "), std::string::npos)
    << edge->log();
}

TEST_F(peer_transfer, the_publisher_lends_what_it_published_and_a_replica_stages_from_it) {
  STITCH_REQUIRE_UCX();
  // The hub's replica staged version 0 from the publisher that published it.
  auto info = get_json(hub_port, "/server_info");
  ASSERT_TRUE(info);
  const auto& first = (*info)["last_fetch"];
  ASSERT_TRUE(first["from_peers"].contains("publisher@local/default/r"))
    << info->dump() << hub->log();
  EXPECT_GT(first["from_peers"]["publisher@local/default/r"].get<uint64_t>(), 400'000u);
  EXPECT_LE(first["from_store"].get<uint64_t>(), 4096u) << info->dump(); // config.json
  // A new version: the publisher lends it in place of version 0.
  auto next = dir.path() / "next";
  ASSERT_EQ(run(stitch("init-model --preset tiny --seed 6 --out " + next.string())).code, 0);
  auto pub = run(stitch("publish --run r --version 1 " + next.string()));
  ASSERT_EQ(pub.code, 0) << pub.output;
  auto moved = await_version(hub_port, 1);
  ASSERT_TRUE(moved) << hub->log();
  const auto& second = (*moved)["last_fetch"];
  EXPECT_EQ(second["version"], "r/weight_v000001") << moved->dump();
  EXPECT_GT(second["from_peers"].value("publisher@local/default/r", uint64_t{0}), 0u)
    << moved->dump() << hub->log();
  // /metrics counts the bytes by source.
  transport::http_client c{transport::http_endpoint{
    "http", "127.0.0.1", static_cast<uint16_t>(std::stoi(hub->status_port))}};
  transport::http_request req;
  req.target = "/metrics";
  std::string text;
  for (int i = 0; i < 100; ++i) {
    auto r = c.send(req);
    ASSERT_TRUE(r);
    text = r->body;
    if (text.find("source=\"peers\"} 0\n") == std::string::npos
        && text.find("stitch_replica_transfer_bytes_total{replica=\"replica-0\"")
             != std::string::npos)
      break;
    std::this_thread::sleep_for(50ms);
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
    text, m,
    std::regex{
      R"(stitch_replica_transfer_bytes_total\{replica="replica-0",pool="default",source="peers"\} ([0-9]+))"}))
    << text;
  EXPECT_GT(std::stoull(m[1]), 400'000u);
  // Only the small config.json from the store.
  ASSERT_TRUE(std::regex_search(
    text, m,
    std::regex{
      R"(stitch_replica_transfer_bytes_total\{replica="replica-0",pool="default",source="store"\} ([0-9]+))"}))
    << text;
  EXPECT_LE(std::stoull(m[1]), 4096u) << text;
}

TEST_F(peer_transfer, a_delta_moves_between_peers_as_its_stored_frames) {
  STITCH_REQUIRE_UCX();
  // Version 1 flips a bit in 2 % of every tensor's bytes: the hub's replica
  // takes its stored frames from the publisher, not the touched tensors.
  auto boot = dir.path() / "boot";
  auto step1 = dir.path() / "step1";
  flip_step(boot, step1, 0);
  auto pub = run(stitch("publish --run r --version 1 " + step1.string()));
  ASSERT_EQ(pub.code, 0) << pub.output;
  auto moved = await_version(hub_port, 1);
  ASSERT_TRUE(moved) << hub->log();
  auto check_delta = [&](const json& info, const std::string& who) {
    const auto& f = info["last_fetch"];
    const uint64_t stored = f["stored_bytes"].get<uint64_t>();
    ASSERT_GT(stored, 0u) << info.dump();
    EXPECT_LT(stored, 100'000u) << "the step is a small delta: " << info.dump();
    EXPECT_EQ(f["peer_bytes"]["full"], 0u) << who << ": " << info.dump();
    EXPECT_EQ(f["peer_bytes"]["delta"].get<uint64_t>(), peer_bytes(f)) << info.dump();
    EXPECT_EQ(f["peer_bytes"]["delta"].get<uint64_t>(), stored)
      << who << " fetched every frame from peers, each once: " << info.dump();
    EXPECT_LE(f["from_store"].get<uint64_t>(), 4096u) << "config.json only: " << info.dump();
  };
  check_delta(*moved, "replica-0");
  EXPECT_GT((*moved)["last_fetch"]["from_peers"].value("publisher@local/default/r", uint64_t{0}),
            0u)
    << moved->dump();

  // A cold replica joining now still gets full tensors.
  start_edge({});
  auto port = replica_port(*edge, "edge-replica-0");
  ASSERT_NE(port, 0) << edge->log();
  auto cold = await_version(port, 1);
  ASSERT_TRUE(cold) << edge->log();
  EXPECT_GT((*cold)["last_fetch"]["peer_bytes"]["full"].get<uint64_t>(), 400'000u) << cold->dump();
  EXPECT_EQ((*cold)["last_fetch"]["peer_bytes"]["delta"], 0u) << cold->dump();

  // The next step reaches both replicas as frames: from the publisher and
  // from each other.
  auto step2 = dir.path() / "step2";
  flip_step(step1, step2, 17);
  pub = run(stitch("publish --run r --version 2 " + step2.string()));
  ASSERT_EQ(pub.code, 0) << pub.output;
  auto hub_at_2 = await_version(hub_port, 2);
  auto edge_at_2 = await_version(port, 2);
  ASSERT_TRUE(hub_at_2 && edge_at_2) << hub->log() << edge->log();
  check_delta(*hub_at_2, "replica-0");
  check_delta(*edge_at_2, "edge-replica-0");
  EXPECT_GT((*edge_at_2)["metrics"]["delta_bytes_from_peers_total"].get<uint64_t>(), 0u);
  // Bit-exact: both generate what a replica staging from the store does.
  expect_same_generation(hub_port, port);
  // /metrics tells the bytes by kind.
  transport::http_client c{transport::http_endpoint{
    "http", "127.0.0.1", static_cast<uint16_t>(std::stoi(hub->status_port))}};
  transport::http_request m;
  m.target = "/metrics";
  std::string text;
  std::smatch found;
  const std::regex delta_line{
    R"(stitch_replica_peer_bytes_total\{replica="replica-0",pool="default",kind="delta"\} ([0-9]+))"};
  for (int i = 0; i < 100; ++i) {
    auto r = c.send(m);
    ASSERT_TRUE(r);
    text = r->body;
    if (std::regex_search(text, found, delta_line) && std::stoull(found[1]) > 0)
      break;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(std::regex_search(text, found, delta_line)) << text;
  EXPECT_GT(std::stoull(found[1]), 0u) << text;
}

TEST_F(peer_transfer, with_peers_off_a_replica_reads_the_store_and_says_so) {
  start_edge({"transfer.peers=off"});
  auto port = replica_port(*edge, "edge-replica-0");
  ASSERT_NE(port, 0) << edge->log();
  auto info = await_version(port, 0);
  ASSERT_TRUE(info) << edge->log();
  EXPECT_EQ((*info)["transport"], "store only (transfer.peers = off)");
  EXPECT_TRUE((*info)["last_fetch"]["from_peers"].empty()) << info->dump();
  EXPECT_GT((*info)["last_fetch"]["from_store"].get<uint64_t>(), 400'000u);
  EXPECT_GT((*info)["metrics"]["bytes_from_store_total"].get<uint64_t>(), 400'000u);
}

} // namespace
} // namespace stitch
