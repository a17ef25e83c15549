// UCX transfers between workers in one process and across processes, over
// shared memory and over TCP: bit-exact reads, windows of chunks, peers that
// die or vanish (an error within the deadline, never a hang), descriptors
// that are malformed.

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "transport/ucx.hpp"
#include "transport/ucx_fixtures.hpp"

namespace stitch::transport::ucx {
namespace {

using namespace std::chrono_literals;

using testing::pattern;
using testing::read_frame;
using testing::write_frame;

struct holder {
  std::unique_ptr<worker> w;
  std::vector<std::byte> bytes;
  std::unique_ptr<region> r;
};

holder make_holder(const context_options& opts, size_t size, uint64_t seed) {
  holder h;
  auto w = worker::start(opts);
  EXPECT_TRUE(w) << (w ? "" : to_string(w.error()));
  h.w = std::move(*w);
  h.bytes = pattern(size, seed);
  auto r = region::map(h.w->ctx(), h.bytes);
  EXPECT_TRUE(r) << (r ? "" : to_string(r.error()));
  h.r = std::move(*r);
  return h;
}

class ucx_transports : public ::testing::TestWithParam<const char*> {};

TEST_P(ucx_transports, reads_a_region_bit_exact_in_chunks_and_at_offsets) {
  STITCH_REQUIRE_UCX();
  context_options opts{GetParam()};
  auto h = make_holder(opts, (24 << 20) + 123, 1);
  auto reader = worker::start(opts);
  ASSERT_TRUE(reader) << to_string(reader.error());
  auto desc = h.w->describe(*h.r);
  std::vector<std::byte> out(h.bytes.size());
  read_options ro;
  ro.chunk = 1 << 20;
  ro.window = 4;
  auto ok = (*reader)->read(desc, 0, out, ro);
  ASSERT_TRUE(ok) << to_string(ok.error());
  EXPECT_EQ(std::memcmp(out.data(), h.bytes.data(), out.size()), 0);
  // A piece at an odd offset, in odd chunks.
  std::vector<std::byte> piece(5'000'001);
  ro.chunk = 65'537;
  ro.window = 16;
  ok = (*reader)->read(desc, 777, piece, ro);
  ASSERT_TRUE(ok) << to_string(ok.error());
  EXPECT_EQ(std::memcmp(piece.data(), h.bytes.data() + 777, piece.size()), 0);
}

// Shared memory moves the bytes; TCP carries what detects a failed peer
// (UCX 1.13 has no peer-failure handling over shared memory alone).
INSTANTIATE_TEST_SUITE_P(ucx, ucx_transports, ::testing::Values("tcp", "shm,self,tcp", ""));

TEST(ucx, descriptors_round_trip_and_malformed_ones_are_refused) {
  region_descriptor d;
  d.worker_address = {std::byte{1}, std::byte{2}, std::byte{3}};
  d.address = 0x1234;
  d.size = 99;
  d.rkey = {std::byte{9}};
  auto back = region_descriptor::decode(d.encode());
  ASSERT_TRUE(back) << to_string(back.error());
  EXPECT_EQ(back->worker_address, d.worker_address);
  EXPECT_EQ(back->address, d.address);
  EXPECT_EQ(back->size, d.size);
  EXPECT_EQ(back->rkey, d.rkey);
  auto bytes = d.encode();
  for (size_t cut : {size_t{0}, size_t{5}, size_t{11}, bytes.size() - 1}) {
    auto r = region_descriptor::decode(std::span{bytes}.first(cut));
    ASSERT_FALSE(r) << cut;
    EXPECT_EQ(r.error().code, errc::invalid_argument);
  }
  auto longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_FALSE(region_descriptor::decode(longer));
  std::vector<std::byte> huge(8, std::byte{0xff});
  auto r = region_descriptor::decode(huge);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("worker address"), std::string::npos) << r.error().message;
}

TEST(ucx, reads_outside_the_region_or_without_a_peer_are_refused) {
  STITCH_REQUIRE_UCX();
  auto h = make_holder({"tcp"}, 4096, 2);
  auto desc = h.w->describe(*h.r);
  std::vector<std::byte> out(100);
  auto past = h.w->read(desc, 4000, out);
  ASSERT_FALSE(past);
  EXPECT_EQ(past.error().code, errc::invalid_argument);
  region_descriptor empty;
  empty.size = 4096;
  auto none = h.w->read(empty, 0, out);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, errc::invalid_argument);
  EXPECT_TRUE(h.w->read(desc, 0, std::span<std::byte>{}));
}

