#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "node/cli.hpp"
#include "store/store_fixtures.hpp"
#include "transport/capability.hpp"

namespace {

TEST(cli_test, overrides_must_be_key_value) {
  EXPECT_EQ(stitch::node::check_override("gateway.listen=127.0.0.1:8080"), "");
  EXPECT_NE(stitch::node::check_override("gateway.listen"), "");
  EXPECT_NE(stitch::node::check_override("=5"), "");
  EXPECT_NE(stitch::node::check_override("a b=5"), "");
}

} // namespace

namespace stitch::node {
namespace {

TEST(cli_settings, the_serving_roles_take_their_keys_from_set_and_the_environment) {
  node_options o;
  o.overrides = {"replicas=3",
                 "model.preset=small",
                 "gateway.listen=127.0.0.1:0",
                 "status.listen=[::1]:9000",
                 "replica.listen=0.0.0.0:8200",
                 "replica.commit_mode=quiesce",
                 "replica.drain_timeout=2.5",
                 "replica.backstop=0",
                 "http.body_limit=4096",
                 "gateway.affinity_headers=X-A, X-B"};
  ::setenv("STITCH_TOKEN", "s3cr3t-value", 1);
  auto s = resolve_settings(o);
  ::unsetenv("STITCH_TOKEN");
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->replicas, 3u);
  EXPECT_EQ(s->model_preset, "small");
  EXPECT_EQ(s->gateway_listen.port, 0);
  EXPECT_EQ(s->status_listen.host, "::1");
  EXPECT_EQ(s->replica_listen.port, 8200);
  EXPECT_EQ(s->commit_mode, commit_mode::quiesce);
  EXPECT_DOUBLE_EQ(s->drain_timeout, 2.5);
  EXPECT_DOUBLE_EQ(s->backstop, 0);
  EXPECT_EQ(s->body_limit, 4096u);
  EXPECT_EQ(s->affinity_headers, (std::vector<std::string>{"X-A", "X-B"}));
  EXPECT_EQ(s->admin_token, "s3cr3t-value");
  auto toml = to_toml(*s);
  EXPECT_NE(toml.find("replicas = 3"), std::string::npos) << toml;
  EXPECT_LT(toml.find("replicas = 3"), toml.find("[coordinator]")) << "a top-level key";
  EXPECT_NE(toml.find("affinity_headers = [\"X-A\", \"X-B\"]"), std::string::npos) << toml;
  EXPECT_NE(toml.find("[replica]"), std::string::npos) << toml;
  EXPECT_EQ(toml.find("s3cr3t"), std::string::npos) << "the token is never printed";
}

TEST(cli_settings, the_admin_token_can_come_from_a_file_and_only_one_way) {
  stitch::testing::temp_dir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream{dir.path() / name, std::ios::binary} << text;
    return (dir.path() / name).string();
  };
  auto resolve = [&](std::vector<std::string> sets) {
    node_options o;
    o.overrides = std::move(sets);
    return resolve_settings(o);
  };
  auto ok = resolve({"admin.token_file=" + write("token", "s3cr3t from a file\n")});
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(ok->admin_token, "s3cr3t from a file");
  EXPECT_EQ(to_toml(*ok).find("s3cr3t"), std::string::npos) << "the token is never printed";
  for (auto [sets, why] : std::vector<std::pair<std::vector<std::string>, std::string>>{
         {{"admin.token_file=" + write("empty", " \n")}, "is empty"},
         {{"admin.token_file=" + (dir.path() / "missing").string()}, "cannot read"},
         {{"admin.token_file=" + write("two", "a\nb\n")}, "control character"},
         {{"admin.token_file=" + write("big", std::string(5000, 'x'))}, "more than 4 KiB"},
         {{"admin.token_file=" + write("t2", "x"), "admin.token=y"}, "one way"}}) {
    auto r = resolve(sets);
    ASSERT_FALSE(r) << why;
    EXPECT_NE(r.error().message.find("admin.token_file: "), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(why), std::string::npos) << r.error().message;
  }
}

