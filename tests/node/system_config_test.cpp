#include <caf/actor_system.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "actors/cluster_types.hpp"
#include "actors/replica_actor.hpp"
#include "actors/value_types.hpp"
#include "node/system_config.hpp"
#include "runtime/pipeline/pipeline.hpp"

namespace {

class caf_types_test : public ::testing::Test {
protected:
  caf_types_test() : sys(cfg) {}
  stitch::system_config cfg;
  caf::actor_system sys;
};

TEST_F(caf_types_test, domain_error_round_trips_through_caf) {
  stitch::error err{stitch::errc::version_exists, "r1/weight_v000003 differs"};
  auto converted = stitch::to_caf_error(err);
  EXPECT_EQ(converted.category(), caf::atom("stitch"));
  EXPECT_EQ(stitch::from_caf_error(sys, converted), err);
}

TEST_F(caf_types_test, rendering_names_category_code_and_message) {
  auto rendered = sys.render(stitch::to_caf_error({stitch::errc::rewind, "from 7 to 3"}));
  EXPECT_NE(rendered.find("rewind"), std::string::npos) << rendered;
  EXPECT_NE(rendered.find("from 7 to 3"), std::string::npos) << rendered;
}

TEST_F(caf_types_test, foreign_caf_errors_become_backend_failures) {
  auto err = stitch::from_caf_error(sys, caf::make_error(caf::sec::request_timeout));
  EXPECT_EQ(err.code, stitch::errc::backend_failure);
  EXPECT_NE(err.message.find("request_timeout"), std::string::npos) << err.message;
}

TEST_F(caf_types_test, pointer_record_serializes_round_trip) {
  stitch::pointer_record in{{"run-a", 42}, 7};
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  ASSERT_FALSE(sink(in));
  stitch::pointer_record out;
  caf::binary_deserializer source{sys, buf};
  ASSERT_FALSE(source(out));
  EXPECT_EQ(in, out);
}

/// Serializes `in` the way CAF sends it to another node and reads it back.
template <class T>
T round_trip(caf::actor_system& sys, T in) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  EXPECT_FALSE(sink(in));
  T out;
  caf::binary_deserializer source{sys, buf};
  EXPECT_FALSE(source(out));
  return out;
}

TEST_F(caf_types_test, typed_values_keep_their_optionals_across_nodes) {
  stitch::replica_call call;
  call.key = 9;
  call.route = "/generate";
  call.c.exact_version = 4;
  auto c = round_trip(sys, call);
  EXPECT_EQ(c.c, call.c);
  EXPECT_FALSE(c.c.min_version);
  EXPECT_EQ(c.route, "/generate");

  stitch::replica_info info;
  info.replica_id = "r0";
  info.applied = stitch::version_ref{"run", 3};
  info.serving = 3;
  info.state = stitch::sync_state::staging;
  info.mode = stitch::commit_mode::quiesce;
  info.metrics.max_pause_us = 12.5;
  auto i = round_trip(sys, info);
  EXPECT_EQ(i.applied, info.applied);
  EXPECT_EQ(i.serving, info.serving);
  EXPECT_FALSE(i.pointer);
  EXPECT_FALSE(i.terminal_error);
  EXPECT_EQ(i.state, stitch::sync_state::staging);
  EXPECT_EQ(i.mode, stitch::commit_mode::quiesce);
  EXPECT_EQ(i.metrics.max_pause_us, 12.5);
  // An absent value overwrites a present one when read into a used object.
  stitch::replica_info empty;
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  ASSERT_FALSE(sink(empty));
  caf::binary_deserializer source{sys, buf};
  ASSERT_FALSE(source(i));
  EXPECT_FALSE(i.applied);
  EXPECT_FALSE(i.serving);

  stitch::replica_answer a;
  a.stamped = stitch::stamps{2, 3};
  EXPECT_EQ(round_trip(sys, a).stamped, a.stamped);

  stitch::work_report r;
  r.err = stitch::to_caf_error({stitch::errc::checksum_mismatch, "tensor 'x'"});
  auto back = stitch::from_caf_error(sys, round_trip(sys, r).err);
  EXPECT_EQ(back, (stitch::error{stitch::errc::checksum_mismatch, "tensor 'x'"}));

  stitch::cluster_view view;
  view.nodes.push_back({"n1", {"replica"}, {0, 1}, "", 17});
  stitch::experiment_status e;
  e.run_id = "run";
  e.last_step = stitch::step_report{4, 5, 0.5, 16, 1.5, 2, 30.0, 0};
  e.replicas.push_back({"n1-replica-0", "n1", 0, true, true, true, stitch::version_ref{"run", 5},
                        stitch::sync_state::idle});
  view.experiments.push_back(e);
  stitch::version_holders holders;
  holders.pool = "default";
  holders.version = stitch::version_ref{"run", 5};
  holders.nodes = {"n1"};
  view.directory.push_back(holders);
  auto v = round_trip(sys, view);
  EXPECT_EQ(v.nodes[0].last_heartbeat_ms, 17);
  ASSERT_EQ(v.experiments.size(), 1u);
  EXPECT_EQ(v.experiments[0].last_step, e.last_step);
  EXPECT_EQ(v.experiments[0].replicas[0].applied, e.replicas[0].applied);
  EXPECT_EQ(v.directory[0].nodes, std::vector<std::string>{"n1"});
}

