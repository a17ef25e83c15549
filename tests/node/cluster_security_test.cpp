// A cluster with mutual TLS and an admin token: nodes and CLI clients with a
// certificate the cluster's CA signed get in; one without a certificate, or
// with one from another CA, is refused; submit, scale and stop without the
// token are refused.

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "node/node_process.hpp"
#include "node/test_certs.hpp"
#include "store/store_fixtures.hpp"

namespace stitch {
namespace {

using namespace stitch::testing;

/// The TCP ports process `pid` listens on (its sockets in /proc/PID/fd
/// matched against the LISTEN entries of /proc/net/tcp and tcp6).
std::set<uint16_t> listening_ports(pid_t pid) {
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& fd :
       std::filesystem::directory_iterator{"/proc/" + std::to_string(pid) + "/fd", ec}) {
    auto target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (target.starts_with("socket:["))
      inodes.insert(target.substr(8, target.size() - 9));
  }
  std::set<uint16_t> ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in{table};
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream fields{line};
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout
        >> inode;
      if (state == "0A" && inodes.contains(inode))
        ports.insert(
          static_cast<uint16_t>(std::stoul(local.substr(local.rfind(':') + 1), nullptr, 16)));
    }
  }
  return ports;
}

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

  // The token from a file works as --token does; given both ways, refused.
  auto token_file = dir.path() / "token";
  std::ofstream{token_file} << "s3cret\n";
  auto from_file = run(
    "env -u STITCH_TOKEN " + std::string{STITCH_BIN} + " --coordinator 127.0.0.1:"
    + coord->coordinator_port + " --tls-cert " + (dir.path() / "node.pem").string() + " --tls-key "
    + (dir.path() / "node.key").string() + " --tls-ca " + (dir.path() / "ca.pem").string()
    + " --token-file " + token_file.string() + " scale --replicas 1");
  EXPECT_NE(from_file.output.find("no experiment is active"), std::string::npos)
    << from_file.output;
  auto twice =
    run(std::string{STITCH_BIN} + " --token x --token-file " + token_file.string() + " status");
  EXPECT_EQ(twice.code, 2) << twice.output;
  EXPECT_NE(twice.output.find("--token-file: --token (or STITCH_TOKEN) is set too"),
            std::string::npos)
    << twice.output;

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

TEST(cluster_insecure, a_plain_caf_listener_other_machines_reach_needs_tls_or_insecure) {
  temp_dir dir;
  auto node = [&](const std::string& sets) {
    return run(
      "env -u STITCH_TOKEN timeout 60 " + std::string{STITCH_NODE_BIN} + " --data-dir "
      + (dir.path() / "d").string()
      + " --set gateway.listen=127.0.0.1:0 --set status.listen=127.0.0.1:0 --set replicas=0 " + sets
      + " --print-config >/dev/null && echo config-ok");
  };
  // The config itself is fine (a TLS cluster would use it)...
  EXPECT_NE(node("--set coordinator.listen=0.0.0.0:0").output.find("config-ok"), std::string::npos);
  // ...but a node started plain on it refuses, saying what to do.
  auto start = [&](const std::string& name, const std::vector<std::string>& sets) {
    std::vector<std::string> args = {
      "--data-dir", (dir.path() / name).string(), "--set", "gateway.listen=127.0.0.1:0",
      "--set",      "status.listen=127.0.0.1:0",  "--set", "replicas=0"};
    for (const auto& s : sets)
      args.insert(args.end(), {"--set", s});
    node_process n{dir.path() / name, args, "stitch-node: status"};
    auto log = n.log();
    if (!n.status_port.empty())
      if (auto s =
            get_json("127.0.0.1", static_cast<uint16_t>(std::stoi(n.status_port)), "/status"))
        log += "\n/status: " + (*s)["nodes"][0].value("cluster_transport", "(none)");
    n.stop();
    return log;
  };
  auto refused = start("plain", {"coordinator.listen=0.0.0.0:0"});
  EXPECT_NE(refused.find("coordinator.listen = \"0.0.0.0\" is reachable from other machines"),
            std::string::npos)
    << refused;
  EXPECT_NE(refused.find("cluster.insecure = true"), std::string::npos) << refused;
  EXPECT_EQ(refused.find("stitch-node: gateway"), std::string::npos) << "it did not start";
  EXPECT_EQ(refused.find("/status:"), std::string::npos);
  // Said explicitly, it starts, and says so loudly.
  auto insecure = start("insecure", {"coordinator.listen=0.0.0.0:0", "cluster.insecure=true"});
  EXPECT_NE(insecure.find("stitch-node: gateway"), std::string::npos) << insecure;
  EXPECT_NE(insecure.find("cluster.insecure: the CAF listener coordinator.listen (0.0.0.0) is "
                          "plain TCP"),
            std::string::npos)
    << insecure;
  EXPECT_NE(insecure.find("/status: plain, cluster.insecure"), std::string::npos) << insecure;
  EXPECT_NE(start("loopback", {}).find("/status: plain (loopback only)"), std::string::npos);
  // A token with the publisher's plain HTTP surface off loopback: a warning
  // at start, naming the surface.
  auto exposed = start("exposed", {"admin.token=s3cret", "publisher.listen=0.0.0.0:0"});
  EXPECT_NE(exposed.find("warning: publisher.listen (0.0.0.0:0) is plain HTTP off loopback"),
            std::string::npos)
    << exposed;
}

