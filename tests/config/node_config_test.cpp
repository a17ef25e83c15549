#include <gtest/gtest.h>

#include "config/node_config.hpp"

namespace stitch::config {
namespace {

TEST(node_config, defaults_are_the_all_in_one_node) {
  auto c = parse_node_config("", "empty.toml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_TRUE(c->has_role("replica"));
  EXPECT_TRUE(c->has_role("gateway"));
  EXPECT_EQ(c->gateway_listen, (listen_address{"127.0.0.1", 8080}));
  EXPECT_EQ(c->status_listen.port, 8081);
  EXPECT_EQ(c->replica_listen.port, 8100);
  EXPECT_EQ(c->replicas, 2u);
  EXPECT_EQ(c->effective_store_uri(), "rocksdb:./stitch-data/store");
}

TEST(node_config, a_role_file_sets_typed_fields) {
  auto c = parse_node_config(R"(
name = "replica-node-1"
roles = ["replica"]
gpus = [0, 1]
replicas = 2

[coordinator]
address = "10.0.0.1:4242"

[replica]
listen = "0.0.0.0:9100"
commit_mode = "quiesce"
drain_timeout = 12.5
backstop = 0

[model]
preset = "small"

[gateway]
affinity_headers = ["X-Session-Id"]

[tls]
cert = "node.pem"
key = "node.key"
ca = "ca.pem"
)",
                             "replica.toml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->name, "replica-node-1");
  EXPECT_EQ(c->roles, (std::vector<std::string>{"replica"}));
  EXPECT_EQ(c->gpus, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(c->coordinator_address, "10.0.0.1:4242");
  EXPECT_EQ(c->replica_listen, (listen_address{"0.0.0.0", 9100}));
  EXPECT_EQ(c->commit_mode, commit_mode::quiesce);
  EXPECT_DOUBLE_EQ(c->drain_timeout, 12.5);
  EXPECT_DOUBLE_EQ(c->backstop, 0);
  EXPECT_EQ(c->model_preset, "small");
  EXPECT_EQ(c->affinity_headers, (std::vector<std::string>{"X-Session-Id"}));
  EXPECT_EQ(c->tls_ca, "ca.pem");
}

TEST(node_config, a_name_the_coordinator_would_refuse_is_refused_at_start) {
  // The coordinator refuses a join under a name that is not a run-id-like
  // name; a node that started with one would retry its join forever.
  for (const char* bad : {"a b", "", "../x", "x:y"}) {
    auto c = parse_node_config(std::string{"name = \""} + bad + "\"\n", "n.toml");
    ASSERT_FALSE(c) << bad;
    EXPECT_NE(c.error().message.find("name: "), std::string::npos) << c.error().message;
    EXPECT_NE(c.error().message.find("is not a node name"), std::string::npos) << c.error().message;
  }
  EXPECT_TRUE(parse_node_config("name = \"gpu-node.3_a\"\n", "n.toml"));
}

TEST(node_config, every_problem_is_listed_with_its_key_path) {
  auto c = parse_node_config(R"(
roles = ["replica", "gateway", "chef"]
replicas = "two"
colour = "blue"

[replica]
commit_mode = "sometimes"
drain_timeout = -3
listen = "nowhere"

[gateway]
listen = "127.0.0.1:8100"

[tls]
cert = "only.pem"

[model]
preset = 7
)",
                             "bad.toml");
  ASSERT_FALSE(c);
  const auto& m = c.error().message;
  for (const char* want :
       {"bad.toml:2 roles: 'chef' is not a known role", "bad.toml:3 replicas: must be an integer",
        "bad.toml:4 colour: unknown key", "replica.commit_mode: 'sometimes' is not one of",
        "replica.drain_timeout: -3 is outside", "replica.listen: 'nowhere' is not of the form",
        "tls: cert, key and ca must be given together", "model.preset: must be a string"})
    EXPECT_NE(m.find(want), std::string::npos) << want << "\n" << m;
}

TEST(node_config, the_delta_encoding_is_xor_sparse_unless_set_to_xor) {
  auto defaults = parse_node_config("", "empty.toml");
  ASSERT_TRUE(defaults) << defaults.error().message;
  EXPECT_EQ(defaults->publisher_delta_encoding, delta_encoding::xor_sparse);
  auto old_readers = parse_node_config("[publisher]\ndelta_encoding = \"xor\"\n", "p.toml");
  ASSERT_TRUE(old_readers) << old_readers.error().message;
  EXPECT_EQ(old_readers->publisher_delta_encoding, delta_encoding::xor_bytes);
  auto unknown = parse_node_config("[publisher]\ndelta_encoding = \"overwrite\"\n", "p.toml");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message.find("publisher.delta_encoding: 'overwrite' is not one of"),
            std::string::npos)
    << unknown.error().message;
}

TEST(node_config, two_roles_on_one_port_clash) {
  auto c = parse_node_config(R"(
[gateway]
listen = "127.0.0.1:8101"
)",
                             "clash.toml");
  ASSERT_FALSE(c);
  EXPECT_NE(
    c.error().message.find("gateway.listen and replica.listen (replica 1): both on port 8101"),
    std::string::npos)
    << c.error().message;
  auto free_ports = parse_node_config(R"(
[gateway]
listen = "127.0.0.1:0"
[status]
listen = "127.0.0.1:0"
)",
                                      "zero.toml");
  EXPECT_TRUE(free_ports) << "port 0 never clashes";
}

