// Peer-to-peer fetches over UCX: holders lease a version's tensors, a
// receiver stripes its reads across them and verifies every 1 MiB chunk;
// corrupt holders, holders whose bytes differ from the manifest, holders
// that die mid-fetch (another process, SIGKILLed) and unreachable holders
// end in a fetch from the others or a clear report, never a hang.

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "runtime/core/checksum.hpp"
#include "transport/ucx_fixtures.hpp"
#include "transport/ucx_peer.hpp"

namespace stitch::transport::ucx {
namespace {

using namespace std::chrono_literals;

using testing::pattern;
using testing::read_frame;
using testing::write_frame;

/// A version of three tensors (one large, one of a few chunks and a bit,
/// one tiny) and one empty tensor.
struct model {
  version_ref ref{"run", 3};
  std::vector<std::string> names{"a.weight", "b.bias", "c.norm", "d.empty"};
  std::vector<size_t> sizes{(40 << 20) + 5, (3 << 20) + 1, 17, 0};
  std::vector<std::vector<std::byte>> bytes;

  explicit model(uint64_t seed = 11) {
    for (size_t i = 0; i < sizes.size(); ++i)
      bytes.push_back(pattern(sizes[i], seed + i));
  }
  host_weights weights() {
    host_weights w;
    w.version = ref;
    for (size_t i = 0; i < names.size(); ++i)
      w.tensors.push_back({names[i], bytes[i]});
    return w;
  }
};

std::shared_ptr<worker> start_worker(const std::string& tls) {
  auto w = worker::start(context_options{tls});
  EXPECT_TRUE(w) << (w ? "" : to_string(w.error()));
  return std::shared_ptr<worker>{std::move(*w)};
}

/// Destinations for every tensor of `m`, and their targets.
struct receive {
  std::vector<std::vector<std::byte>> out;
  std::vector<fetch_target> targets;
  explicit receive(const model& m) {
    for (size_t i = 0; i < m.names.size(); ++i)
      out.emplace_back(m.sizes[i], std::byte{0});
    for (size_t i = 0; i < m.names.size(); ++i)
      targets.push_back({m.names[i], out[i], checksum::tree_checksum(m.bytes[i]), {}});
  }
  bool equals(const model& m) const {
    for (size_t i = 0; i < out.size(); ++i)
      if (out[i] != m.bytes[i])
        return false;
    return true;
  }
};

std::string problems_of(const fetch_report& r) {
  std::string all;
  for (const auto& p : r.problems)
    all += p + "\n";
  return all;
}

class peer_transports : public ::testing::TestWithParam<const char*> {};

TEST_P(peer_transports, stripes_a_version_across_two_holders_bit_exact) {
  STITCH_REQUIRE_UCX();
  model m;
  auto wa = start_worker(GetParam());
  auto wb = start_worker(GetParam());
  auto wr = start_worker(GetParam());
  holder a{wa, "holder-a", 60s}, b{wb, "holder-b", 60s};
  ASSERT_TRUE(a.expose(m.weights()));
  ASSERT_TRUE(b.expose(m.weights()));
  auto oa = a.lease(m.ref), ob = b.lease(m.ref);
  ASSERT_TRUE(oa && ob);
  EXPECT_EQ(a.leases(), 1u);
  receive r{m};
  fetch_options fo;
  fo.stripe = 2 << 20;
  uint64_t last_done = 0, total = 0;
  std::vector<offer> sources{*oa, *ob};
  auto report = fetch(*wr, m.ref, sources, r.targets, fo, [&](const transfer_progress& p) {
    EXPECT_GE(p.bytes_done, last_done);
    last_done = p.bytes_done;
    total = p.bytes_total;
  });
  EXPECT_TRUE(report.complete()) << problems_of(report);
  EXPECT_TRUE(r.equals(m));
  EXPECT_EQ(last_done, total);
  uint64_t all = 0;
  for (auto s : m.sizes)
    all += s;
  EXPECT_EQ(total, all);
  // Both holders served a share of the stripes.
  EXPECT_GT(report.bytes_by_source["holder-a"], 0u);
  EXPECT_GT(report.bytes_by_source["holder-b"], 0u);
  EXPECT_EQ(report.bytes_by_source["holder-a"] + report.bytes_by_source["holder-b"], all);
  a.release(oa->lease);
  EXPECT_EQ(a.leases(), 0u);
}

INSTANTIATE_TEST_SUITE_P(ucx, peer_transports, ::testing::Values("tcp", "shm,self,tcp"));

/// What a relay gives downstream: the staged targets of `m` in buffers the
/// test fills, and the digests a trusted holder offered.
struct relay_stage {
  std::vector<std::shared_ptr<std::vector<std::byte>>> buffers;
  std::vector<fetch_target> targets;
  std::vector<std::vector<uint64_t>> leaves;
  relay_stage(const model& m, const offer& trusted) {
    for (size_t i = 0; i < m.names.size(); ++i) {
      auto b = std::make_shared<std::vector<std::byte>>(m.sizes[i], std::byte{0});
      targets.push_back({m.names[i], *b, checksum::tree_checksum(m.bytes[i]), b});
      buffers.push_back(std::move(b));
      leaves.push_back(trusted.tensors[i].leaves);
    }
  }
  /// Copies the first `n` bytes of tensor `i` as a fetch would.
  void land(const model& m, size_t i, size_t n) {
    std::memcpy(buffers[i]->data(), m.bytes[i].data(), n);
  }
};

/// A publisher that holds `m`, and a relay that has begun staging it from
/// the publisher (nothing landed yet); `wd` is a reader's worker.
struct relay_rig {
  model m;
  std::shared_ptr<worker> wa = start_worker("tcp"), wr = start_worker("tcp"),
                          wd = start_worker("tcp");
  holder a{wa, "publisher", 60s};
  holder r{wr, "relay", 60s};
  std::optional<offer> trusted;
  std::optional<relay_stage> st;
  std::shared_ptr<holder::relay> relay;