TEST(cli_settings, the_member_token_is_derived_from_the_admin_token_or_given_alone) {
  stitch::testing::temp_dir dir;
  auto resolve = [&](std::vector<std::string> sets) {
    node_options o;
    o.overrides = std::move(sets);
    return resolve_settings(o);
  };
  auto admin = resolve({"admin.token=s3cret"});
  ASSERT_TRUE(admin) << admin.error().message;
  EXPECT_EQ(admin->member_token, transport::member_capability("s3cret"));
  EXPECT_NE(admin->member_token, transport::member_capability("s3cre7"));
  EXPECT_EQ(admin->member_token.find("s3cret"), std::string::npos);
  // Given with the admin token, it must be the one derived from it.
  auto same = resolve({"admin.token=s3cret", "admin.member_token=" + admin->member_token});
  ASSERT_TRUE(same) << same.error().message;
  auto other = resolve({"admin.token=s3cret", "admin.member_token=member-00"});
  ASSERT_FALSE(other);
  EXPECT_NE(other.error().message.find("admin.member_token: not the member token of admin.token"),
            std::string::npos)
    << other.error().message;
  // Alone (a replica machine): no admin token, and never printed.
  auto file = dir.path() / "member";
  std::ofstream{file} << admin->member_token << "\n";
  auto alone = resolve({"admin.member_token_file=" + file.string()});
  ASSERT_TRUE(alone) << alone.error().message;
  EXPECT_TRUE(alone->admin_token.empty());
  EXPECT_EQ(alone->member_token, admin->member_token);
  EXPECT_EQ(to_toml(*alone).find(admin->member_token), std::string::npos);
  auto twice = resolve({"admin.member_token_file=" + file.string(), "admin.member_token=x"});
  ASSERT_FALSE(twice);
  EXPECT_NE(twice.error().message.find("admin.member_token_file: admin.member_token is set too"),
            std::string::npos)
    << twice.error().message;
  EXPECT_TRUE(resolve({}).value().member_token.empty()) << "no token: an open cluster";
}

TEST(cli_settings, set_completes_a_role_file_before_it_is_checked_across_keys) {
  auto path = std::filesystem::temp_directory_path()
              / ("stitch-cli-test-" + std::to_string(::getpid()) + ".toml");
  {
    std::ofstream f{path};
    f << "roles = [\"replica\"]\nreplicas = 1\n";
  }
  node_options o;
  o.config_path = path.string();
  auto alone = resolve_settings(o);
  ASSERT_FALSE(alone) << "a replica node must name its coordinator";
  EXPECT_NE(alone.error().message.find("coordinator.address"), std::string::npos)
    << alone.error().message;
  o.overrides = {"coordinator.address=10.0.0.1:4300"};
  auto completed = resolve_settings(o);
  std::filesystem::remove(path);
  ASSERT_TRUE(completed) << completed.error().message;
  EXPECT_EQ(completed->coordinator_address, "10.0.0.1:4300");
}

TEST(cli_settings, every_bad_value_is_reported_with_its_key) {
  node_options o;
  o.overrides = {"replicas=two",
                 "model.preset=huge",
                 "replica.commit_mode=sometimes",
                 "replica.drain_timeout=-1",
                 "http.body_limit=1",
                 "gateway.listen=nowhere",
                 "gateway.affinity_headers=bad header!"};
  auto s = resolve_settings(o);
  ASSERT_FALSE(s);
  for (const char* key :
       {"replicas", "model.preset", "replica.commit_mode", "replica.drain_timeout",
        "http.body_limit", "gateway.listen", "gateway.affinity_headers"})
    EXPECT_NE(s.error().message.find(key), std::string::npos) << key << "\n" << s.error().message;
}

} // namespace
} // namespace stitch::node

#include "node/http_publish.hpp"

namespace stitch::node {
namespace {

TEST(http_publish_surface, the_cli_reaches_the_surface_it_can_and_no_other) {
  auto url = [](std::optional<transport::http_endpoint> at) {
    return at ? at->to_string() : std::string{"cluster connection"};
  };
  // A named host is used as it is.
  EXPECT_EQ(url(http_surface_for("http://10.0.0.7:8082", "10.0.0.1", false)),
            "http://10.0.0.7:8082");
  // Every address: the coordinator's host, when the publisher is on its node.
  EXPECT_EQ(url(http_surface_for("http://0.0.0.0:8082", "10.0.0.1", true)), "http://10.0.0.1:8082");
  EXPECT_EQ(url(http_surface_for("http://[::]:8082", "::1", true)), "http://[::1]:8082");
  EXPECT_EQ(url(http_surface_for("http://0.0.0.0:8082", "10.0.0.1", false)), "cluster connection");
  // Loopback: only from this machine, to the coordinator's node.
  EXPECT_EQ(url(http_surface_for("http://127.0.0.1:8082", "127.0.0.1", true)),
            "http://127.0.0.1:8082");
  EXPECT_EQ(url(http_surface_for("http://127.0.0.1:8082", "10.0.0.1", true)), "cluster connection");
  EXPECT_EQ(url(http_surface_for("http://127.0.0.1:8082", "127.0.0.1", false)),
            "cluster connection");
  // No surface, or one that does not parse.
  EXPECT_EQ(url(http_surface_for("", "127.0.0.1", true)), "cluster connection");
  EXPECT_EQ(url(http_surface_for("ftp://x:1", "127.0.0.1", true)), "cluster connection");
}

} // namespace
} // namespace stitch::node