/// Resident memory of process `pid`, in bytes (VmRSS).
uint64_t resident_bytes(pid_t pid) {
  std::ifstream in{"/proc/" + std::to_string(pid) + "/status"};
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with("VmRSS:"))
      return std::stoull(line.substr(6)) * 1024;
  return 0;
}

TEST(basp_payload_cap, a_header_declaring_a_gigabyte_is_refused_before_anything_is_read) {
  temp_dir dir;
  node_process node{dir.path(), {"replicas=0"}};
  ASSERT_TRUE(node.started()) << node.log();
  const uint64_t before = resident_bytes(node.pid());
  // Two connections, each a BASP header (32 bytes, network order) of a
  // direct message whose payload is said to be 1 GiB, then silence.
  std::vector<int> fds;
  for (int i = 0; i < 2; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_port = htons(static_cast<uint16_t>(std::stoi(node.coordinator_port)));
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&at), sizeof at), 0);
    unsigned char header[32] = {};
    header[0] = 2; // direct_message
    const uint32_t gib = htonl(uint32_t{1} << 30);
    std::memcpy(header + 4, &gib, 4);
    header[31] = 1; // dest_actor
    ASSERT_EQ(::send(fd, header, sizeof header, 0), static_cast<ssize_t>(sizeof header));
    fds.push_back(fd);
  }
  // The node closes both connections rather than wait for the bytes.
  for (int fd : fds) {
    timeval wait{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    // Past its own handshake, which it sends first, the node closes.
    char buf[4096];
    ssize_t n = 0;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) {
    }
    EXPECT_EQ(n, 0) << "the connection was closed, not left waiting for the payload";
    ::close(fd);
  }
  const uint64_t after = resident_bytes(node.pid());
  EXPECT_LT(after, before + (uint64_t{64} << 20))
    << "grew by " << (after - before) / (1 << 20) << " MiB";
  // The node still serves CAF clients.
  auto status = run("env -u STITCH_TOKEN timeout 30 " + std::string{STITCH_BIN}
                    + " --coordinator 127.0.0.1:" + node.coordinator_port + " status");
  EXPECT_EQ(status.code, 0) << status.output;
  EXPECT_TRUE(node.stop()) << node.log();
}

