// A cluster with mutual TLS and an admin token: nodes and CLI clients with a
// certificate the cluster's CA signed get in; one without a certificate, or
// with one from another CA, is refused; submit, scale and stop without the
// token are refused.

#include <gtest/gtest.h>

#include "node/node_process.hpp"
#include "node/test_certs.hpp"
#include "store/store_fixtures.hpp"

namespace stitch {
namespace {

using namespace stitch::testing;

const std::filesystem::path examples = std::filesystem::path{STITCH_SOURCE_DIR} / "examples";

class cluster_security : public ::testing::Test {
protected:
  void SetUp() override {
    write_test_pki(dir.path());
    coord = start("coordinator", {"coordinator.listen=127.0.0.1:0"}, "listening on 127");
    ASSERT_TRUE(coord->started()) << coord->log();
    EXPECT_NE(coord->log().find("(mutual TLS)"), std::string::npos) << coord->log();
  }
  void TearDown() override {
    for (auto* n : {replica.get(), coord.get()})
      if (n) {
        EXPECT_TRUE(n->stop()) << n->log();
      }
  }

  std::vector<std::string> tls_sets(const std::string& who) const {
    auto p = dir.path();
    return {"tls.cert=" + (p / (who + ".pem")).string(), "tls.key=" + (p / (who + ".key")).string(),
            "tls.ca=" + (p / "ca.pem").string()};
  }

  std::unique_ptr<node_process> start(const std::string& name, std::vector<std::string> sets,
                                      const std::string& ready, const std::string& who = "node") {
    auto home = dir.path() / name;
    std::vector<std::string> args = {"--config",
                                     (examples / "loopback" / (name + ".toml")).string(),
                                     "--data-dir", (home / "data").string()};
    if (name != "coordinator")
      sets.push_back("coordinator.address=127.0.0.1:" + coord->coordinator_port);
    for (auto& s : tls_sets(who))
      sets.push_back(s);
    // The admin token, unless the node is given a member token instead.
    if (std::none_of(sets.begin(), sets.end(),
                     [](const std::string& s) { return s.starts_with("admin."); }))
      sets.push_back("admin.token=s3cret");
    for (auto& s : sets)
      args.insert(args.end(), {"--set", s});
    return std::make_unique<node_process>(home, args, ready);
  }

  /// `stitch` with the given TLS identity ("" = none) and token.
  run_result cli(const std::string& who, const std::string& token, const std::string& args) {
    std::string cmd =
      std::string{STITCH_BIN} + " --coordinator 127.0.0.1:" + coord->coordinator_port;
    if (!who.empty()) {
      auto p = dir.path();
      cmd += " --tls-cert " + (p / (who + ".pem")).string() + " --tls-key "
             + (p / (who + ".key")).string() + " --tls-ca " + (p / "ca.pem").string();
    }
    if (!token.empty())
      cmd += " --token " + token;
    return run("env -u STITCH_TOKEN " + cmd + " " + args);
  }