  void start() {
    ASSERT_TRUE(a.expose(m.weights()));
    auto t = a.lease(m.ref);
    ASSERT_TRUE(t);
    trusted = *t;
    st.emplace(m, *trusted);
    auto staged = r.stage(m.ref, st->targets, st->leaves);
    ASSERT_TRUE(staged) << to_string(staged.error());
    relay = *staged;
  }
};

TEST(ucx_peer, a_relay_serves_what_it_has_verified_and_readers_wait_for_the_rest) {
  STITCH_REQUIRE_UCX();
  relay_rig rig;
  ASSERT_NO_FATAL_FAILURE(rig.start());
  auto& [m, wa, wr, wd, a, r, trusted, st_, relay_] = rig;
  auto& st = *st_;
  auto* relay = &relay_;
  EXPECT_EQ(r.exposed(), std::nullopt); // it serves nothing yet; it relays
  auto partial = r.lease(m.ref);
  ASSERT_TRUE(partial) << to_string(partial.error());
  EXPECT_TRUE(partial->partial);
  // Half of the large tensor and all of the others have landed so far.
  size_t half = 20 << 20;
  st.land(m, 0, half);
  (*relay)->verified(0, half);
  for (size_t i = 1; i < m.names.size(); ++i) {
    st.land(m, i, m.sizes[i]);
    (*relay)->verified(i, m.sizes[i]);
  }
  receive d{m};
  fetch_options fo;
  fo.stripe = 4 << 20;
  fo.poll = 1ms;
  fo.stall = 60s;
  std::vector<offer> sources{*partial};
  fetch_report report;
  std::atomic<uint64_t> done{0};
  std::thread reader{[&] {
    report = fetch(*wd, m.ref, sources, d.targets, fo,
                   [&](const transfer_progress& p) { done = p.bytes_done; });
  }};
  // Stripes go in name order: the reader gets the verified half of
  // a.weight, then waits on the relay for the rest (b and c come after).
  auto until = std::chrono::steady_clock::now() + 20s;
  while (done < half && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(done.load(), half);
  st.land(m, 0, m.sizes[0]);
  (*relay)->verified(0, m.sizes[0]);
  reader.join();
  EXPECT_TRUE(report.complete()) << problems_of(report);
  EXPECT_TRUE(d.equals(m));
  EXPECT_EQ(report.bytes_by_source["relay"], m.sizes[0] + m.sizes[1] + m.sizes[2]);
  // Serving the version in full replaces the relay's offer (and reuses the
  // registration and digests of the buffers it relayed).
  host_weights w;
  w.version = m.ref;
  for (size_t i = 0; i < m.names.size(); ++i)
    w.tensors.push_back({m.names[i], *st.buffers[i]});
  size_t before = r.registered_total();
  ASSERT_TRUE(r.expose(std::move(w)));
  EXPECT_EQ(r.registered_total(), before);
  auto full = r.lease(m.ref);
  ASSERT_TRUE(full);
  EXPECT_FALSE(full->partial);
}

TEST(ucx_peer, backups_serve_only_what_a_relay_gives_up_or_stalls_on) {
  STITCH_REQUIRE_UCX();
  relay_rig rig;
  ASSERT_NO_FATAL_FAILURE(rig.start());
  auto& [m, wa, wr, wd, a, r, trusted, st_, relay_] = rig;
  auto& st = *st_;
  auto* relay = &relay_;
  // The relay has b.bias, gave a.weight up (the store builds it there), and
  // never gets c.norm.
  st.land(m, 1, m.sizes[1]);
  (*relay)->verified(1, m.sizes[1]);
  (*relay)->abandon(0);
  auto partial = r.lease(m.ref);
  ASSERT_TRUE(partial);
  receive d{m};
  fetch_options fo;
  fo.stripe = 4 << 20;
  fo.poll = 1ms;
  fo.stall = 300ms;
  std::vector<offer> sources{*partial, *trusted};
  bool backup[] = {false, true};
  auto report = fetch(*wd, m.ref, sources, d.targets, fo, {}, backup);
  EXPECT_TRUE(report.complete()) << problems_of(report);
  EXPECT_TRUE(d.equals(m));
  EXPECT_EQ(report.bytes_by_source["relay"], m.sizes[1]);
  EXPECT_EQ(report.bytes_by_source["publisher"], m.sizes[0] + m.sizes[2]);
  auto all = problems_of(report);
  EXPECT_NE(all.find("gave up fetching tensor 'a.weight'"), std::string::npos) << all;
  EXPECT_NE(all.find("made no progress"), std::string::npos) << all;

  // With a healthy primary the backup serves nothing.
  receive again{m};
  std::vector<offer> both{*trusted, *trusted};
  both[1].source = "backup";
  auto quiet = fetch(*wd, m.ref, both, again.targets, fo, {}, backup);
  EXPECT_TRUE(quiet.complete()) << problems_of(quiet);
  EXPECT_EQ(quiet.bytes_by_source["backup"], 0u);
}

TEST(ucx_peer, a_receiver_relays_while_it_fetches_and_readers_behind_it_finish_bit_exact) {
  STITCH_REQUIRE_UCX();
  model m;
  auto wa = start_worker("tcp");
  auto w1 = start_worker("tcp");
  auto w2 = start_worker("tcp");
  holder a{wa, "publisher", 60s};
  ASSERT_TRUE(a.expose(m.weights()));
  auto from_a = a.lease(m.ref);
  ASSERT_TRUE(from_a);
  // Receiver 1 fetches from the publisher and relays; receiver 2 reads
  // receiver 1 while it fetches (a chain of two).
  holder h1{w1, "receiver-1", 60s};
  std::vector<std::shared_ptr<std::vector<std::byte>>> bufs;
  std::vector<fetch_target> t1;
  for (size_t i = 0; i < m.names.size(); ++i) {
    auto b = std::make_shared<std::vector<std::byte>>(m.sizes[i], std::byte{0});
    t1.push_back({m.names[i], *b, checksum::tree_checksum(m.bytes[i]), b});
    bufs.push_back(std::move(b));
  }
  fetch_options fo;
  fo.stripe = 1 << 20;
  fo.poll = 500us;
  std::vector<offer> s1{*from_a};
  fetch_report r1;
  std::thread first{[&] { r1 = fetch(*w1, m.ref, s1, t1, fo, {}, {}, &h1); }};
  // Receiver 2 leases as soon as receiver 1 offers anything.
  std::optional<offer> from_1;
  auto until = std::chrono::steady_clock::now() + 20s;
  while (!from_1 && std::chrono::steady_clock::now() < until) {
    if (auto o = h1.lease(m.ref))
      from_1 = *o;
    else
      std::this_thread::sleep_for(200us);
  }
  ASSERT_TRUE(from_1);
  EXPECT_TRUE(from_1->partial);
  receive d{m};
  std::vector<offer> s2{*from_1};
  auto r2 = fetch(*w2, m.ref, s2, d.targets, fo);
  first.join();
  EXPECT_TRUE(r1.complete()) << problems_of(r1);
  EXPECT_TRUE(r2.complete()) << problems_of(r2);
  EXPECT_TRUE(d.equals(m));
  EXPECT_EQ(r2.bytes_by_source["receiver-1"], m.sizes[0] + m.sizes[1] + m.sizes[2]);
}

TEST(ucx_peer, a_publisher_waits_briefly_for_young_leases_and_never_for_a_dead_readers) {
  STITCH_REQUIRE_UCX();
  model m;
  auto w = start_worker("tcp");
  holder_set lender{w, 60s, 300ms};
  ASSERT_TRUE(lender.expose("pool/run", "publisher", m.weights()));
  auto released = lender.lease(m.ref);
  ASSERT_TRUE(released);
  lender.release(released->lease);
  EXPECT_TRUE(lender.withdraw("pool/run")); // nobody reads
  ASSERT_TRUE(lender.expose("pool/run", "publisher", m.weights()));
  auto held = lender.lease(m.ref);
  ASSERT_TRUE(held);
  EXPECT_FALSE(lender.lease(version_ref{"run", 99}));
  // A reader that never releases (it died): the first rewrite waits out the
  // drain, later ones do not wait for it at all.
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(lender.withdraw("pool/run"));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 250ms);
  ASSERT_TRUE(lender.expose("pool/run", "publisher", m.weights()));
  EXPECT_TRUE(lender.withdraw("pool/run"));
  EXPECT_FALSE(lender.lease(m.ref)) << "a withdrawn version is lent to nobody";
}

TEST(ucx_peer, a_corrupt_chunk_is_fetched_again_from_another_holder) {
  STITCH_REQUIRE_UCX();
  model m;
  model corrupt = m;
  auto wa = start_worker("tcp"), wb = start_worker("tcp"), wr = start_worker("tcp");
  holder a{wa, "holder-a", 60s}, b{wb, "holder-b", 60s};
  ASSERT_TRUE(a.expose(corrupt.weights()));
  ASSERT_TRUE(b.expose(m.weights()));
  // After its digests were taken: a bit flips in holder a's memory.
  corrupt.bytes[0][(5 << 20) + 3] ^= std::byte{0x10};
  std::vector<offer> sources{*a.lease(m.ref), *b.lease(m.ref)};
  receive r{m};
  fetch_options fo;
  fo.stripe = 1 << 20;
  auto report = fetch(*wr, m.ref, sources, r.targets, fo);
  EXPECT_TRUE(report.complete()) << problems_of(report);
  EXPECT_TRUE(r.equals(m));
  // Unless holder b happened to serve chunk 5 first, the digest caught it.
  if (report.bytes_by_source["holder-a"] > 0 && !report.problems.empty()) {
    EXPECT_NE(problems_of(report).find("chunk 5 of tensor 'a.weight' from holder-a failed"),
              std::string::npos)
      << problems_of(report);
  }

  // With the corrupt holder alone, the chunk cannot be had: not fetched.
  std::vector<offer> only_a{*a.lease(m.ref)};
  receive alone{m};
  auto partial = fetch(*wr, m.ref, only_a, alone.targets, fo);
  EXPECT_FALSE(partial.fetched[0]);
  EXPECT_TRUE(partial.fetched[1]);
  EXPECT_TRUE(partial.fetched[2]);
  EXPECT_NE(problems_of(partial).find("chunk 5 of tensor 'a.weight'"), std::string::npos)
    << problems_of(partial);
  EXPECT_NE(problems_of(partial).find("could not be fetched"), std::string::npos);
}

TEST(ucx_peer, a_holder_whose_bytes_differ_from_the_manifest_is_not_asked) {
  STITCH_REQUIRE_UCX();
  model m;
  model other{99};
  auto wa = start_worker("tcp"), wr = start_worker("tcp");
  holder a{wa, "holder-a", 60s};
  ASSERT_TRUE(a.expose(other.weights()));
  std::vector<offer> sources{*a.lease(m.ref)};
  receive r{m};
  auto report = fetch(*wr, m.ref, sources, r.targets);
  EXPECT_FALSE(report.fetched[0]);
  EXPECT_FALSE(report.fetched[1]);
  EXPECT_FALSE(report.fetched[2]);
  EXPECT_TRUE(report.fetched[3]) << "an empty tensor needs no holder";
  EXPECT_EQ(report.bytes_by_source["holder-a"], 0u);
  EXPECT_NE(problems_of(report).find("holder-a offers tensor 'a.weight' with other bytes"),
            std::string::npos)
    << problems_of(report);
}

TEST(ucx_peer, leases_keep_a_replaced_version_readable_and_name_only_the_exposed_one) {
  STITCH_REQUIRE_UCX();
  model v3;
  model v4{21};
  v4.ref = {"run", 4};
  auto wa = start_worker("tcp"), wr = start_worker("tcp");
  holder a{wa, "holder-a", 60s};
  EXPECT_FALSE(a.exposed());
  auto none = a.lease(v3.ref);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, errc::not_found);
  ASSERT_TRUE(a.expose(v3.weights()));
  auto old = a.lease(v3.ref);
  ASSERT_TRUE(old);
  ASSERT_TRUE(a.expose(v4.weights()));
  EXPECT_EQ(a.exposed(), v4.ref);
  EXPECT_FALSE(a.lease(v3.ref)) << "v3 is no longer offered";
  // The lease taken before still reads v3.
  receive r{v3};
  std::vector<offer> sources{*old};
  auto report = fetch(*wr, v3.ref, sources, r.targets);
  EXPECT_TRUE(report.complete()) << problems_of(report);
  EXPECT_TRUE(r.equals(v3));
  a.release(old->lease);
  a.withdraw();
  EXPECT_FALSE(a.exposed());
  // A source offering another version is not used for this one.
  ASSERT_TRUE(a.expose(v4.weights()));
  std::vector<offer> wrong{*a.lease(v4.ref)};
  receive again{v3};
  auto refused = fetch(*wr, v3.ref, wrong, again.targets);
  EXPECT_FALSE(refused.fetched[0]);
  EXPECT_NE(problems_of(refused).find("offers run/weight_v000004, not run/weight_v000003"),
            std::string::npos)
    << problems_of(refused);
}

TEST(ucx_peer, buffers_a_new_version_shares_keep_their_registration_and_digests) {
  STITCH_REQUIRE_UCX();
  model v3;
  auto wa = start_worker("tcp"), wr = start_worker("tcp");
  holder a{wa, "holder-a", 60s};
  ASSERT_TRUE(a.expose(v3.weights()));
  EXPECT_EQ(a.registered_total(), 3u) << "three tensors with bytes";
  // Version 4 changes b.bias only (a new buffer); the others are the same
  // buffers, as an engine shares untouched tensors between versions.
  auto b4 = pattern(v3.sizes[1], 77);
  auto w4 = v3.weights();
  w4.version = {"run", 4};
  w4.tensors[1].bytes = b4;
  ASSERT_TRUE(a.expose(w4));
  EXPECT_EQ(a.registered_total(), 4u) << "only the changed tensor is registered again";
  model v4 = v3;
  v4.ref = w4.version;
  v4.bytes[1] = b4;
  receive r{v4};
  std::vector<offer> sources{*a.lease(v4.ref)};
  auto report = fetch(*wr, v4.ref, sources, r.targets);
  EXPECT_TRUE(report.complete()) << problems_of(report);
  EXPECT_TRUE(r.equals(v4));
}

TEST(ucx_peer, an_unreachable_holder_ends_in_a_report_within_the_deadline) {
  STITCH_REQUIRE_UCX();
  model m;
  auto wa = start_worker("tcp"), wr = start_worker("tcp");
  offer o;
  {
    holder a{wa, "holder-a", 60s};
    ASSERT_TRUE(a.expose(m.weights()));
    o = *a.lease(m.ref);
  }
  // The holder's worker is gone: its address names nobody.
  wa.reset();
  receive r{m};
  fetch_options fo;
  fo.deadline = 5s;
  fo.read.deadline = 2s;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<offer> sources{o};
  auto report = fetch(*wr, m.ref, sources, r.targets, fo);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
  EXPECT_FALSE(report.fetched[0]);
  EXPECT_FALSE(report.problems.empty());
  // An address in no format this UCX build makes is refused before UCX
  // parses it.
  o.worker_address.assign(40, std::byte{0x5a});
  std::vector<offer> garbage{o};
  receive g{m};
  auto bad = fetch(*wr, m.ref, garbage, g.targets, fo);
  EXPECT_FALSE(bad.fetched[0]);
  EXPECT_NE(problems_of(bad).find("not in this UCX build's format"), std::string::npos)
    << problems_of(bad);
}

// -- across processes ----------------------------------------------------------

/// A holder process: exposes `model(seed)` over TCP until killed; each
/// tensor's descriptor comes back through a pipe.
struct child {
  pid_t pid = -1;
  offer o;
};

/// In a forked child: offers `weights` over `tls` as `name`, writes each
/// tensor's descriptor to `fd` and waits to be killed.
[[noreturn]] void hold_until_killed(int fd, const std::string& tls, const std::string& name,
                                    host_weights weights) {
  auto w = start_worker(tls);
  holder h{w, name, 600s};
  auto ref = weights.version;
  if (!h.expose(std::move(weights)))
    ::_exit(3);
  auto o = h.lease(ref);
  for (const auto& t : o->tensors) {
    region_descriptor d{o->worker_address, t.address, t.size, t.rkey};
    write_frame(fd, d.encode());
  }
  ::close(fd);
  for (;;)
    ::pause();
}

child spawn_child(const std::string& name, const std::string& tls) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    model m;
    hold_until_killed(fds[1], tls, name, m.weights());
  }
  ::close(fds[1]);
  child c;
  c.pid = pid;
  model m;
  c.o.source = name;
  c.o.version = m.ref;
  for (size_t i = 0; i < m.names.size(); ++i) {
    auto d = region_descriptor::decode(read_frame(fds[0]));
    EXPECT_TRUE(d || m.sizes[i] == 0) << "tensor " << i;
    offered_tensor t;
    t.name = m.names[i];
    t.size = m.sizes[i];
    if (d) {
      c.o.worker_address = d->worker_address;
      t.address = d->address;
      t.rkey = d->rkey;
    }
    for (size_t at = 0; at < t.size; at += checksum::chunk_size)
      t.leaves.push_back(checksum::chunk_digest(
        std::span{m.bytes[i]}.subspan(at, std::min(checksum::chunk_size, t.size - at))));
    c.o.tensors.push_back(std::move(t));
  }
  ::close(fds[0]);
  return c;
}

