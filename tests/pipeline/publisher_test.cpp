#include "runtime/pipeline/publisher.hpp"
#include "store/store_fixtures.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <future>

#include <thread>

#include "runtime/pipeline/materialize.hpp"
#include "store/memory_store.hpp"

namespace {

using namespace stitch;
using namespace stitch::pipeline;
using namespace stitch::store;
using stitch::safetensors::dtype;
using stitch::testing::make_tensor;
using stitch::testing::memory_store;

/// A small model with varied dtypes, an empty tensor and a sub-byte one.
tensor_set make_weights(uint64_t seed) {
  std::mt19937_64 rng{seed};
  tensor_set w;
  auto add = [&](host_tensor t) { w.emplace(t.name, std::move(t)); };
  add(make_tensor("model.embed_tokens.weight", dtype::bf16, {64, 32}, rng));
  add(make_tensor("model.layers.0.mlp.up_proj.weight", dtype::f32, {32, 48}, rng));
  add(make_tensor("model.layers.0.self_attn.q_proj.weight", dtype::f16, {32, 32}, rng));
  add(make_tensor("model.layers.1.mlp.up_proj.weight", dtype::f32, {32, 48}, rng));
  add(make_tensor("model.norm.weight", dtype::f32, {32}, rng));
  add(make_tensor("lm_head.bias", dtype::i64, {3, 5}, rng));
  add(make_tensor("packed.f4", dtype::f4, {11}, rng));
  add(make_tensor("empty", dtype::f32, {0, 4}, rng));
  return w;
}

/// Changes a few bytes of a few tensors, as one optimizer step on a sparse update.
void mutate_sparse(tensor_set& w, std::mt19937_64& rng) {
  for (auto& [name, t] : w) {
    if (t.bytes.empty() || rng() % 3 != 0)
      continue;
    size_t changes = 1 + rng() % 8;
    for (size_t i = 0; i < changes; ++i)
      t.bytes[rng() % t.bytes.size()] ^= static_cast<std::byte>(1 + rng() % 255);
  }
}

void randomize_all(tensor_set& w, std::mt19937_64& rng) {
  for (auto& [name, t] : w)
    for (auto& b : t.bytes)
      b = static_cast<std::byte>(rng() & 0xff);
}

publish_request req(std::string run, uint64_t version) {
  publish_request r;
  r.run_id = std::move(run);
  r.version = version;
  return r;
}

class publisher_test : public ::testing::Test {
protected:
  memory_store store;
};

TEST_F(publisher_test, ten_sparse_versions_materialize_byte_identical) {
  publisher pub{store};
  std::mt19937_64 rng{42};
  tensor_set w = make_weights(1);
  std::vector<tensor_set> published;
  for (uint64_t v = 0; v < 10; ++v) {
    if (v > 0)
      mutate_sparse(w, rng);
    auto report = pub.publish(req("r1", v), w);
    ASSERT_TRUE(report) << to_string(report.error());
    EXPECT_EQ(report->kind, v == 0 ? version_kind::full : version_kind::delta) << v;
    EXPECT_EQ(report->claimed, v == 0);
    ASSERT_TRUE(report->pointer);
    EXPECT_EQ(report->pointer->latest, (version_ref{"r1", v}));
    EXPECT_EQ(report->pointer->boot_version, 0u);
    published.push_back(w);
  }
  for (uint64_t v = 0; v < 10; ++v) {
    auto got = materialize(store, "default", {"r1", v});
    ASSERT_TRUE(got) << v << ": " << to_string(got.error());
    EXPECT_TRUE(*got == published[v]) << "version " << v;
  }
}

TEST(publisher_delta_encodings, xor_and_xor_sparse_rebuild_the_same_versions) {
  // Sparse steps, a step that rewrites a whole tensor with random bytes (a
  // dense XOR: one long literal run), and a step that zeroes one (long runs).
  std::vector<tensor_set> published;
  std::map<delta_encoding, std::unique_ptr<memory_store>> stores;
  for (auto format : {delta_encoding::xor_sparse, delta_encoding::xor_bytes}) {
    auto& store = *(stores[format] = std::make_unique<memory_store>());
    publisher pub{store, [&] {
                    publisher_options o;
                    o.delta_format = format;
                    o.chunk_bytes = 4096; // several frames per tensor
                    return o;
                  }()};
    std::mt19937_64 rng{17};
    tensor_set w = make_weights(3);
    published.clear();
    for (uint64_t v = 0; v < 6; ++v) {
      if (v == 3) {
        for (auto& b : w.at("model.layers.0.mlp.up_proj.weight").bytes)
          b = static_cast<std::byte>(rng() & 0xff);
      } else if (v == 4) {
        auto& t = w.at("model.embed_tokens.weight").bytes;
        std::fill(t.begin() + 100, t.end() - 100, std::byte{0});
      } else if (v > 0) {
        mutate_sparse(w, rng);
      }
      auto report = pub.publish(req("r", v), w);
      ASSERT_TRUE(report) << to_string(report.error());
      EXPECT_EQ(report->kind, v == 0 ? version_kind::full : version_kind::delta) << v;
      published.push_back(w);
    }
    auto m = store.read_manifest("default", {"r", 3});
    ASSERT_TRUE(m);
    EXPECT_EQ(m->encoding, format);
  }
  for (uint64_t v = 0; v < published.size(); ++v)
    for (auto& [format, store] : stores) {
      auto got = materialize(*store, "default", {"r", v});
      ASSERT_TRUE(got) << to_string(format) << " " << v << ": " << to_string(got.error());
      EXPECT_TRUE(*got == published[v]) << to_string(format) << " version " << v;
    }
}

TEST_F(publisher_test, deltas_store_only_changed_tensors) {
  publisher pub{store};
  tensor_set w = make_weights(2);
  ASSERT_TRUE(pub.publish(req("r1", 0), w));
  w.at("model.norm.weight").bytes[3] ^= std::byte{0x10};
  auto report = pub.publish(req("r1", 1), w);
  ASSERT_TRUE(report) << to_string(report.error());
  EXPECT_EQ(report->kind, version_kind::delta);
  EXPECT_EQ(report->touched, std::vector<std::string>{"model.norm.weight"});
  EXPECT_EQ(report->encoded_bytes, w.at("model.norm.weight").bytes.size());
  EXPECT_LT(report->stored_bytes, report->raw_bytes);
  EXPECT_TRUE(report->reason_for_anchor.empty());
  auto m = store.read_manifest("default", {"r1", 1});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->base_version, 0u);
  EXPECT_EQ(m->encoding, delta_encoding::xor_sparse);
  EXPECT_EQ(m->comp, compression::zstd);
  EXPECT_EQ(m->weight_map.size(), 1u);
  // Checksums cover every tensor of the result.
  EXPECT_EQ(m->checksums.size(), w.size());
}