  temp_dir dir;
  std::unique_ptr<node_process> coord, replica;
};

TEST_F(cluster_security, mutual_tls_admits_certified_peers_only_and_the_token_guards_commands) {
  // A node with a certificate of the cluster's CA joins over TLS.
  replica = start("replica-a", {"replica.listen=127.0.0.1:0"}, "joined the coordinator; ");
  ASSERT_TRUE(replica->started()) << replica->log() << coord->log();

  // Clients without a certificate, or with another CA's, are refused.
  auto plain = cli("", "s3cret", "scale --replicas 1");
  EXPECT_NE(plain.code, 0);
  EXPECT_NE(plain.output.find("cannot reach the coordinator"), std::string::npos) << plain.output;
  auto rogue = cli("rogue", "s3cret", "scale --replicas 1");
  EXPECT_NE(rogue.code, 0);
  EXPECT_NE(rogue.output.find("cannot reach the coordinator"), std::string::npos) << rogue.output;
  // A certified client gets through (and hears that nothing runs).
  auto certified = cli("node", "s3cret", "scale --replicas 1");
  EXPECT_NE(certified.output.find("no experiment is active"), std::string::npos)
    << certified.output;

  // Mutating commands need the token.
  auto experiment = dir.path() / "experiment.toml";
  {
    std::ofstream out{experiment};
    out << "run_id = \"secure\"\nreplicas = 1\n[trainer]\nenabled = false\n";
  }
  for (const std::string& args :
       {"submit " + experiment.string(), std::string{"scale --replicas 1 --run secure"},
        std::string{"stop secure"}}) {
    auto r = cli("node", "", args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_NE(r.output.find("needs the admin token"), std::string::npos) << args << r.output;
    auto wrong = cli("node", "s3cre7", args);
    EXPECT_NE(wrong.output.find("needs the admin token"), std::string::npos)
      << args << wrong.output;
  }
  auto submitted = cli("node", "s3cret", "submit " + experiment.string());
  ASSERT_EQ(submitted.code, 0) << submitted.output << coord->log();
  EXPECT_NE(submitted.output.find("secure-r0@replica-a"), std::string::npos) << submitted.output;
  // The replica placed on the TLS node comes up (its bytes come over TLS too).
  bool up = false;
  for (int i = 0; i < 300 && !up; ++i) {
    up = replica->log().find("secure-r0 enters rotation") != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(up) << replica->log();
  auto stopped = cli("node", "s3cret", "stop secure");
  EXPECT_EQ(stopped.code, 0) << stopped.output;

  // A node without a certificate cannot join: it gives up and says why.
  auto home = dir.path() / "plain";
  std::filesystem::create_directories(home);
  auto refused =
    run(std::string{"timeout 60 "} + STITCH_NODE_BIN + " --config "
        + (examples / "loopback" / "trainer.toml").string() + " --data-dir " + (home / "d").string()
        + " --set coordinator.address=127.0.0.1:" + coord->coordinator_port);
  EXPECT_EQ(refused.code, 1) << refused.output;
  EXPECT_NE(refused.output.find("cannot reach the coordinator"), std::string::npos)
    << refused.output;
}

TEST_F(cluster_security, a_node_with_the_member_token_serves_and_one_with_another_is_refused) {
  // The member token, as an operator gets it for a replica machine.
  auto printed = cli("", "s3cret", "member-token");
  ASSERT_EQ(printed.code, 0) << printed.output;
  std::string member = printed.output.substr(0, printed.output.find('\n'));
  ASSERT_TRUE(member.starts_with("member-")) << printed.output;
  EXPECT_EQ(member.find("s3cret"), std::string::npos);
  EXPECT_NE(cli("", "", "member-token").code, 0) << "needs the admin token";

  // A node holding only the member token (from a file) joins, and a replica
  // placed on it serves.
  auto file = dir.path() / "member-token";
  std::ofstream{file} << member << "\n";
  replica =
    start("replica-a", {"replica.listen=127.0.0.1:0", "admin.member_token_file=" + file.string()},
          "joined the coordinator; ");
  ASSERT_TRUE(replica->started()) << replica->log() << coord->log();
  auto experiment = dir.path() / "experiment.toml";
  std::ofstream{experiment} << "run_id = \"members\"\nreplicas = 1\n[trainer]\nenabled = false\n";
  auto submitted = cli("node", "s3cret", "submit " + experiment.string());
  ASSERT_EQ(submitted.code, 0) << submitted.output << coord->log();
  bool up = false;
  for (int i = 0; i < 300 && !up; ++i) {
    up = replica->log().find("members-r0 enters rotation") != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(up) << replica->log();

  // A node of another cluster (its token derives another capability) is
  // refused at the join, and says why; the coordinator names what it
  // refused.
  auto other = start("trainer", {"admin.token=another-cluster"}, "member capability");
  bool refused = false;
  for (int i = 0; i < 100 && !refused; ++i) {
    refused = other->log().find("member capability") != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(refused) << other->log();
  EXPECT_NE(coord->log().find("refused a join (node "), std::string::npos) << coord->log();
  other->stop();
  EXPECT_EQ(cli("node", "s3cret", "stop members").code, 0);
}

} // namespace
} // namespace stitch