class killed_holder : public ::testing::TestWithParam<const char*> {};

TEST_P(killed_holder, three_processes_a_holder_killed_mid_fetch_the_other_finishes) {
  STITCH_REQUIRE_UCX();
  // Both holders are forked before this process touches UCX.
  auto a = spawn_child("holder-a", GetParam());
  auto b = spawn_child("holder-b", GetParam());
  auto wr = start_worker(GetParam());
  model m;
  receive r{m};
  fetch_options fo;
  fo.stripe = 1 << 20;
  // Small reads one at a time: the fetch outlasts the kill by far.
  fo.read.chunk = 64 << 10;
  fo.read.window = 1;
  fo.read.deadline = 5s;
  std::atomic<bool> killed{false};
  std::vector<offer> sources{a.o, b.o};
  auto report = fetch(*wr, m.ref, sources, r.targets, fo, [&](const transfer_progress& p) {
    if (!killed && p.bytes_done > p.bytes_total / 8) {
      killed = true;
      ::kill(a.pid, SIGKILL);
    }
  });
  EXPECT_TRUE(killed);
  EXPECT_TRUE(report.complete()) << problems_of(report);
  EXPECT_TRUE(r.equals(m));
  EXPECT_GT(report.bytes_by_source["holder-b"], report.bytes_by_source["holder-a"]);
  EXPECT_NE(problems_of(report).find("holder-a: "), std::string::npos) << problems_of(report);
  ::kill(b.pid, SIGKILL);
  ::waitpid(a.pid, nullptr, 0);
  ::waitpid(b.pid, nullptr, 0);
}