TEST_F(publisher_test, anchors_every_k_versions) {
  publisher pub{store, [] {
                  publisher_options o;
                  o.anchor_every = 3;
                  return o;
                }()};
  std::mt19937_64 rng{7};
  tensor_set w = make_weights(3);
  std::vector<version_kind> kinds;
  for (uint64_t v = 0; v < 8; ++v) {
    if (v > 0)
      mutate_sparse(w, rng);
    auto report = pub.publish(req("r1", v), w);
    ASSERT_TRUE(report) << to_string(report.error());
    kinds.push_back(report->kind);
    if (v == 3 || v == 6) {
      EXPECT_NE(report->reason_for_anchor.find("anchor_every = 3"), std::string::npos)
        << report->reason_for_anchor;
    }
  }
  using enum version_kind;
  EXPECT_EQ(kinds, (std::vector{full, delta, delta, full, delta, delta, full, delta}));
  auto got = materialize(store, "default", {"r1", 7});
  ASSERT_TRUE(got) << to_string(got.error());
  EXPECT_TRUE(*got == w);
}

TEST_F(publisher_test, anchors_when_the_delta_is_not_smaller) {
  publisher pub{store};
  std::mt19937_64 rng{9};
  tensor_set w = make_weights(4);
  ASSERT_TRUE(pub.publish(req("r1", 0), w));
  randomize_all(w, rng);
  auto report = pub.publish(req("r1", 1), w);
  ASSERT_TRUE(report) << to_string(report.error());
  EXPECT_EQ(report->kind, version_kind::full);
  EXPECT_NE(report->reason_for_anchor.find("not smaller"), std::string::npos)
    << report->reason_for_anchor;
  // The next delta counts from the new anchor.
  w.at("model.norm.weight").bytes[0] ^= std::byte{1};
  auto next = pub.publish(req("r1", 2), w);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->kind, version_kind::delta);
  auto got = materialize(store, "default", {"r1", 2});
  ASSERT_TRUE(got) << to_string(got.error());
  EXPECT_TRUE(*got == w);
}

TEST_F(publisher_test, anchor_reasons) {
  publisher pub{store};
  tensor_set w = make_weights(5);
  auto first = pub.publish(req("r1", 0), w);
  ASSERT_TRUE(first);
  EXPECT_NE(first->reason_for_anchor.find("first version"), std::string::npos);

  auto forced_req = req("r1", 1);
  forced_req.force_anchor = true;
  auto forced = pub.publish(forced_req, w);
  ASSERT_TRUE(forced);
  EXPECT_EQ(forced->kind, version_kind::full);
  EXPECT_NE(forced->reason_for_anchor.find("requested"), std::string::npos);

  auto gap = pub.publish(req("r1", 5), w);
  ASSERT_TRUE(gap) << to_string(gap.error());
  EXPECT_EQ(gap->kind, version_kind::full);
  EXPECT_NE(gap->reason_for_anchor.find("previous version in memory is 1"), std::string::npos)
    << gap->reason_for_anchor;

  std::mt19937_64 rng{1};
  w.emplace("extra", make_tensor("extra", dtype::u8, {16}, rng));
  auto grown = pub.publish(req("r1", 6), w);
  ASSERT_TRUE(grown);
  EXPECT_EQ(grown->kind, version_kind::full);
  EXPECT_NE(grown->reason_for_anchor.find("'extra' was added"), std::string::npos)
    << grown->reason_for_anchor;

  w.at("extra").type = dtype::i8;
  auto retyped = pub.publish(req("r1", 7), w);
  ASSERT_TRUE(retyped);
  EXPECT_EQ(retyped->kind, version_kind::full);
  EXPECT_NE(retyped->reason_for_anchor.find("changed dtype"), std::string::npos);

  w.erase("extra");
  auto shrunk = pub.publish(req("r1", 8), w);
  ASSERT_TRUE(shrunk);
  EXPECT_EQ(shrunk->kind, version_kind::full);
  EXPECT_NE(shrunk->reason_for_anchor.find("'extra' was removed"), std::string::npos);
  auto got = materialize(store, "default", {"r1", 8});
  ASSERT_TRUE(got) << to_string(got.error());
  EXPECT_TRUE(*got == w);
}

