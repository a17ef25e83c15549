#include "runtime/core/shard_plan.hpp"

#include <vector>

#include <gtest/gtest.h>

using stitch::plan_shards;
using stitch::shard_input;

TEST(shard_plan, names_follow_the_hugging_face_convention) {
  EXPECT_EQ(stitch::shard_name(0, 1), "model-00001-of-00001.safetensors");
  EXPECT_EQ(stitch::shard_name(2, 12), "model-00003-of-00012.safetensors");
}

TEST(shard_plan, a_single_shard_still_gets_a_numbered_name) {
  std::vector<shard_input> tensors{{"a", 10}, {"b", 20}};
  auto plan = plan_shards(tensors);
  ASSERT_TRUE(plan);
  ASSERT_EQ(plan->shards.size(), 1u);
  EXPECT_EQ(plan->shards[0], "model-00001-of-00001.safetensors");
  EXPECT_EQ(plan->total_size, 30u);
  EXPECT_EQ(plan->weight_map.at("a"), plan->shards[0]);
  EXPECT_EQ(plan->weight_map.at("b"), plan->shards[0]);
}

TEST(shard_plan, fills_shards_in_order_up_to_the_maximum) {
  std::vector<shard_input> tensors{{"a", 40}, {"b", 60}, {"c", 1}, {"d", 99}, {"e", 50}};
  auto plan = plan_shards(tensors, 100);
  ASSERT_TRUE(plan);
  ASSERT_EQ(plan->shards.size(), 3u);
  EXPECT_EQ(plan->shards[2], "model-00003-of-00003.safetensors");
  EXPECT_EQ(plan->shard_tensors[0], (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(plan->shard_tensors[1], (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(plan->shard_tensors[2], (std::vector<std::string>{"e"}));
  EXPECT_EQ(plan->shard_bytes, (std::vector<uint64_t>{100, 100, 50}));
  EXPECT_EQ(plan->total_size, 250u);
  EXPECT_EQ(plan->weight_map.at("d"), "model-00002-of-00003.safetensors");
  EXPECT_EQ(plan->weight_map.size(), 5u);
}

TEST(shard_plan, an_oversized_tensor_gets_its_own_shard) {
  std::vector<shard_input> tensors{{"a", 10}, {"big", 500}, {"b", 10}, {"c", 10}};
  auto plan = plan_shards(tensors, 100);
  ASSERT_TRUE(plan);
  ASSERT_EQ(plan->shards.size(), 3u);
  EXPECT_EQ(plan->shard_tensors[0], (std::vector<std::string>{"a"}));
  EXPECT_EQ(plan->shard_tensors[1], (std::vector<std::string>{"big"}));
  EXPECT_EQ(plan->shard_tensors[2], (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(plan->total_size, 530u);
}

TEST(shard_plan, default_maximum_is_five_gigabytes) {
  uint64_t gb = 1'000'000'000;
  std::vector<shard_input> tensors{{"a", 3 * gb}, {"b", 2 * gb}, {"c", 1}};
  auto plan = plan_shards(tensors);
  ASSERT_TRUE(plan);
  ASSERT_EQ(plan->shards.size(), 2u);
  EXPECT_EQ(plan->weight_map.at("b"), "model-00001-of-00002.safetensors");
  EXPECT_EQ(plan->weight_map.at("c"), "model-00002-of-00002.safetensors");
}

TEST(shard_plan, no_tensors_no_shards) {
  auto plan = plan_shards({});
  ASSERT_TRUE(plan);
  EXPECT_TRUE(plan->shards.empty());
  EXPECT_EQ(plan->total_size, 0u);
}

TEST(shard_plan, refuses_bad_input) {
  std::vector<shard_input> dup{{"a", 1}, {"a", 2}};
  EXPECT_FALSE(plan_shards(dup));
  std::vector<shard_input> unnamed{{"", 1}};
  EXPECT_FALSE(plan_shards(unnamed));
  std::vector<shard_input> one{{"a", 1}};
  EXPECT_FALSE(plan_shards(one, 0));
  std::vector<shard_input> overflow{{"a", ~uint64_t{0}}, {"b", 1}};
  EXPECT_FALSE(plan_shards(overflow));
  std::vector<shard_input> many;
  for (size_t i = 0; i < stitch::max_shard_count + 1; ++i) {
    std::string name = "t";
    name += std::to_string(i);
    many.push_back({std::move(name), 2});
  }
  auto too_many = plan_shards(many, 1);
  ASSERT_FALSE(too_many);
  EXPECT_EQ(too_many.error().code, stitch::errc::invalid_argument);
}