TEST(node_config, syntax_errors_name_the_line) {
  auto c = parse_node_config("name = \"x\"\n[replica\n", "broken.toml");
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("broken.toml:2"), std::string::npos) << c.error().message;
}

TEST(node_config, settings_from_text_are_typed_by_the_schema) {
  node_config c;
  std::string problems;
  apply_setting(c, "replicas", "3", "--set", problems);
  apply_setting(c, "gpus", "0, 2", "--set", problems);
  apply_setting(c, "gateway.listen", "[::1]:0", "--set", problems);
  apply_setting(c, "roles", "replica,status", "--set", problems);
  EXPECT_EQ(problems, "");
  EXPECT_EQ(c.replicas, 3u);
  EXPECT_EQ(c.gpus, (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(c.gateway_listen.host, "::1");
  EXPECT_EQ(c.roles, (std::vector<std::string>{"replica", "status"}));
  apply_setting(c, "replicas", "2.5", "--set", problems);
  apply_setting(c, "nope.key", "1", "--set", problems);
  apply_setting(c, "http.body_limit", "12", "env STITCH_HTTP__BODY_LIMIT", problems);
  EXPECT_NE(problems.find("--set replicas: '2.5' is not a whole number"), std::string::npos)
    << problems;
  EXPECT_NE(problems.find("--set nope.key: unknown key"), std::string::npos);
  EXPECT_NE(problems.find("env STITCH_HTTP__BODY_LIMIT http.body_limit: 12 is outside"),
            std::string::npos)
    << problems;
  EXPECT_EQ(c.replicas, 3u) << "a bad value changes nothing";
}

TEST(node_config, printing_round_trips_and_hides_the_token) {
  node_config c;
  c.admin_token = "s3cr3t";
  c.replicas = 5;
  c.gpus = {3};
  c.store_uri = "rocksdb:/data/a \"quoted\" \\ dir";
  auto text = to_toml(c);
  EXPECT_EQ(text.find("s3cr3t"), std::string::npos);
  auto back = parse_node_config(text, "printed.toml");
  ASSERT_TRUE(back) << back.error().message << "\n" << text;
  EXPECT_EQ(back->replicas, 5u);
  EXPECT_EQ(back->gpus, (std::vector<uint32_t>{3}));
  EXPECT_EQ(back->store_uri, "rocksdb:/data/a \"quoted\" \\ dir");
  EXPECT_EQ(back->gateway_listen, c.gateway_listen);
  EXPECT_EQ(env_name("replica.commit_mode"), "STITCH_REPLICA__COMMIT_MODE");
  auto keys = setting_keys();
  EXPECT_NE(std::find(keys.begin(), keys.end(), "admin.token"), keys.end());
}

TEST(node_config, external_engine_settings_are_checked_together) {
  auto launched = parse_node_config(R"(
[engine]
kind = "sglang"
launch = "python -m sglang.launch_server --model-path {model_dir} --port {port}"
staging_dir = "/mnt/nvme/stitch"
update_timeout = 120
)",
                                    "sglang.toml");
  ASSERT_TRUE(launched) << launched.error().message;
  EXPECT_EQ(launched->engine_kind, engine_kind::sglang);
  EXPECT_EQ(launched->effective_staging_dir(), "/mnt/nvme/stitch");
  EXPECT_EQ(launched->engine_update_timeout, 120);
  auto printed = parse_node_config(to_toml(*launched), "printed.toml");
  ASSERT_TRUE(printed) << printed.error().message;
  EXPECT_EQ(printed->engine_launch, launched->engine_launch);

  auto neither = parse_node_config("[engine]\nkind = \"vllm\"\n", "a.toml");
  ASSERT_FALSE(neither);
  EXPECT_NE(neither.error().message.find("exactly one of engine.url"), std::string::npos)
    << neither.error().message;
  auto builtin_with_url =
    parse_node_config("[engine]\nurl = \"http://127.0.0.1:30000\"\n", "b.toml");
  ASSERT_FALSE(builtin_with_url);
  EXPECT_NE(builtin_with_url.error().message.find("engine.kind"), std::string::npos);
  auto shared_url = parse_node_config(
    "replicas = 2\n[engine]\nkind = \"sglang\"\nurl = \"http://127.0.0.1:30000\"\n", "c.toml");
  ASSERT_FALSE(shared_url);
  EXPECT_NE(shared_url.error().message.find("one engine serves one replica"), std::string::npos);
  auto bad_url = parse_node_config(
    "replicas = 1\n[engine]\nkind = \"sglang\"\nurl = \"127.0.0.1:30000\"\n", "d.toml");
  ASSERT_FALSE(bad_url);
  EXPECT_NE(bad_url.error().message.find("engine.url"), std::string::npos);
  auto unknown = parse_node_config("[engine]\nkind = \"tgi\"\n", "e.toml");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message.find("not one of builtin, sglang, vllm"), std::string::npos)
    << unknown.error().message;
}