TEST_F(publisher_test, empty_delta_has_no_shards) {
  publisher pub{store};
  tensor_set w = make_weights(6);
  ASSERT_TRUE(pub.publish(req("r1", 0), w));
  auto report = pub.publish(req("r1", 1), w);
  ASSERT_TRUE(report) << to_string(report.error());
  EXPECT_EQ(report->kind, version_kind::delta);
  EXPECT_TRUE(report->touched.empty());
  EXPECT_EQ(report->stored_bytes, 0u);
  auto m = store.read_manifest("default", {"r1", 1});
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->is_empty_delta());
  EXPECT_TRUE(m->shards.empty());
  EXPECT_TRUE(m->weight_map.empty());
  auto got = materialize(store, "default", {"r1", 1});
  ASSERT_TRUE(got) << to_string(got.error());
  EXPECT_TRUE(*got == w);
}

TEST_F(publisher_test, republishing_identical_content_is_idempotent) {
  publisher pub{store};
  tensor_set w = make_weights(7);
  ASSERT_TRUE(pub.publish(req("r1", 0), w));
  w.at("model.norm.weight").bytes[1] ^= std::byte{4};
  auto first = pub.publish(req("r1", 1), w);
  ASSERT_TRUE(first);
  EXPECT_FALSE(first->idempotent);
  auto manifest_before = store.read_manifest("default", {"r1", 1});
  ASSERT_TRUE(manifest_before);

  auto again = pub.publish(req("r1", 1), w);
  ASSERT_TRUE(again) << to_string(again.error());
  EXPECT_TRUE(again->idempotent);
  EXPECT_EQ(again->kind, version_kind::delta);
  ASSERT_TRUE(again->pointer);
  EXPECT_EQ(again->pointer->latest, (version_ref{"r1", 1}));

  // A restarted publisher (nothing in memory) retrying the same version.
  publisher restarted{store};
  auto retried = restarted.publish(req("r1", 1), w);
  ASSERT_TRUE(retried) << to_string(retried.error());
  EXPECT_TRUE(retried->idempotent);
  EXPECT_EQ(retried->kind, version_kind::delta);
  EXPECT_EQ(*store.read_manifest("default", {"r1", 1}), *manifest_before);

  // And it carries on from there.
  w.at("model.norm.weight").bytes[2] ^= std::byte{4};
  auto next = restarted.publish(req("r1", 2), w);
  ASSERT_TRUE(next) << to_string(next.error());
  auto got = materialize(store, "default", {"r1", 2});
  ASSERT_TRUE(got) << to_string(got.error());
  EXPECT_TRUE(*got == w);
}

TEST_F(publisher_test, republishing_different_content_is_version_exists) {
  publisher pub{store};
  tensor_set w = make_weights(8);
  ASSERT_TRUE(pub.publish(req("r1", 0), w));
  w.at("model.norm.weight").bytes[1] ^= std::byte{4};
  ASSERT_TRUE(pub.publish(req("r1", 1), w));
  w.at("model.norm.weight").bytes[5] ^= std::byte{4};
  auto clash = pub.publish(req("r1", 1), w);
  ASSERT_FALSE(clash);
  EXPECT_EQ(clash.error().code, errc::version_exists) << to_string(clash.error());

  publisher other{store};
  auto clash0 = other.publish(req("r1", 0), w);
  ASSERT_FALSE(clash0);
  EXPECT_EQ(clash0.error().code, errc::version_exists);
  auto pointer = store.read_pointer("default");
  ASSERT_TRUE(pointer && *pointer);
  EXPECT_EQ((*pointer)->latest, (version_ref{"r1", 1}));
}

TEST_F(publisher_test, resume_claims_at_a_higher_boot) {
  publisher pub{store};
  std::mt19937_64 rng{11};
  tensor_set w = make_weights(9);
  auto boot = pub.publish(req("resumed", 40), w);
  ASSERT_TRUE(boot) << to_string(boot.error());
  EXPECT_TRUE(boot->claimed);
  EXPECT_EQ(boot->kind, version_kind::full);
  EXPECT_EQ(boot->pointer->boot_version, 40u);
  mutate_sparse(w, rng);
  auto next = pub.publish(req("resumed", 41), w);
  ASSERT_TRUE(next) << to_string(next.error());
  EXPECT_EQ(next->kind, version_kind::delta);
  EXPECT_FALSE(next->claimed);
  EXPECT_EQ(next->pointer->boot_version, 40u);
  auto got = materialize(store, "default", {"resumed", 41});
  ASSERT_TRUE(got) << to_string(got.error());
  EXPECT_TRUE(*got == w);
}