INSTANTIATE_TEST_SUITE_P(ucx, killed_holder, ::testing::Values("tcp", "shm,self,tcp"));

/// Tensor `k` of the 1 GB version: fast deterministic bytes (splitmix64).
void big_tensor(size_t k, std::span<std::byte> out) {
  uint64_t x = 0x9e3779b97f4a7c15ull * (k + 1);
  for (size_t i = 0; i + 8 <= out.size(); i += 8) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(out.data() + i, &z, 8);
  }
}

class one_gigabyte : public ::testing::TestWithParam<const char*> {};

TEST_P(one_gigabyte, two_processes_move_a_1_gb_version_bit_exact) {
  STITCH_REQUIRE_UCX();
  constexpr size_t tensors = 16;
  constexpr size_t each = size_t{64} << 20; // 16 x 64 MiB = 1 GiB
  const version_ref ref{"big", 1};
  const std::string tls = GetParam();
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::vector<std::vector<std::byte>> bytes(tensors, std::vector<std::byte>(each));
    host_weights w;
    w.version = ref;
    for (size_t k = 0; k < tensors; ++k) {
      big_tensor(k, bytes[k]);
      w.tensors.push_back({"t" + std::to_string(100 + k), bytes[k]});
    }
    hold_until_killed(fds[1], tls, "holder", std::move(w));
  }
  ::close(fds[1]);
  // The receiver knows the version's digests (as from a manifest and an
  // offer) and nothing of its bytes.
  offer o;
  o.source = "holder";
  o.version = ref;
  std::vector<std::byte> scratch(each);
  std::vector<std::vector<std::byte>> out(tensors, std::vector<std::byte>(each));
  std::vector<fetch_target> targets;
  for (size_t k = 0; k < tensors; ++k) {
    auto d = region_descriptor::decode(read_frame(fds[0]));
    ASSERT_TRUE(d) << "tensor " << k;
    o.worker_address = d->worker_address;
    offered_tensor t{"t" + std::to_string(100 + k), d->address, each, d->rkey, {}, 0};
    big_tensor(k, scratch);
    for (size_t at = 0; at < each; at += checksum::chunk_size)
      t.leaves.push_back(
        checksum::chunk_digest(std::span{scratch}.subspan(at, checksum::chunk_size)));
    targets.push_back({t.name, out[k], checksum::combine(t.leaves), {}});
    o.tensors.push_back(std::move(t));
  }
  ::close(fds[0]);
  auto wr = start_worker(tls);
  std::vector<offer> sources{o};
  // Deadlines no loaded CI machine reaches: this test is about the bytes.
  fetch_options fo;
  fo.deadline = 10min;
  fo.read.deadline = 2min;
  auto report = fetch(*wr, ref, sources, targets, fo);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  EXPECT_TRUE(report.complete()) << problems_of(report);
  EXPECT_EQ(report.bytes_by_source["holder"], tensors * each);
  for (size_t k = 0; k < tensors; ++k) {
    big_tensor(k, scratch);
    EXPECT_EQ(std::memcmp(scratch.data(), out[k].data(), each), 0) << "tensor " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(ucx, one_gigabyte, ::testing::Values("tcp", "shm,self,tcp"));

} // namespace
} // namespace stitch::transport::ucx
