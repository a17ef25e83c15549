// Choosing the holders a receiver fetches from: the least handed-out first,
// the receiver's own node among equals, never the receiver itself.

#include <gtest/gtest.h>

#include <map>

#include "runtime/core/source_choice.hpp"

namespace stitch {
namespace {

std::vector<std::string> ids(std::span<const source_candidate> c, const std::vector<size_t>& at) {
  std::vector<std::string> out;
  for (auto i : at)
    out.push_back(c[i].replica_id);
  return out;
}

TEST(source_choice, spreads_receivers_over_the_least_used_holders) {
  std::vector<source_candidate> c{
    {"r-a", "n1", 3}, {"r-b", "n2", 0}, {"r-c", "n2", 1}, {"r-d", "n3", 0}};
  EXPECT_EQ(ids(c, choose_sources(c, "r-x", "n9", 2)), (std::vector<std::string>{"r-b", "r-d"}));
  EXPECT_EQ(ids(c, choose_sources(c, "r-x", "n9", 10)),
            (std::vector<std::string>{"r-b", "r-d", "r-c", "r-a"}));
  // Among equals, the receiver's own node first.
  EXPECT_EQ(ids(c, choose_sources(c, "r-x", "n3", 1)), (std::vector<std::string>{"r-d"}));
}

TEST(source_choice, never_the_receiver_and_nothing_from_nothing) {
  std::vector<source_candidate> c{{"r-a", "n1", 0}, {"r-b", "n1", 5}};
  EXPECT_EQ(ids(c, choose_sources(c, "r-a", "n1", 4)), (std::vector<std::string>{"r-b"}));
  EXPECT_TRUE(choose_sources({}, "r-a", "n1", 4).empty());
  EXPECT_TRUE(choose_sources(c, "r-z", "n1", 0).empty());
}

TEST(source_choice, repeated_choices_with_counts_fed_back_use_every_holder) {
  // What the coordinator does: count each hand-out, choose again.
  std::vector<source_candidate> c{{"r-a", "n1", 0}, {"r-b", "n2", 0}, {"r-c", "n3", 0}};
  std::map<std::string, int> picked;
  for (int receiver = 0; receiver < 30; ++receiver)
    for (auto i : choose_sources(c, "recv-" + std::to_string(receiver), "n4", 1)) {
      ++c[i].handed_out;
      ++picked[c[i].replica_id];
    }
  EXPECT_EQ(picked["r-a"], 10);
  EXPECT_EQ(picked["r-b"], 10);
  EXPECT_EQ(picked["r-c"], 10);
}

} // namespace
} // namespace stitch