TEST_F(publisher_test, run_switch_and_back) {
  publisher pub{store};
  std::mt19937_64 rng{12};
  tensor_set a = make_weights(10);
  tensor_set b = make_weights(11);
  for (uint64_t v = 0; v < 3; ++v) {
    if (v > 0)
      mutate_sparse(a, rng);
    ASSERT_TRUE(pub.publish(req("a", v), a));
  }
  auto switched = pub.publish(req("b", 0), b);
  ASSERT_TRUE(switched) << to_string(switched.error());
  EXPECT_TRUE(switched->claimed);
  EXPECT_EQ(switched->pointer->latest, (version_ref{"b", 0}));

  mutate_sparse(a, rng);
  a.at("model.norm.weight").bytes[0] ^= std::byte{1};
  auto back = pub.publish(req("a", 3), a);
  ASSERT_TRUE(back) << to_string(back.error());
  EXPECT_EQ(back->kind, version_kind::delta);
  EXPECT_FALSE(back->claimed);
  EXPECT_EQ(back->pointer->latest, (version_ref{"a", 3}));
  EXPECT_EQ(back->pointer->boot_version, 0u);

  auto got_a = materialize(store, "default", {"a", 3});
  ASSERT_TRUE(got_a) << to_string(got_a.error());
  EXPECT_TRUE(*got_a == a);
  auto got_b = materialize(store, "default", {"b", 0});
  ASSERT_TRUE(got_b) << to_string(got_b.error());
  EXPECT_TRUE(*got_b == b);

  // A new publisher switching back to a run claimed before at another boot.
  publisher fresh{store};
  auto again = fresh.publish(req("b", 5), b);
  ASSERT_TRUE(again) << to_string(again.error());
  EXPECT_EQ(again->pointer->latest, (version_ref{"b", 5}));
  EXPECT_EQ(again->pointer->boot_version, 0u);
}

TEST_F(publisher_test, pools_are_independent) {
  publisher pub{store};
  tensor_set w = make_weights(12);
  auto other_pool = req("r1", 0);
  other_pool.pool = "exp2";
  ASSERT_TRUE(pub.publish(req("r1", 0), w));
  auto report = pub.publish(other_pool, w);
  ASSERT_TRUE(report) << to_string(report.error());
  EXPECT_TRUE(report->claimed);
  EXPECT_EQ(pub.last_version("exp2", "r1"), 0u);
  EXPECT_EQ(pub.last_version("default", "r2"), std::nullopt);
}

TEST_F(publisher_test, dry_run_touches_nothing) {
  publisher pub{store};
  tensor_set w = make_weights(13);
  auto dry = req("r1", 0);
  dry.dry_run = true;
  auto report = pub.publish(dry, w);
  ASSERT_TRUE(report) << to_string(report.error());
  EXPECT_EQ(report->kind, version_kind::full);
  EXPECT_EQ(report->stored_bytes, report->raw_bytes) << "an anchor stores the weights as they are";
  EXPECT_EQ(report->published.tensor_specs.size(), w.size());
  EXPECT_FALSE(report->pointer);
  EXPECT_EQ(store.calls(), 0u);
  EXPECT_EQ(pub.last_version("default", "r1"), std::nullopt);

  ASSERT_TRUE(pub.publish(req("r1", 0), w));
  const size_t calls = store.calls();
  w.at("model.norm.weight").bytes[0] ^= std::byte{1};
  auto dry1 = req("r1", 1);
  dry1.dry_run = true;
  auto delta = pub.publish(dry1, w);
  ASSERT_TRUE(delta);
  EXPECT_EQ(delta->kind, version_kind::delta);
  EXPECT_EQ(delta->touched, std::vector<std::string>{"model.norm.weight"});
  EXPECT_EQ(store.calls(), calls);
  EXPECT_EQ(pub.last_version("default", "r1"), 0u);
}

TEST_F(publisher_test, multi_shard_versions) {
  publisher pub{store, [] {
                  publisher_options o;
                  o.max_shard_bytes = 4096;
                  return o;
                }()};
  std::mt19937_64 rng{14};
  tensor_set w = make_weights(14);
  auto first = pub.publish(req("r1", 0), w);
  ASSERT_TRUE(first) << to_string(first.error());
  EXPECT_GT(first->published.shards.size(), 2u);
  for (uint64_t v = 1; v < 4; ++v) {
    for (auto& [name, t] : w)
      if (!t.bytes.empty())
        t.bytes[rng() % t.bytes.size()] ^= std::byte{0x55};
    auto report = pub.publish(req("r1", v), w);
    ASSERT_TRUE(report) << to_string(report.error());
    EXPECT_EQ(report->kind, version_kind::delta);
  }
  auto got = materialize(store, "default", {"r1", 3});
  ASSERT_TRUE(got) << to_string(got.error());
  EXPECT_TRUE(*got == w);
}