TEST_F(caf_types_test, a_manifest_crosses_nodes_whole_its_delta_frames_included) {
  // A replica on another node reads manifests through the store actor: a
  // field the inspector skips is lost there (its deltas then move whole).
  stitch::manifest m;
  m.ref = {"r", 3};
  m.kind = stitch::version_kind::delta;
  m.base_version = 2;
  m.encoding = stitch::delta_encoding::xor_sparse;
  m.touched = {"a", "b"};
  m.total_size = 40;
  m.checksums = {{"a", 1}, {"b", 2}};
  m.files["config.json"] = {12, 9};
  m.frames["a"] = {16, 77};
  m.frames["b"] = {24, 88};
  auto out = round_trip(sys, m);
  EXPECT_EQ(out, m);
  EXPECT_EQ(out.frames.at("b").checksum, 88u);
}

TEST_F(caf_types_test, pieces_cross_nodes_as_their_bytes_into_pooled_buffers) {
  // A client's piece: a pooled buffer, filled, shared.
  auto buffer = stitch::take_piece_buffer(3 << 20);
  ASSERT_TRUE(buffer);
  for (size_t i = 0; i < buffer->size; ++i)
    buffer->data[i] = static_cast<char>(i * 131 + 7);
  auto in = buffer->share(buffer->size - 5);
  std::vector<char> wire;
  caf::binary_serializer sink{sys, wire};
  ASSERT_FALSE(sink(in));
  // The wire format is a byte sequence's: a plain vector reads it too.
  std::vector<char> as_vector;
  caf::binary_deserializer plain{sys, wire};
  ASSERT_FALSE(plain(as_vector));
  ASSERT_EQ(as_vector.size(), in.size);
  EXPECT_EQ(std::memcmp(as_vector.data(), in.data, in.size), 0);
  stitch::shared_piece out;
  caf::binary_deserializer source{sys, wire};
  ASSERT_FALSE(source(out));
  ASSERT_TRUE(out.owner);
  ASSERT_EQ(out.size, in.size);
  EXPECT_EQ(std::memcmp(out.data, in.data, in.size), 0);
  EXPECT_NE(out.data, in.data);
  // An empty piece round-trips too, and arrives with an owner (an actor
  // that takes pieces refuses one without) but no buffer taken for it.
  auto empty = round_trip(sys, stitch::shared_piece{});
  EXPECT_EQ(empty.size, 0u);
  EXPECT_TRUE(empty.owner);
  EXPECT_EQ(empty.owner.use_count(), 0);
}

TEST_F(caf_types_test, a_piece_over_the_limit_is_refused_before_it_is_allocated) {
  std::vector<char> big(stitch::max_chunk_bytes + 1, 'x');
  std::vector<char> wire;
  caf::binary_serializer sink{sys, wire};
  ASSERT_FALSE(sink(big));
  stitch::shared_piece out;
  caf::binary_deserializer source{sys, wire};
  auto err = source(out);
  ASSERT_TRUE(err);
  EXPECT_EQ(stitch::from_caf_error(sys, err).code, stitch::errc::limit_exceeded);
  EXPECT_FALSE(out.owner);
  EXPECT_FALSE(stitch::take_piece_buffer(stitch::max_chunk_bytes + 1));
}

