// Fan-out: the directory builds a relay chain when many receivers ask at
// once, prefers idle complete holders, never hands a receiver itself, and
// the stripe schedule keeps backups idle while a primary serves.

#include <gtest/gtest.h>

#include "runtime/core/fanout.hpp"

namespace stitch {
namespace {

const version_ref v1{"run", 1};
const version_ref v2{"run", 2};

std::vector<std::string> holders(const std::vector<source_pick>& picks) {
  std::vector<std::string> out;
  for (const auto& p : picks)
    out.push_back(p.holder);
  return out;
}

TEST(holder_directory, receivers_asking_at_once_form_a_chain_from_the_publisher) {
  holder_directory d;
  d.holds("publisher", "n0", "pool", v1);
  auto a = d.begin_fetch("r1", "n1", "pool", v1);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].holder, "publisher");
  EXPECT_FALSE(a[0].backup);
  EXPECT_FALSE(a[0].partial);
  // r1 is fetching: the next receiver reads what r1 has verified so far,
  // with the publisher as a backup.
  auto b = d.begin_fetch("r2", "n2", "pool", v1);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].holder, "r1");
  EXPECT_TRUE(b[0].partial);
  EXPECT_FALSE(b[0].backup);
  EXPECT_EQ(b[1].holder, "publisher");
  EXPECT_TRUE(b[1].backup);
  auto c = d.begin_fetch("r3", "n3", "pool", v1);
  EXPECT_EQ(c[0].holder, "r2");
  EXPECT_EQ(holders(c), (std::vector<std::string>{"r2", "publisher", "r1"}));
  EXPECT_EQ(d.readers("publisher"), 1u);
  EXPECT_EQ(d.readers("r1"), 1u);
  EXPECT_EQ(d.readers("r2"), 1u);
  EXPECT_EQ(d.readers("r3"), 0u);
}

TEST(holder_directory, idle_complete_holders_first_and_the_receiver_never_itself) {
  holder_directory d;
  d.holds("a", "n1", "pool", v1);
  d.holds("b", "n2", "pool", v1);
  d.holds("c", "n2", "other", v1);
  // Among equals, one on the receiver's own node.
  EXPECT_EQ(d.begin_fetch("x", "n2", "pool", v1)[0].holder, "b");
  // b serves x now: the idle one comes first.
  EXPECT_EQ(d.begin_fetch("y", "n2", "pool", v1)[0].holder, "a");
  d.end_fetch("x", true);
  d.end_fetch("y", true);
  EXPECT_EQ(d.readers("a"), 0u);
  EXPECT_EQ(d.readers("b"), 0u);
  auto self = d.begin_fetch("a", "n1", "pool", v1);
  for (const auto& p : self)
    EXPECT_NE(p.holder, "a");
  // Another pool's holders and other versions are never chosen.
  for (const auto& p : d.begin_fetch("z", "n2", "pool", v2))
    EXPECT_NE(p.holder, "c");
  EXPECT_TRUE(d.begin_fetch("z", "n2", "pool", v2).empty());
}

TEST(holder_directory, a_receiver_without_sources_is_not_listed_and_ends_release_slots) {
  holder_directory d;
  EXPECT_TRUE(d.begin_fetch("r1", "n1", "pool", v1).empty());
  // r1 reads the store: it offers nothing, so r2 gets no source either.
  EXPECT_TRUE(d.begin_fetch("r2", "n1", "pool", v1).empty());
  d.holds("r1", "n1", "pool", v1);
  auto p = d.begin_fetch("r3", "n1", "pool", v1);
  ASSERT_FALSE(p.empty());
  EXPECT_EQ(p[0].holder, "r1");
  // r3 fails halfway: r1's slot is free again and r3 offers nothing.
  d.end_fetch("r3", false);
  EXPECT_EQ(d.readers("r1"), 0u);
  auto q = d.begin_fetch("r4", "n1", "pool", v1);
  EXPECT_EQ(holders(q), (std::vector<std::string>{"r1"}));
}

TEST(holder_directory, a_finished_fetch_is_complete_and_a_gone_holder_frees_its_reader) {
  holder_directory d;
  d.holds("pub", "n0", "pool", v1);
  d.begin_fetch("r1", "n1", "pool", v1);
  d.begin_fetch("r2", "n2", "pool", v1);
  d.end_fetch("r1", true);
  d.end_fetch("r2", true);
  // r1 fetched everything (not applied yet): complete, and idle now.
  auto p = d.begin_fetch("r3", "n3", "pool", v1);
  EXPECT_EQ(p[0].holder, "pub");
  auto q = d.begin_fetch("r4", "n4", "pool", v1);
  EXPECT_EQ(q[0].holder, "r1");
  EXPECT_FALSE(q[0].partial);
  d.forget("r1");
  EXPECT_EQ(d.readers("r1"), 0u);
  // r4's primary is gone; when r4 ends nothing underflows.
  d.end_fetch("r4", true);
  EXPECT_EQ(d.readers("pub"), 1u);
  // Applying the version it fetched makes a receiver a complete holder.
  d.holds("r3", "n3", "pool", v1);
  EXPECT_EQ(d.readers("pub"), 0u);
}