TEST_F(publisher_test, refuses_bad_requests_and_tensors) {
  publisher pub{store};
  tensor_set w = make_weights(15);
  auto bad_run = pub.publish(req("no/slash", 0), w);
  ASSERT_FALSE(bad_run);
  EXPECT_EQ(bad_run.error().code, errc::invalid_argument);

  auto bad_pool_req = req("r1", 0);
  bad_pool_req.pool = "..";
  EXPECT_FALSE(pub.publish(bad_pool_req, w));

  EXPECT_FALSE(pub.publish(req("r1", 0), tensor_set{}));

  tensor_set short_bytes = w;
  short_bytes.at("model.norm.weight").bytes.pop_back();
  auto s = pub.publish(req("r1", 0), short_bytes);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("model.norm.weight"), std::string::npos);

  tensor_set hostile = w;
  std::mt19937_64 rng{1};
  auto h = make_tensor("../../etc/passwd", dtype::u8, {4}, rng);
  hostile.emplace(h.name, h);
  auto hr = pub.publish(req("r1", 0), hostile);
  ASSERT_FALSE(hr);
  EXPECT_EQ(hr.error().code, errc::invalid_argument);
  EXPECT_EQ(store.calls(), 0u);
}

TEST(fed_stream_test, reads_what_another_thread_pushes_across_tensor_boundaries) {
  std::vector<tensor_header> tensors{{"a", dtype::u8, {3}, 3}, {"b", dtype::u8, {4}, 4}};
  fed_stream stream{tensors, 2};
  std::vector<int> consumed;
  std::vector<std::byte> a(3);
  std::vector<std::byte> b(4);
  std::thread feeder{[&] {
    ASSERT_TRUE(stream.push({'1', '2'}, [&] { consumed.push_back(1); }));
    ASSERT_TRUE(stream.push({'3', '4', '5', '6', '7'}, [&] { consumed.push_back(2); }));
  }};
  ASSERT_TRUE(stream.read(0, 0, a));
  ASSERT_TRUE(stream.read(1, 0, b));
  feeder.join();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(a.data()), 3), "123");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data()), 4), "4567");
  EXPECT_EQ(consumed, (std::vector<int>{1, 2})) << "each piece reports once fully read";
  EXPECT_FALSE(stream.push({'x'}, {})) << "nothing past the declared total";
}

TEST(fed_stream_test, a_piece_reports_consumed_before_the_read_waits_for_the_next) {
  // A sender that sends each piece once the one before was consumed, and a
  // read that spans two pieces: the first must report before the read waits
  // for the second (it waited for ever).
  std::vector<tensor_header> tensors{{"a", dtype::u8, {6}, 6}};
  fed_stream stream{tensors, 1};
  std::promise<void> first_consumed;
  ASSERT_TRUE(stream.push({'1', '2', '3'}, [&] { first_consumed.set_value(); }));
  std::thread sender{[&] {
    first_consumed.get_future().wait();
    EXPECT_TRUE(stream.push({'4', '5', '6'}, {}));
  }};
  std::vector<std::byte> out(6);
  ASSERT_TRUE(stream.read(0, 0, out));
  sender.join();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(out.data()), 6), "123456");
}

TEST(fed_stream_test, bounds_waiting_pieces_and_fails_readers_when_closed) {
  std::vector<tensor_header> tensors{{"a", dtype::u8, {10}, 10}};
  fed_stream stream{tensors, 1};
  ASSERT_TRUE(stream.push({'1'}, {}));
  auto refused = stream.push({'2'}, {});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, errc::limit_exceeded);
  stream.close();
  std::vector<std::byte> out(10);
  auto truncated = stream.read(0, 0, out);
  ASSERT_FALSE(truncated);
  EXPECT_NE(truncated.error().message.find("1 of 10"), std::string::npos)
    << truncated.error().message;

  fed_stream aborted{tensors, 4};
  ASSERT_TRUE(aborted.push({'1', '2'}, {}));
  aborted.close(make_error(errc::invalid_argument, "aborted by the client"));
  auto failed = aborted.read(0, 0, out);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().message, "aborted by the client");
}