TEST_F(caf_types_test, released_piece_buffers_are_reused) {
  char* first = nullptr;
  {
    auto a = stitch::take_piece_buffer(5 << 20);
    ASSERT_TRUE(a);
    first = a->data;
    auto piece = a->share(100);
    a->owner.reset();
    // Still held by the piece: a new buffer is another one.
    auto b = stitch::take_piece_buffer(5 << 20);
    ASSERT_TRUE(b);
    EXPECT_NE(b->data, first);
  }
  // Both went back; the one released last comes out first.
  auto c = stitch::take_piece_buffer((5 << 20) - 1);
  ASSERT_TRUE(c);
  auto d = stitch::take_piece_buffer(5 << 20);
  ASSERT_TRUE(d);
  EXPECT_TRUE(c->data == first || d->data == first);
}

/// Pages of `[data, data + size)` (whole pages inside it) not in memory.
size_t missing_pages(const char* data, size_t size) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(data) + size) / page * page;
  std::vector<unsigned char> in((end - begin) / page);
  if (::mincore(reinterpret_cast<void*>(begin), end - begin, in.data()) != 0)
    return in.size();
  size_t missing = 0;
  for (auto v : in)
    missing += (v & 1) ? 0 : 1;
  return missing;
}

TEST_F(caf_types_test, warmed_piece_buffers_come_out_of_the_pool_with_their_pages_in) {
  // A size class nothing else here uses: without the warm-up these would be
  // fresh mappings with no page in memory.
  constexpr size_t size = size_t{7} << 20;
  stitch::warm_piece_buffers(2, size);
  auto a = stitch::take_piece_buffer(size);
  auto b = stitch::take_piece_buffer(size);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(missing_pages(a->data, a->size), 0u);
  EXPECT_EQ(missing_pages(b->data, b->size), 0u);
  // The pool had just the two: a third is fresh.
  auto c = stitch::take_piece_buffer(size);
  ASSERT_TRUE(c);
  EXPECT_GT(missing_pages(c->data, c->size), 0u);
}

/// The calling thread's time slice (ns) and policy, from /proc.
std::pair<uint64_t, int> slice_and_policy() {
  std::ifstream in{"/proc/thread-self/sched"};
  std::string line;
  uint64_t slice = 0;
  int policy = -1;
  while (std::getline(in, line)) {
    auto value = [&] { return std::stoull(line.substr(line.find(':') + 1)); };
    if (line.starts_with("se.slice"))
      slice = value();
    else if (line.starts_with("policy"))
      policy = static_cast<int>(value());
  }
  return {slice, policy};
}

TEST(middleman, small_machines_deserialize_on_the_network_thread) {
  // Below four cores no deserializing worker (one would only add a hop);
  // from four, CAF's own default.
  for (unsigned cores : {0u, 1u, 2u, 3u})
    EXPECT_EQ(stitch::middleman_workers(cores), 0u) << cores;
  EXPECT_EQ(stitch::middleman_workers(4), 2u);
  EXPECT_EQ(stitch::middleman_workers(8), 3u);
  EXPECT_EQ(stitch::middleman_workers(16), 4u);
  EXPECT_EQ(stitch::middleman_workers(128), 4u);
  stitch::system_config cfg;
  EXPECT_EQ(caf::get_or(cfg, "middleman.workers", size_t{99}),
            stitch::middleman_workers(std::thread::hardware_concurrency()));
}

TEST(thread_priority, control_threads_get_short_slices_and_bulk_threads_give_them_back) {
  std::pair<uint64_t, int> control, inherited, bulk, bulk_child;
  std::thread t{[&] {
    stitch::pipeline::run_as_latency_thread();
    control = slice_and_policy();
    std::thread{[&] { inherited = slice_and_policy(); }}.join();
    stitch::pipeline::run_as_background_thread();
    bulk = slice_and_policy();
    std::thread{[&] { bulk_child = slice_and_policy(); }}.join();
  }};
  t.join();
  if (control.first != 100'000)
    GTEST_SKIP() << "this kernel has no custom time slices (Linux 6.12+); se.slice "
                 << control.first;
  EXPECT_EQ(control.second, SCHED_OTHER);
  EXPECT_EQ(inherited, control);
  // SCHED_BATCH at the kernel's default slice, which threads it starts keep.
  EXPECT_EQ(bulk.second, SCHED_BATCH);
  EXPECT_GT(bulk.first, 100'000u);
  EXPECT_EQ(bulk_child, bulk);
}

} // namespace