TEST(holder_directory, a_publisher_serves_when_no_replica_is_idle) {
  holder_directory d;
  d.holds("a-publisher", "n0", "pool", v1, true);
  d.holds("z-replica", "n1", "pool", v1);
  // Both idle: the replica first (the publisher's network is the trainer's).
  auto p = d.begin_fetch("x", "n2", "pool", v1);
  EXPECT_EQ(holders(p), (std::vector<std::string>{"z-replica", "a-publisher"}));
  // The replica is busy: the idle publisher.
  EXPECT_EQ(d.begin_fetch("y", "n2", "pool", v1)[0].holder, "a-publisher");
}

TEST(holder_directory, max_sources_bounds_the_answer) {
  holder_directory d{{1, 2}};
  for (const char* h : {"a", "b", "c", "d"})
    d.holds(h, "n", "pool", v1);
  EXPECT_EQ(d.begin_fetch("x", "n", "pool", v1).size(), 2u);
  holder_directory none{{1, 0}};
  none.holds("a", "n", "pool", v1);
  EXPECT_TRUE(none.begin_fetch("x", "n", "pool", v1).empty());
}

TEST(stripe_schedule, stripes_go_by_tensor_name_then_offset) {
  std::vector<std::string> names{"b", "a"};
  std::vector<uint64_t> sizes{10, 25};
  stripe_schedule s{names, sizes, 10, 1};
  s.usable(0, 0);
  s.usable(1, 0);
  s.start();
  EXPECT_EQ(s.bytes_total(), 35u);
  std::vector<std::pair<size_t, uint64_t>> seen;
  while (auto p = s.take(0)) {
    seen.push_back({p->target, p->offset});
    s.landed(0, *p, {});
  }
  EXPECT_EQ(seen, (std::vector<std::pair<size_t, uint64_t>>{{1, 0}, {1, 10}, {1, 20}, {0, 0}}));
  EXPECT_EQ(s.done(1), 25u);
  EXPECT_EQ(s.done_total(), 35u);
  EXPECT_TRUE(s.finished_for(0));
}

TEST(stripe_schedule, a_backup_waits_until_the_primary_fails) {
  std::vector<std::string> names{"t"};
  std::vector<uint64_t> sizes{40};
  stripe_schedule s{names, sizes, 10, 2};
  s.usable(0, 0);
  s.usable(0, 1);
  s.set_backup(1);
  s.start();
  EXPECT_FALSE(s.take(1).has_value());
  EXPECT_FALSE(s.finished_for(1));
  auto p = s.take(0);
  ASSERT_TRUE(p);
  s.failed(0, *p);
  EXPECT_TRUE(s.dead(0));
  EXPECT_FALSE(s.take(0).has_value());
  // The primary is dead: the backup takes everything, the failed stripe first.
  auto q = s.take(1);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->offset, 0u);
  s.landed(1, *q, {});
  int more = 0;
  while (auto r = s.take(1)) {
    s.landed(1, *r, {});
    ++more;
  }
  EXPECT_EQ(more, 3);
  EXPECT_EQ(s.done(0), 40u);
  EXPECT_EQ(s.left(), 0u);
}

TEST(stripe_schedule, a_bad_chunk_goes_to_another_source_and_unusable_targets_stay_out) {
  std::vector<std::string> names{"x", "y"};
  std::vector<uint64_t> sizes{20, 20};
  stripe_schedule s{names, sizes, 20, 2};
  s.usable(0, 0);
  s.usable(0, 1);
  s.start();
  EXPECT_EQ(s.bytes_total(), 20u); // nobody offers "y": the store builds it
  auto p = s.take(0);
  ASSERT_TRUE(p);
  stripe bad{p->target, 10, 10, 0};
  EXPECT_EQ(s.landed(0, *p, std::span{&bad, 1}), 10u);
  EXPECT_FALSE(s.take(0).has_value()); // not from the source that sent it bad
  auto q = s.take(1);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->offset, 10u);
  s.landed(1, *q, {});
  EXPECT_EQ(s.done(0), 20u);
  EXPECT_TRUE(s.finished_for(0));
  EXPECT_TRUE(s.finished_for(1));
}

TEST(verified_prefix, moves_when_the_gap_before_out_of_order_chunks_closes) {
  verified_prefix v;
  EXPECT_EQ(v.add(10, 10), 0u);
  EXPECT_EQ(v.add(30, 5), 0u);
  EXPECT_EQ(v.add(0, 10), 20u);
  EXPECT_EQ(v.add(0, 10), 20u); // again: nothing new
  EXPECT_EQ(v.add(20, 10), 35u);
  EXPECT_TRUE(v.beyond.empty());
}

} // namespace
} // namespace stitch