TEST(fed_stream_test, borrow_lends_the_pushed_bytes_where_they_lie_up_to_each_boundary) {
  std::vector<tensor_header> tensors{{"a", dtype::u8, {3}, 3}, {"b", dtype::u8, {5}, 5}};
  fed_stream stream{tensors, 4};
  auto first = std::make_shared<const std::vector<char>>(std::vector<char>{'1', '2', '3', '4'});
  auto second = std::make_shared<const std::vector<char>>(std::vector<char>{'5', '6', '7', '8'});
  std::vector<int> consumed;
  ASSERT_TRUE(stream.push(first, *first, [&] { consumed.push_back(1); }));
  ASSERT_TRUE(stream.push(second, *second, [&] { consumed.push_back(2); }));
  auto text = [](std::span<const std::byte> b) {
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  };
  // Tensor a ends inside the first piece: lent up to its end, no copy.
  auto a = stream.borrow(0, 0, 100);
  ASSERT_TRUE(a);
  EXPECT_EQ(text(a->bytes), "123");
  EXPECT_EQ(static_cast<const void*>(a->bytes.data()), static_cast<const void*>(first->data()));
  EXPECT_TRUE(consumed.empty());
  // Tensor b: the rest of the first piece, then (after `max`) the second.
  auto b1 = stream.borrow(1, 0, 100);
  ASSERT_TRUE(b1);
  EXPECT_EQ(text(b1->bytes), "4");
  EXPECT_EQ(consumed, std::vector<int>{1}) << "a piece lent to its end is consumed";
  auto b2 = stream.borrow(1, 1, 2);
  ASSERT_TRUE(b2);
  EXPECT_EQ(text(b2->bytes), "56");
  // Reads and borrows mix, in order.
  std::vector<std::byte> rest(2);
  ASSERT_TRUE(stream.read(1, 3, rest));
  EXPECT_EQ(text(rest), "78");
  EXPECT_EQ(consumed, (std::vector<int>{1, 2}));
  // What was lent stays valid while held, whoever else lets go.
  first.reset();
  EXPECT_EQ(text(a->bytes), "123");
  EXPECT_FALSE(stream.borrow(1, 0, 1)) << "out of order";
  EXPECT_FALSE(stream.borrow(0, 3, 1)) << "past the tensor";

  fed_stream aborted{tensors, 4};
  aborted.close(make_error(errc::invalid_argument, "aborted by the client"));
  auto failed = aborted.borrow(0, 0, 3);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().message, "aborted by the client");
}

// A publish from pieces lent where they lie (the HTTP publish's path) stores
// exactly what a publish of the same tensors from memory stores, anchors
// and deltas, whatever the pieces' sizes.
TEST_F(publisher_test, a_publish_from_lent_pieces_equals_one_from_memory) {
  memory_store fed_store;
  publisher from_memory{store};
  publisher_options small_chunks;
  small_chunks.chunk_bytes = 4096;
  publisher from_pieces{fed_store, small_chunks};
  std::mt19937_64 rng{17};
  tensor_set w = make_weights(9);
  for (uint64_t v = 0; v < 4; ++v) {
    if (v > 0)
      mutate_sparse(w, rng);
    auto a = from_memory.publish(req("r", v), w);
    ASSERT_TRUE(a) << to_string(a.error());
    std::vector<tensor_header> headers;
    std::string all;
    for (const auto& [name, t] : w) {
      headers.push_back({name, t.type, t.shape, t.bytes.size()});
      all.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
    }
    fed_stream stream{headers, 64};
    std::thread feeder{[&] {
      // Pieces of 1000 bytes: they straddle tensors and chunks.
      for (size_t at = 0; at < all.size(); at += 1000) {
        auto piece = std::make_shared<const std::string>(all.substr(at, 1000));
        ASSERT_TRUE(stream.push(piece, std::span<const char>{*piece}, {}));
      }
    }};
    auto b = from_pieces.publish(req("r", v), stream);
    feeder.join();
    ASSERT_TRUE(b) << to_string(b.error());
    EXPECT_EQ(a->kind, b->kind) << "version " << v;
    EXPECT_EQ(a->published.checksums, b->published.checksums);
    auto x = materialize(store, "default", {"r", v});
    auto y = materialize(fed_store, "default", {"r", v});
    ASSERT_TRUE(x && y);
    EXPECT_TRUE(*x == *y) << "version " << v;
  }
}

TEST(delta_frame_test, prefix_is_little_endian_length) {
  std::vector<std::byte> payload(300, std::byte{7});
  auto frame = encode_delta_frame(payload);
  ASSERT_EQ(frame.size(), 308u);
  EXPECT_EQ(frame[0], std::byte{0x2c});
  EXPECT_EQ(frame[1], std::byte{0x01});
  for (size_t i = 2; i < 8; ++i)
    EXPECT_EQ(frame[i], std::byte{0});
}

} // namespace

