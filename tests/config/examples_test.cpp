#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/experiment.hpp"
#include "config/node_config.hpp"

namespace stitch::config {
namespace {

TEST(examples, every_role_and_experiment_file_in_examples_parses) {
  auto dir = std::filesystem::path{STITCH_SOURCE_DIR} / "examples";
  size_t nodes = 0, experiments = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator{dir}) {
    if (entry.path().extension() != ".toml")
      continue;
    std::ifstream in{entry.path()};
    std::stringstream text;
    text << in.rdbuf();
    auto name = entry.path().filename().string();
    if (name.starts_with("experiment")) {
      auto e = parse_experiment(text.str(), name);
      EXPECT_TRUE(e) << entry.path() << ": " << (e ? "" : e.error().message);
      ++experiments;
      continue;
    }
    auto c = parse_node_config(text.str(), name);
    EXPECT_TRUE(c) << entry.path() << ": " << (c ? "" : c.error().message);
    ++nodes;
  }
  EXPECT_GE(nodes, 6u);
  EXPECT_GE(experiments, 1u);
}

TEST(examples, the_all_in_one_file_is_the_default) {
  std::ifstream in{std::filesystem::path{STITCH_SOURCE_DIR} / "examples" / "all-in-one.toml"};
  std::stringstream text;
  text << in.rdbuf();
  auto c = parse_node_config(text.str(), "all-in-one.toml");
  ASSERT_TRUE(c) << c.error().message;
  const node_config defaults;
  EXPECT_EQ(to_toml(*c), to_toml(defaults));
}

} // namespace
} // namespace stitch::config