TEST(check_security, names_every_listener_what_it_admits_and_whether_the_node_starts) {
  auto check = [](const std::string& sets) {
    return run("env -u STITCH_TOKEN " + std::string{STITCH_NODE_BIN} + " --check-security " + sets);
  };
  auto plain = check("--set publisher.listen=127.0.0.1:8090");
  EXPECT_EQ(plain.code, 0) << plain.output;
  for (const char* line :
       {"listener coordinator.listen 127.0.0.1:4242 (CAF)\n  plain TCP on loopback",
        "listener gateway.listen 127.0.0.1:8080 (HTTP)", "listener status.listen 127.0.0.1:8081",
        "publishing weights, open to every caller (no admin.token)",
        "store writes, pointer moves, retention and experiment changes (no admin.token: open)",
        "the node starts with this configuration"})
    EXPECT_NE(plain.output.find(line), std::string::npos) << line << "\n" << plain.output;
  // A token with the publisher's plain HTTP surface off loopback: warned.
  auto exposed = check("--set admin.token=s3cret --set publisher.listen=0.0.0.0:8090 --set "
                       "coordinator.listen=10.1.2.3:4242 --set cluster.insecure=true");
  EXPECT_EQ(exposed.code, 0) << exposed.output;
  EXPECT_NE(exposed.output.find("plain TCP, cluster.insecure: anyone who reaches it connects"),
            std::string::npos)
    << exposed.output;
  EXPECT_NE(exposed.output.find("warning: publisher.listen (0.0.0.0:8090) is plain HTTP off "
                                "loopback"),
            std::string::npos)
    << exposed.output;
  EXPECT_NE(exposed.output.find("with the admin token"), std::string::npos) << exposed.output;
  EXPECT_EQ(exposed.output.find("s3cret"), std::string::npos) << "never the token itself";
  // Plain off loopback without cluster.insecure: the node would not start.
  auto refused = check("--set coordinator.listen=10.1.2.3:4242");
  EXPECT_EQ(refused.code, 1) << refused.output;
  EXPECT_NE(refused.output.find("the node refuses to start: coordinator.listen = \"10.1.2.3\""),
            std::string::npos)
    << refused.output;
  // A replica node with TLS and only the member token.
  auto member = check("--set roles=replica --set coordinator.address=10.0.0.1:4300 --set "
                      "cluster.listen=0.0.0.0:4301 --set admin.member_token=member-x --set "
                      "tls.cert=/c.pem --set tls.key=/c.key --set tls.ca=/ca.pem");
  EXPECT_EQ(member.code, 0) << member.output;
  for (const char* line : {"listener cluster.listen 0.0.0.0:4301 (CAF)\n  mutual TLS",
                           "outbound coordinator.address 10.0.0.1:4300 (CAF)\n  mutual TLS; "
                           "presents the member token only (cannot write the store)",
                           "listener UCX"})
    EXPECT_NE(member.output.find(line), std::string::npos) << line << "\n" << member.output;
}

TEST(publisher_tls, the_publish_surface_speaks_https_with_the_nodes_certificate) {
  temp_dir dir;
  write_test_pki(dir.path());
  auto p = dir.path();
  std::filesystem::create_directories(p / "node");
  node_process node{p / "node",
                    {"replicas=0", "publisher.listen=127.0.0.1:0", "publisher.tls=true",
                     "admin.token=s3cret", "tls.cert=" + (p / "node.pem").string(),
                     "tls.key=" + (p / "node.key").string(), "tls.ca=" + (p / "ca.pem").string()}};
  ASSERT_TRUE(node.started()) << node.log();
  std::smatch m;
  auto log = node.log();
  ASSERT_TRUE(std::regex_search(log, m, std::regex{"publisher https://127\\.0\\.0\\.1:([0-9]+)"}))
    << log;
  const std::string url = "https://127.0.0.1:" + std::string{m[1]};
  ASSERT_EQ(run(std::string{STITCH_BIN} + " init-model --preset tiny --seed 1 --out "
                + (p / "boot").string())
              .code,
            0);
  // The Python client publishes over HTTPS, checking the node's certificate
  // against the cluster's CA.
  auto script = p / "publish.py";
  std::ofstream{script} << "import sys\nfrom stitch_client import Client\n"
                           "c = Client(publisher=sys.argv[1], token='s3cret', cafile=sys.argv[2])\n"
                           "print(c.publish(sys.argv[3], run='tls', version=0)['ref'])\n";
  auto published = run("PYTHONPATH=" + std::string{STITCH_SOURCE_DIR} + "/clients/python python3 "
                       + script.string() + " " + url + " " + (p / "ca.pem").string() + " "
                       + (p / "boot").string());
  EXPECT_EQ(published.code, 0) << published.output << node.log();
  EXPECT_NE(published.output.find("tls/weight_v000000"), std::string::npos) << published.output;
  // Plain HTTP gets no answer there; a client trusting another CA refuses it.
  auto plain = run("curl -s -o /dev/null -w '%{http_code}' --max-time 5 http://127.0.0.1:"
                   + std::string{m[1]} + "/publish");
  EXPECT_EQ(plain.output, "000") << "a plain request was answered";
  auto rogue = run("PYTHONPATH=" + std::string{STITCH_SOURCE_DIR} + "/clients/python python3 "
                   + script.string() + " " + url + " " + (p / "rogue-ca.pem").string() + " "
                   + (p / "boot").string());
  EXPECT_NE(rogue.code, 0) << rogue.output;
  EXPECT_NE(rogue.output.find("CERTIFICATE_VERIFY_FAILED"), std::string::npos) << rogue.output;
  EXPECT_TRUE(node.stop()) << node.log();
}