namespace {

using stitch::testing::temp_dir;

/// Large enough that a 4 KiB chunk streams it in many pieces.
tensor_set bigger_weights(uint64_t seed) {
  std::mt19937_64 rng{seed};
  tensor_set w;
  auto add = [&](host_tensor t) { w.emplace(t.name, std::move(t)); };
  add(make_tensor("a.weight", dtype::f32, {64, 100}, rng));
  add(make_tensor("b.weight", dtype::bf16, {77, 33}, rng));
  add(make_tensor("c.bias", dtype::f32, {13}, rng));
  add(make_tensor("empty", dtype::f32, {0}, rng));
  return w;
}

/// Publishes the same versions through a publisher whose remembered copies
/// live in memory and one whose limit forces scratch files, small chunks and
/// a delta that does not pay off; every stored version must be identical.
TEST(publisher_bounded_memory, scratch_copies_give_the_same_versions_as_memory) {
  memory_store in_memory;
  memory_store on_disk;
  publisher_options small;
  small.memory_limit = 1024; // smaller than any model here
  small.chunk_bytes = 4096;
  temp_dir scratch;
  small.scratch_dir = scratch.path();
  publisher roomy{in_memory};
  publisher bounded{on_disk, small};
  std::mt19937_64 rng{5};
  tensor_set w = bigger_weights(3);
  for (uint64_t v = 0; v < 8; ++v) {
    if (v == 5)
      randomize_all(w, rng); // a delta as large as the weights: stored as an anchor
    else if (v > 0)
      mutate_sparse(w, rng);
    auto a = roomy.publish(req("r", v), w);
    auto b = bounded.publish(req("r", v), w);
    ASSERT_TRUE(a) << to_string(a.error());
    ASSERT_TRUE(b) << to_string(b.error());
    EXPECT_EQ(a->kind, b->kind) << "version " << v;
    EXPECT_EQ(a->published.checksums, b->published.checksums);
    EXPECT_EQ(a->touched, b->touched);
  }
  EXPECT_EQ(bounded.memory_in_use(), 0u) << "nothing of the bounded publisher's copy is in memory";
  EXPECT_GT(roomy.memory_in_use(), 0u);
  for (uint64_t v = 0; v < 8; ++v) {
    auto a = materialize(in_memory, "default", {"r", v});
    auto b = materialize(on_disk, "default", {"r", v});
    ASSERT_TRUE(a && b);
    EXPECT_TRUE(*a == *b) << "version " << v;
  }
  // The scratch file is unlinked: nothing is left in the directory.
  EXPECT_TRUE(std::filesystem::is_empty(scratch.path()));
}

/// A tensor's delta is one zstd frame per chunk, compressed on two threads
/// and appended in order: unchanged chunks before, between and after the
/// changed ones, in several tensors, must come back byte for byte, and the
/// delta must stay small.
TEST(publisher_delta_frames, chunks_compressed_in_parallel_rebuild_the_exact_bytes) {
  memory_store store;
  publisher_options opts;
  opts.chunk_bytes = 4096;
  publisher pub{store, opts};
  std::mt19937_64 rng{17};
  tensor_set w;
  for (int k = 0; k < 3; ++k) {
    auto t = make_tensor("layer." + std::to_string(k) + ".weight", dtype::f32, {16, 1024}, rng);
    w.emplace(t.name, std::move(t));
  }
  ASSERT_TRUE(pub.publish(req("r", 0), w));
  for (uint64_t v = 1; v <= 4; ++v) {
    for (auto& [name, t] : w)
      for (size_t chunk : {size_t{5}, size_t{6}, size_t{12}})
        if ((chunk + v) % 2 == 0 || name == "layer.1.weight")
          t.bytes[chunk * 4096 + rng() % 4096] ^= std::byte{0x24};
    auto report = pub.publish(req("r", v), w);
    ASSERT_TRUE(report) << to_string(report.error());
    EXPECT_EQ(report->kind, version_kind::delta) << report->reason_for_anchor;
    EXPECT_LT(report->stored_bytes, report->raw_bytes / 20) << "version " << v;
    auto got = materialize(store, "default", {"r", v});
    ASSERT_TRUE(got) << to_string(got.error());
    EXPECT_TRUE(*got == w) << "version " << v;
  }
}

TEST(publisher_bounded_memory, the_memory_limit_spans_runs) {
  memory_store store;
  publisher_options opts;
  tensor_set w = bigger_weights(4);
  uint64_t model = 0;
  for (const auto& [n, t] : w)
    model += t.bytes.size();
  opts.memory_limit = model + model / 2; // room for one run's copy, not two
  temp_dir scratch;
  opts.scratch_dir = scratch.path();
  publisher pub{store, opts};
  ASSERT_TRUE(pub.publish(req("one", 0), w));
  EXPECT_EQ(pub.memory_in_use(), model);
  auto other = req("two", 0);
  other.pool = "other";
  ASSERT_TRUE(pub.publish(other, w));
  EXPECT_EQ(pub.memory_in_use(), model) << "the second run's copy went to a scratch file";
  // Both still publish deltas.
  std::mt19937_64 rng{1};
  mutate_sparse(w, rng);
  w.at("a.weight").bytes[0] ^= std::byte{1};
  auto d1 = pub.publish(req("one", 1), w);
  other.version = 1;
  auto d2 = pub.publish(other, w);
  ASSERT_TRUE(d1 && d2);
  EXPECT_EQ(d1->kind, version_kind::delta);
  EXPECT_EQ(d2->kind, version_kind::delta);
}

TEST(publisher_bounded_memory, a_failed_delta_forgets_the_half_rewritten_copy) {
  memory_store store;
  publisher pub{store};
  tensor_set w = bigger_weights(6);
  ASSERT_TRUE(pub.publish(req("r", 0), w));
  // The source fails half way through version 1.
  struct failing final : tensor_stream {
    explicit failing(const tensor_set& w) : inner(w) {}
    const std::vector<tensor_header>& tensors() const override { return inner.tensors(); }
    status read(size_t i, uint64_t off, std::span<std::byte> out) override {
      if (i == 1)
        return make_error(errc::backend_failure, "the disk went away");
      return inner.read(i, off, out);
    }
    memory_stream inner;
  };
  w.at("a.weight").bytes[3] ^= std::byte{8};
  failing source{w};
  auto broken = pub.publish(req("r", 1), source);
  ASSERT_FALSE(broken);
  EXPECT_EQ(pub.last_version("default", "r"), std::nullopt)
    << "the remembered copy was being rewritten: it is not trusted any more";
  auto next = pub.publish(req("r", 1), w);
  ASSERT_TRUE(next) << to_string(next.error());
  EXPECT_EQ(next->kind, version_kind::full) << next->reason_for_anchor;
  auto got = materialize(store, "default", {"r", 1});
  ASSERT_TRUE(got);
  EXPECT_TRUE(*got == w);
}

} // namespace