TEST(ucx, a_vanished_peer_is_an_error_within_the_deadline) {
  STITCH_REQUIRE_UCX();
  auto h = make_holder({"tcp"}, 1 << 20, 3);
  auto desc = h.w->describe(*h.r);
  h.r.reset();
  h.w.reset();
  auto reader = worker::start(context_options{"tcp"});
  ASSERT_TRUE(reader);
  std::vector<std::byte> out(1 << 20);
  read_options ro;
  ro.deadline = 3s;
  auto t0 = std::chrono::steady_clock::now();
  auto ok = (*reader)->read(desc, 0, out, ro);
  EXPECT_FALSE(ok);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
}

/// A holder in another process: the child serves `size` bytes of
/// `pattern(size, seed)` over TCP until killed; the descriptor comes back
/// through a pipe.
struct child_holder {
  pid_t pid = -1;
  region_descriptor desc;
};

child_holder spawn_holder(size_t size, uint64_t seed) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    auto h = make_holder({"tcp"}, size, seed);
    write_frame(fds[1], h.w->describe(*h.r).encode());
    ::close(fds[1]);
    for (;;)
      ::pause();
  }
  ::close(fds[1]);
  child_holder c;
  c.pid = pid;
  auto bytes = read_frame(fds[0]);
  ::close(fds[0]);
  auto d = region_descriptor::decode(bytes);
  EXPECT_TRUE(d) << (d ? "" : to_string(d.error()));
  if (d)
    c.desc = *d;
  return c;
}

TEST(ucx, reads_across_processes_and_survives_the_holder_dying_mid_read) {
  STITCH_REQUIRE_UCX();
  // Both children are forked before this process touches UCX.
  auto first = spawn_holder(32 << 20, 7);
  auto second = spawn_holder(256 << 20, 8);
  auto reader = worker::start(context_options{"tcp"});
  ASSERT_TRUE(reader);
  std::vector<std::byte> out(32 << 20);
  auto ok = (*reader)->read(first.desc, 0, out);
  ASSERT_TRUE(ok) << to_string(ok.error());
  auto want = pattern(32 << 20, 7);
  EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size()), 0);

  // The second holder is killed while a large read is under way.
  std::vector<std::byte> big(256 << 20);
  read_options ro;
  // Small chunks one at a time: the read takes far longer than the kill.
  ro.chunk = 64 << 10;
  ro.window = 1;
  ro.deadline = 10s;
  std::thread killer{[pid = second.pid] {
    std::this_thread::sleep_for(30ms);
    ::kill(pid, SIGKILL);
  }};
  auto t0 = std::chrono::steady_clock::now();
  auto cut = (*reader)->read(second.desc, 0, big, ro);
  killer.join();
  EXPECT_FALSE(cut) << "the holder died before all of 256 MB crossed";
  if (!cut) {
    EXPECT_EQ(cut.error().code, errc::backend_failure);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
  ::kill(first.pid, SIGKILL);
  ::waitpid(first.pid, nullptr, 0);
  ::waitpid(second.pid, nullptr, 0);
}

TEST(ucx, a_read_whose_requests_stop_coming_back_moves_to_a_new_endpoint_bit_exact) {
  STITCH_REQUIRE_UCX();
  constexpr size_t size = size_t{64} << 20;
  auto holder = spawn_holder(size, 11);
  auto reader = worker::start(context_options{"tcp"});
  ASSERT_TRUE(reader);
  std::vector<std::byte> out(size);
  read_options ro;
  ro.chunk = 256 << 10;
  ro.window = 4;
  ro.stall = 300ms;
  ro.stall_retries = 2;
  ro.deadline = 60s;
  // The holder answers nothing for a while (stopped, as a peer whose
  // replies are lost), then comes back: the read replaces its endpoint
  // while the requests are out, asks again what they had not delivered,
  // and ends with every byte right.
  ASSERT_EQ(::kill(holder.pid, SIGSTOP), 0);
  std::thread pauser{[pid = holder.pid] {
    std::this_thread::sleep_for(1500ms);
    ::kill(pid, SIGCONT);
  }};
  auto ok = (*reader)->read(holder.desc, 0, out, ro);
  pauser.join();
  ASSERT_TRUE(ok) << to_string(ok.error());
  auto want = pattern(size, 11);
  EXPECT_EQ(std::memcmp(out.data(), want.data(), size), 0);
  EXPECT_GE((*reader)->stalled_endpoints_replaced(), 1u);
  ::kill(holder.pid, SIGKILL);
  ::waitpid(holder.pid, nullptr, 0);
}

} // namespace
} // namespace stitch::transport::ucx