TEST_F(cluster_security, a_tls_cluster_has_no_plain_port_and_serves_through_a_hub_restart) {
  auto front = start("frontdoor", {"gateway.listen=127.0.0.1:0", "status.listen=127.0.0.1:0"},
                     "joined the coordinator; ");
  ASSERT_TRUE(front->started()) << front->log();
  replica = start("replica-a", {"replica.listen=127.0.0.1:0"}, "joined the coordinator; ");
  ASSERT_TRUE(replica->started()) << replica->log();
  auto experiment = dir.path() / "experiment.toml";
  std::ofstream{experiment} << "run_id = \"mesh\"\nreplicas = 1\n[trainer]\nenabled = false\n";
  ASSERT_EQ(cli("node", "s3cret", "submit " + experiment.string()).code, 0) << coord->log();
  auto eventually = [](auto&& what) {
    for (int i = 0; i < 300; ++i) {
      if (what())
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  };
  ASSERT_TRUE(
    eventually([&] { return replica->log().find("mesh-r0 enters rotation") != std::string::npos; }))
    << replica->log();
  // The front door connected to the replica's node itself, over TLS.
  ASSERT_TRUE(eventually([&] {
    return front->log().find("reaches node replica-a directly at 127.0.0.1:") != std::string::npos;
  }))
    << front->log();

  auto shown =
    get_json("127.0.0.1", static_cast<uint16_t>(std::stoi(front->status_port)), "/status");
  ASSERT_TRUE(shown);
  EXPECT_EQ((*shown)["nodes"][0].value("cluster_transport", ""), "mutual TLS") << shown->dump();
  bool listed = false;
  for (const auto& n : (*shown)["nodes"])
    listed |= n.value("name", "") == "replica-a" && n.value("mesh", "").starts_with("127.0.0.1:");
  EXPECT_TRUE(listed) << "the replica node's mesh address is in the directory: " << shown->dump();

  // No node listens for plain CAF: a client without TLS gets no handshake
  // at any port any of them listens on (a plain port answers one, then says
  // what it serves: no actor, or another interface).
  for (auto* n : {coord.get(), front.get(), replica.get()}) {
    auto ports = listening_ports(n->pid());
    std::string listed_ports;
    for (auto port : ports)
      listed_ports += " " + std::to_string(port);
    // Its CAF port at least (the coordinator node here serves no HTTP
    // surface; UCX's TCP listener adds a port wherever UCX can run, which a
    // chroot without /sys cannot).
    EXPECT_FALSE(ports.empty()) << "pid " << n->pid() << " listens on no port\n" << n->log();
    std::fprintf(stderr, "[security] pid %d listens on%s\n", static_cast<int>(n->pid()),
                 listed_ports.c_str());
    for (auto port : ports) {
      auto plain = run("env -u STITCH_TOKEN timeout 20 " + std::string{STITCH_BIN}
                       + " --coordinator 127.0.0.1:" + std::to_string(port) + " status");
      EXPECT_NE(plain.code, 0) << port << plain.output;
      for (const char* handshake : {"no_actor_published", "unexpected_actor_messaging_interface"})
        EXPECT_EQ(plain.output.find(handshake), std::string::npos)
          << "a plain CAF handshake at port " << port << ": " << plain.output;
    }
  }

  // The hub dies: the gateway still reaches the replica, directly.
  auto generate = [&] {
    return run("curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: "
               "application/json' --max-time 10 -d '{\"text\":\"hi\",\"sampling_params\":"
               "{\"max_new_tokens\":2}}' http://127.0.0.1:"
               + front->gateway_port + "/generate")
      .output;
  };
  ASSERT_EQ(generate(), "200");
  coord->kill9();
  ASSERT_TRUE(
    eventually([&] { return replica->log().find("lost the coordinator") != std::string::npos; }))
    << replica->log();
  int ok = 0;
  for (int i = 0; i < 5; ++i)
    ok += generate() == "200";
  EXPECT_EQ(ok, 5) << front->log();
  front->stop();
  coord.reset();
}

} // namespace
} // namespace stitch