TEST_F(publisher_test, a_checkpoints_files_travel_with_every_version_and_export) {
  temp_dir dir;
  const std::string config = R"({"model_type": "llama", "rope_theta": 500000.0})";
  const std::string tokenizer(70'000, 't');
  tensor_set w = make_weights(21);
  // From a checkpoint directory: its non-tensor files come along, hidden
  // ones and the index stay behind.
  ASSERT_TRUE(write_hf_directory(dir.path() / "ckpt", w, default_max_shard_bytes,
                                 {{"config.json", config}, {"tokenizer.json", tokenizer}}));
  for (const char* skipped : {".DS_Store", "pytorch_model.bin", "optimizer.pt"}) {
    std::FILE* f = std::fopen((dir.path() / "ckpt" / skipped).c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  publisher pub{store};
  auto source = directory_stream::open(dir.path() / "ckpt");
  ASSERT_TRUE(source) << to_string(source.error());
  EXPECT_EQ((*source)->files().size(), 2u);
  auto first = pub.publish(req("r1", 0), **source);
  ASSERT_TRUE(first) << to_string(first.error());
  auto m0 = store.read_manifest("default", {"r1", 0});
  ASSERT_TRUE(m0);
  ASSERT_EQ(m0->files.size(), 2u);
  EXPECT_EQ(m0->files.at("config.json").size, config.size());
  auto got = read_version_file(store, "default", *m0, "tokenizer.json");
  ASSERT_TRUE(got) << to_string(got.error());
  EXPECT_EQ(*got, tokenizer);

  // A delta from memory with the request's files keeps them too.
  w.at("model.norm.weight").bytes[0] ^= std::byte{1};
  auto r1 = req("r1", 1);
  r1.files = {{"config.json", config}};
  auto second = pub.publish(r1, w);
  ASSERT_TRUE(second) << to_string(second.error());
  EXPECT_EQ(second->kind, version_kind::delta);
  auto m1 = store.read_manifest("default", {"r1", 1});
  ASSERT_TRUE(m1);
  EXPECT_EQ(m1->files.size(), 1u);
  // Re-publishing with the same files is idempotent; with other files it is
  // another content.
  auto same = pub.publish(r1, w);
  ASSERT_TRUE(same) << to_string(same.error());
  EXPECT_TRUE(same->idempotent);
  auto changed = r1;
  changed.files["config.json"] = R"({"model_type": "llama"})";
  auto clash = pub.publish(changed, w);
  ASSERT_FALSE(clash);
  EXPECT_EQ(clash.error().code, errc::version_exists);

  // Export writes them next to the shards, byte for byte.
  ASSERT_TRUE(export_version(store, "default", {"r1", 0}, dir.path() / "out0"));
  auto files0 = read_checkpoint_files(dir.path() / "out0");
  ASSERT_TRUE(files0) << to_string(files0.error());
  EXPECT_EQ(*files0, (std::map<std::string, std::string>{{"config.json", config},
                                                         {"tokenizer.json", tokenizer}}));
  ASSERT_TRUE(export_version(store, "default", {"r1", 1}, dir.path() / "out1"));
  auto files1 = read_checkpoint_files(dir.path() / "out1");
  ASSERT_TRUE(files1);
  EXPECT_EQ(files1->size(), 1u);
  // Re-exporting over an export with the same files replaces it.
  EXPECT_TRUE(export_version(store, "default", {"r1", 0}, dir.path() / "out0"));
}

TEST_F(publisher_test, checkpoint_files_that_cannot_be_kept_are_refused_by_name) {
  temp_dir dir;
  tensor_set w = make_weights(22);
  ASSERT_TRUE(write_hf_directory(dir.path() / "ckpt", w));
  {
    std::FILE* f = std::fopen((dir.path() / "ckpt" / "notes for me.txt").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  auto source = directory_stream::open(dir.path() / "ckpt");
  ASSERT_FALSE(source);
  EXPECT_EQ(source.error().code, errc::invalid_argument);
  EXPECT_NE(source.error().message.find("notes for me.txt"), std::string::npos)
    << source.error().message;

  publisher pub{store};
  auto r = req("r1", 0);
  r.files = {{"big.bin", std::string(max_version_file_bytes + 1, 'x')}};
  auto big = pub.publish(r, w);
  ASSERT_FALSE(big);
  EXPECT_EQ(big.error().code, errc::invalid_argument);
  r.files = {{"../escape", "x"}};
  EXPECT_FALSE(pub.publish(r, w));
  EXPECT_FALSE(store.read_manifest("default", {"r1", 0}));
}
