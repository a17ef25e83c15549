#include <gtest/gtest.h>

#include "config/experiment.hpp"

namespace stitch::config {
namespace {

TEST(experiment, a_full_file_is_typed) {
  auto e = parse_experiment(R"(
run_id = "exp1"
pool = "p1"
replicas = 3
commit_mode = "quiesce"
[boot]
preset = "small"
seed = 11
dir = "/ckpt/boot"
version = 4
[trainer]
enabled = true
steps = 12
samples_per_step = 5
staleness = 0
learning_rate = 0.25
)",
                            "exp.toml");
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->run_id, "exp1");
  EXPECT_EQ(e->pool, "p1");
  EXPECT_EQ(e->replicas, 3u);
  EXPECT_EQ(e->commit_mode, "quiesce");
  EXPECT_EQ(e->boot_preset, "small");
  EXPECT_EQ(e->boot_seed, 11u);
  EXPECT_EQ(e->boot_dir, "/ckpt/boot");
  EXPECT_EQ(e->boot_version, 4u);
  EXPECT_EQ(e->trainer.steps, 12u);
  EXPECT_EQ(e->trainer.samples_per_step, 5u);
  EXPECT_EQ(e->trainer.staleness, 0u);
  EXPECT_DOUBLE_EQ(e->trainer.learning_rate, 0.25);
}

TEST(experiment, defaults_fill_what_is_left_out) {
  auto e = parse_experiment("run_id = \"r\"\n[trainer]\nenabled = false\n", "e.toml");
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->pool, "default");
  EXPECT_EQ(e->replicas, 1u);
  EXPECT_FALSE(e->trainer.enabled);
}

TEST(experiment, every_problem_is_listed_with_its_key_path) {
  auto e = parse_experiment(R"(
pool = 7
replicas = 0
colour = "blue"
[boot]
seed = -1
[trainer]
learning_rate = "fast"
[extras]
x = 1
)",
                            "bad.toml");
  ASSERT_FALSE(e);
  const auto& m = e.error().message;
  for (const char* needle :
       {"bad.toml pool: must be a string", "replicas: must be in [1", "colour: unknown key",
        "boot.seed: must be in", "trainer.learning_rate: must be a number", "extras: unknown table",
        "run_id: missing"})
    EXPECT_NE(m.find(needle), std::string::npos) << needle << " not in:\n" << m;
}

TEST(experiment, hostile_names_and_bad_syntax_are_refused) {
  auto hostile = parse_experiment("run_id = \"../../etc\"\n", "e.toml");
  ASSERT_FALSE(hostile);
  EXPECT_NE(hostile.error().message.find("run_id"), std::string::npos);
  auto mode = parse_experiment("run_id = \"r\"\ncommit_mode = \"eventually\"\n", "e.toml");
  ASSERT_FALSE(mode);
  EXPECT_NE(mode.error().message.find("commit_mode"), std::string::npos);
  auto syntax = parse_experiment("run_id = \n", "e.toml");
  ASSERT_FALSE(syntax);
  EXPECT_NE(syntax.error().message.find("e.toml:1"), std::string::npos);
  EXPECT_FALSE(load_experiment("/nonexistent/experiment.toml"));
}

} // namespace
} // namespace stitch::config
