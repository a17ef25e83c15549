#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/core/stage_plan.hpp"

namespace stitch {
namespace {

chain_plan seeding() {
  chain_plan p;
  p.target = {"r", 3};
  p.anchor = version_ref{"r", 2};
  p.deltas = {{"r", 3}};
  p.touched = {"a", "b", "c"};
  return p;
}

chain_plan building_on() {
  chain_plan p;
  p.target = {"r", 5};
  p.deltas = {{"r", 4}, {"r", 5}};
  p.touched = {"b"};
  return p;
}

const std::vector<std::string> names{"a", "b", "c"};

TEST(stage_plan, seeding_wants_every_tensor_whole_and_checks_each_it_reads) {
  stage_ledger l{seeding()};
  EXPECT_EQ(l.wanted_whole(names), names);
  for (const auto& n : names) {
    EXPECT_EQ(l.arrival(n), tensor_arrival::read_from_anchor);
    EXPECT_EQ(l.check(n), tensor_check::checksum);
    EXPECT_TRUE(l.needs_patch(n));
  }
}

TEST(stage_plan, building_on_wants_only_the_touched_and_leaves_the_rest_shared_unchecked) {
  stage_ledger l{building_on()};
  EXPECT_EQ(l.wanted_whole(names), std::vector<std::string>{"b"});
  EXPECT_EQ(l.arrival("a"), tensor_arrival::shared_with_base);
  EXPECT_EQ(l.check("a"), tensor_check::none);
  EXPECT_EQ(l.check("c"), tensor_check::none);
  // Touched but not yet rewritten: checked anyway.
  EXPECT_EQ(l.check("b"), tensor_check::checksum);
}

TEST(stage_plan, a_tensor_a_holder_gave_whole_is_neither_patched_nor_checked_again) {
  stage_ledger l{seeding()};
  l.arrived("b", tensor_arrival::whole_from_holder);
  EXPECT_TRUE(l.whole("b"));
  EXPECT_FALSE(l.needs_patch("b"));
  EXPECT_EQ(l.check("b"), tensor_check::none);
  EXPECT_EQ(l.wanted_whole(names), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(l.from_holders(), std::vector<std::string>{"b"});
}

TEST(stage_plan, a_tensor_from_a_local_gpu_is_not_patched_but_is_checked_on_the_device) {
  stage_ledger l{building_on()};
  l.arrived("b", tensor_arrival::from_local_gpu);
  EXPECT_FALSE(l.needs_patch("b"));
  EXPECT_FALSE(l.whole("b"));
  EXPECT_EQ(l.check("b"), tensor_check::checksum);
  EXPECT_TRUE(l.from_holders().empty());
  EXPECT_TRUE(l.wanted_whole(names).empty());
}

TEST(stage_plan, a_patched_tensor_is_checked) {
  stage_ledger l{building_on()};
  l.patched("b");
  EXPECT_EQ(l.arrival("b"), tensor_arrival::patched);
  EXPECT_EQ(l.check("b"), tensor_check::checksum);
  EXPECT_EQ(to_string(tensor_arrival::patched), "patched");
}

/// Delta `ref` touching `names`, each frame `frame` bytes (none listed
/// when `frame` is 0: a delta written before frames were).
manifest delta_of(version_ref ref, std::vector<std::string> names, uint64_t frame) {
  manifest m;
  m.ref = ref;
  m.kind = version_kind::delta;
  m.base_version = ref.version - 1;
  m.touched = std::move(names);
  for (const auto& n : m.touched)
    if (frame > 0)
      m.frames[n] = {frame, 0};
  return m;
}

std::optional<uint64_t> thousand_bytes(std::string_view) {
  return 1000;
}

TEST(stage_plan, peers_give_a_chains_frames_when_they_are_fewer_bytes_than_the_touched_tensors) {
  auto p = building_on();
  // 2 deltas of 100-byte frames against b whole (1000 bytes): frames.
  std::vector<manifest> small{delta_of({"r", 4}, {"b"}, 100), delta_of({"r", 5}, {"b"}, 100)};
  auto c = choose_peer_fetch(p, small, thousand_bytes);
  EXPECT_EQ(c.how, peer_fetch::frames) << c.why;
  EXPECT_EQ(c.frame_bytes, 200u);
  EXPECT_EQ(c.whole_bytes, 1000u);
  EXPECT_TRUE(c.why.empty());
  // Folded frames larger than the tensors whole: whole.
  std::vector<manifest> large{delta_of({"r", 4}, {"b"}, 600), delta_of({"r", 5}, {"b"}, 600)};
  c = choose_peer_fetch(p, large, thousand_bytes);
  EXPECT_EQ(c.how, peer_fetch::whole);
  EXPECT_EQ(c.frame_bytes, 1200u);
  EXPECT_NE(c.why.find("not smaller"), std::string::npos) << c.why;
  // A delta that lists no frames, a manifest missing, one of another
  // version: whole.
  std::vector<manifest> unlisted{delta_of({"r", 4}, {"b"}, 100), delta_of({"r", 5}, {"b"}, 0)};
  c = choose_peer_fetch(p, unlisted, thousand_bytes);
  EXPECT_EQ(c.how, peer_fetch::whole);
  EXPECT_NE(c.why.find("lists no frames"), std::string::npos) << c.why;
  c = choose_peer_fetch(p, std::span<const manifest>{small}.first(1), thousand_bytes);
  EXPECT_EQ(c.how, peer_fetch::whole);
  std::vector<manifest> shifted{delta_of({"r", 5}, {"b"}, 100), delta_of({"r", 4}, {"b"}, 100)};
  EXPECT_EQ(choose_peer_fetch(p, shifted, thousand_bytes).how, peer_fetch::whole);
  // A cold stage (seeding from an anchor) always fetches whole tensors.
  c = choose_peer_fetch(seeding(), {}, thousand_bytes);
  EXPECT_EQ(c.how, peer_fetch::whole);
  EXPECT_EQ(c.whole_bytes, 3000u);
  EXPECT_EQ(to_string(peer_fetch::frames), "frames");
}

} // namespace
} // namespace stitch