TEST(node_config, the_builtin_engine_device_and_batch_are_checked) {
  auto gpu =
    parse_node_config("gpus = [1]\n[engine]\ndevice = \"cuda\"\nmax_batch = 16\n", "gpu.toml");
  ASSERT_TRUE(gpu) << gpu.error().message;
  EXPECT_EQ(gpu->engine_device, engine_device::cuda);
  EXPECT_EQ(gpu->engine_max_batch, 16u);
  auto printed = parse_node_config(to_toml(*gpu), "printed.toml");
  ASSERT_TRUE(printed) << printed.error().message;
  EXPECT_EQ(printed->engine_device, engine_device::cuda);
  EXPECT_EQ(printed->engine_max_batch, 16u);
  EXPECT_EQ(parse_node_config("", "default.toml")->engine_device, engine_device::cpu);

  auto tpu = parse_node_config("[engine]\ndevice = \"tpu\"\n", "a.toml");
  ASSERT_FALSE(tpu);
  EXPECT_NE(tpu.error().message.find("not one of cpu, cuda"), std::string::npos)
    << tpu.error().message;
  auto zero = parse_node_config("[engine]\nmax_batch = 0\n", "b.toml");
  ASSERT_FALSE(zero);
  EXPECT_NE(zero.error().message.find("engine.max_batch"), std::string::npos);
  auto external = parse_node_config(
    "[engine]\nkind = \"vllm\"\ndevice = \"cuda\"\nlaunch = \"vllm serve {model_dir}\"\n",
    "c.toml");
  ASSERT_FALSE(external);
  EXPECT_NE(external.error().message.find("engine.device"), std::string::npos)
    << external.error().message;
}

} // namespace
} // namespace stitch::config
