// The S3 store against a real S3-protocol server. Start one with
//   export STITCH_S3_ENDPOINT=$(scripts/s3-test-server.sh start)
// (s3rver: it accepts the credentials S3RVER/S3RVER, ignores signatures and
// conditional writes). Without STITCH_S3_ENDPOINT every test is skipped.
// What every backend shares is tested by store_backend_test.cpp, which runs
// this backend too; here is what is S3's own: the object layout, multipart
// uploads, leftovers after failures, the pointer object's text.

#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "runtime/store/s3_store.hpp"
#include "runtime/store/version_layout.hpp"
#include "store_fixtures.hpp"

namespace stitch {
namespace {

using namespace stitch::testing;
using transport::s3_client;
using transport::s3_config;

constexpr std::string_view bucket = "stitch-test";

s3_config test_config(const char* endpoint) {
  s3_config c;
  c.endpoint = endpoint;
  c.region = "us-east-1";
  c.credentials = {"S3RVER", "S3RVER", ""};
  c.max_attempts = 2;
  return c;
}

class s3_store_test : public ::testing::Test {
protected:
  void SetUp() override {
    const char* endpoint = std::getenv("STITCH_S3_ENDPOINT");
    if (!endpoint || !*endpoint)
      GTEST_SKIP() << "STITCH_S3_ENDPOINT is not set; start a server with "
                      "`export STITCH_S3_ENDPOINT=$(scripts/s3-test-server.sh start)`";
    config = test_config(endpoint);
    auto c = s3_client::open(config);
    ASSERT_TRUE(c) << to_string(c.error());
    raw = std::move(*c);
    auto made = raw->create_bucket(bucket);
    ASSERT_TRUE(made) << to_string(made.error());
    // Each test in its own prefix, so tests neither see nor disturb each other.
    std::mt19937_64 rng{std::random_device{}()};
    prefix = std::string{::testing::UnitTest::GetInstance()->current_test_info()->name()} + "-"
             + std::to_string(rng() % 1'000'000'000);
    auto opened =
      store::open_s3_store("s3://" + std::string{bucket} + "/" + prefix, store::s3_options{config});
    ASSERT_TRUE(opened) << to_string(opened.error());
    s3 = std::move(*opened);
  }

  std::string key(std::string_view rest) const { return prefix + "/" + std::string{rest}; }

  std::vector<std::string> keys_under(std::string_view rest) {
    std::vector<std::string> out;
    auto page = raw->list_objects_v2(bucket, key(rest));
    EXPECT_TRUE(page);
    if (page)
      for (const auto& o : page->objects)
        out.push_back(o.key);
    return out;
  }

  weights base_weights() {
    return {{"a", random_bytes(1000, 1)}, {"b", random_bytes(5000, 2)}, {"c", random_bytes(64, 3)}};
  }

  void publish_anchor(const std::string& run, uint64_t v, const weights& w) {
    auto version = full_version(run, v, w);
    auto ok = put(*s3, pool, version);
    ASSERT_TRUE(ok) << to_string(ok.error());
    auto claimed = s3->claim(pool, version.m.ref);
    ASSERT_TRUE(claimed) << to_string(claimed.error());
  }

  status publish_delta(const std::string& run, uint64_t v, const weights& before,
                       const weights& after) {
    auto version = delta_version(run, v, before, after);
    if (auto ok = put(*s3, pool, version); !ok)
      return ok;
    auto current = s3->read_pointer(pool);
    if (!current)
      return std::move(current).error();
    std::optional<version_ref> expected;
    if (*current)
      expected = (*current)->latest;
    auto moved = s3->compare_and_advance_pointer(pool, expected, version.m.ref);
    if (!moved)
      return std::move(moved).error();
    return {};
  }

  s3_config config;
  std::unique_ptr<s3_client> raw;
  std::string prefix;
  std::unique_ptr<store_backend> s3;
  const std::string pool = "default";
};

TEST_F(s3_store_test, round_trip_writes_a_plain_hf_directory_with_multipart_shards) {
  // "big" makes its shard three pieces: a multipart upload of 8 MiB parts.
  weights w{{"big", random_bytes(store::piece_size * 2 + 12345, 7)},
            {"small", random_bytes(17, 8)},
            {"empty", {}},
            {"model.layers.0.mlp.up_proj.weight", random_bytes(4096, 9)}};
  auto version = full_version("r", 0, w, 2);
  auto ok = put(*s3, pool, version);
  ASSERT_TRUE(ok) << to_string(ok.error());
  auto claimed = s3->claim(pool, version.m.ref);
  ASSERT_TRUE(claimed) << to_string(claimed.error());
  EXPECT_EQ(*claimed, (pointer_record{{"r", 0}, 0}));

  auto m = s3->read_manifest(pool, {"r", 0});
  ASSERT_TRUE(m) << to_string(m.error());
  EXPECT_EQ(*m, version.m);
  for (const auto& [name, bytes] : w) {
    auto got = read_tensor(*s3, pool, {"r", 0}, name, bytes.size());
    ASSERT_TRUE(got) << name << ": " << to_string(got.error());
    EXPECT_EQ(*got, bytes) << name;
  }
  std::vector<std::byte> part(1000);
  ASSERT_TRUE(s3->read_range(pool, {"r", 0}, "big", store::piece_size - 500, part));
  EXPECT_TRUE(std::equal(part.begin(), part.end(), w["big"].begin() + store::piece_size - 500));

  // Any S3 tool sees DESIGN §4's layout: the pointer, the index, the shards as they were.
  auto latest = raw->get_object(bucket, key("default/latest"));
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->body, "r/weight_v000000\n");
  auto index =
    raw->get_object(bucket, key("default/r/weight_v000000/model.safetensors.index.json"));
  ASSERT_TRUE(index);
  EXPECT_EQ(index->body, to_json(version.m));
  for (const auto& [name, bytes] : version.shards) {
    auto shard = raw->get_object(bucket, key("default/r/weight_v000000/" + name), 64 << 20);
    ASSERT_TRUE(shard) << name;
    ASSERT_EQ(shard->body.size(), bytes.size()) << name;
    EXPECT_EQ(0, std::memcmp(shard->body.data(), bytes.data(), bytes.size())) << name;
  }
  auto big_shard = version.m.weight_map.at("big");
  auto head = raw->head_object(bucket, key("default/r/weight_v000000/" + big_shard));
  ASSERT_TRUE(head);
  EXPECT_GT(head->size, 2 * store::piece_size);
  EXPECT_TRUE(raw->head_object(bucket, key("default/r/boot")));
}

TEST_F(s3_store_test, unpublished_version_may_be_stored_again_with_other_content) {
  auto w = base_weights();
  publish_anchor("r", 0, w);
  auto first = w;
  first["a"][0] ^= std::byte{1};
  ASSERT_TRUE(put(*s3, pool, delta_version("r", 1, w, first)));
  auto second = w;
  second["b"][0] ^= std::byte{1};
  auto again = put(*s3, pool, delta_version("r", 1, w, second));
  ASSERT_TRUE(again) << to_string(again.error());
  ASSERT_TRUE(s3->compare_and_advance_pointer(pool, version_ref{"r", 0}, {"r", 1}));
  EXPECT_EQ(s3->read_manifest(pool, {"r", 1})->touched, std::vector<std::string>{"b"});
}

TEST_F(s3_store_test, truncated_shard_is_refused_and_leaves_nothing_behind) {
  auto version = full_version("r", 0, base_weights());
  auto broken = version;
  broken.shards[0].second.resize(broken.shards[0].second.size() - 10);
  auto ok = put(*s3, pool, broken);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error().code, errc::invalid_format);
  EXPECT_NE(ok.error().message.find("model-00001-of-00001.safetensors"), std::string::npos)
    << ok.error().message;
  EXPECT_FALSE(s3->claim(pool, {"r", 0}));
  EXPECT_TRUE(keys_under("default/r/").empty());
  ASSERT_TRUE(put(*s3, pool, version));
  ASSERT_TRUE(s3->claim(pool, {"r", 0}));
}

TEST_F(s3_store_test, truncated_multipart_shard_is_aborted_and_leaves_nothing_behind) {
  weights w{{"big", random_bytes(store::piece_size + 4096, 11)}, {"small", random_bytes(100, 12)}};
  auto version = full_version("r", 0, w);
  // The source ends one piece in: the multipart upload must be aborted.
  version.shards[0].second.resize(store::piece_size + 100);
  auto ok = put(*s3, pool, version);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error().code, errc::invalid_format) << ok.error().message;
  EXPECT_TRUE(keys_under("default/r/").empty());
  EXPECT_TRUE(s3->list_versions(pool, "r")->empty());
}

TEST_F(s3_store_test, garbage_pointer_is_corrupt_data_naming_the_text) {
  ASSERT_TRUE(raw->put_object(bucket, key("default/latest"), "not a version\x01"));
  auto p = s3->read_pointer(pool);
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, errc::corrupt_data);
  EXPECT_NE(p.error().message.find("'not a version\\x01'"), std::string::npos) << p.error().message;
  auto moved = s3->compare_and_advance_pointer(pool, std::nullopt, {"r", 0});
  ASSERT_FALSE(moved);
  EXPECT_EQ(moved.error().code, errc::corrupt_data);

  ASSERT_TRUE(raw->put_object(bucket, key("default/latest"), std::string(10'000, 'x')));
  auto huge = s3->read_pointer(pool);
  ASSERT_FALSE(huge);
  EXPECT_EQ(huge.error().code, errc::corrupt_data);

  // A pointer naming a run without a boot record is corrupt as well.
  ASSERT_TRUE(raw->put_object(bucket, key("default/latest"), "r/weight_v000003"));
  auto orphan = s3->read_pointer(pool);
  ASSERT_FALSE(orphan);
  EXPECT_EQ(orphan.error().code, errc::corrupt_data);
}

TEST_F(s3_store_test, retention_keeps_newest_their_anchors_the_pointer_and_the_boot) {
  auto w = base_weights();
  publish_anchor("r", 0, w);
  for (uint64_t v = 1; v <= 9; ++v) {
    auto next = w;
    next["a"][v] ^= std::byte{1};
    if (v == 5) {
      auto anchor = full_version("r", 5, next);
      ASSERT_TRUE(put(*s3, pool, anchor));
      ASSERT_TRUE(s3->compare_and_advance_pointer(pool, version_ref{"r", 4}, {"r", 5}));
    } else {
      ASSERT_TRUE(publish_delta("r", v, w, next));
    }
    w = next;
  }
  auto report = s3->retain(pool, {2, {}, false, {}});
  ASSERT_TRUE(report) << to_string(report.error());
  std::vector<version_ref> deleted{{"r", 1}, {"r", 2}, {"r", 3}, {"r", 4}};
  EXPECT_EQ(refs_of(report->deleted), deleted);
  std::vector<version_ref> left{{"r", 0}, {"r", 5}, {"r", 6}, {"r", 7}, {"r", 8}, {"r", 9}};
  EXPECT_EQ(*s3->list_versions(pool, "r"), left);
  EXPECT_EQ(refs_of(report->kept), left);
  EXPECT_FALSE(s3->read_manifest(pool, {"r", 3}));
  std::vector<std::byte> buf(4);
  EXPECT_FALSE(s3->read_range(pool, {"r", 3}, "a", 0, buf));
  EXPECT_TRUE(s3->read_range(pool, {"r", 6}, "a", 0, buf));
  // Every object of a removed version is gone; the boot and the pointer stay.
  EXPECT_TRUE(keys_under("default/r/weight_v000003/").empty());
  EXPECT_TRUE(raw->head_object(bucket, key("default/r/boot")));
  EXPECT_EQ((*s3->read_pointer(pool))->latest, (version_ref{"r", 9}));
  // Retention again changes nothing.
  auto again = s3->retain(pool, {2, {}, false, {}});
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->deleted.empty());
}

TEST_F(s3_store_test, open_refuses_bad_uris_and_missing_buckets) {
  auto bad = store::open_s3_store("s3://Bad_Bucket/x", store::s3_options{config});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, errc::invalid_argument);
  auto missing = store::open_s3_store("s3://no-such-bucket-stitch/x", store::s3_options{config});
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, errc::not_found);
  EXPECT_NE(missing.error().message.find("no-such-bucket-stitch"), std::string::npos);
}

TEST_F(s3_store_test, client_operations_map_errors) {
  auto missing = raw->get_object(bucket, key("nothing-here"));
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, errc::not_found);
  EXPECT_EQ(raw->head_object(bucket, key("nothing-here")).error().code, errc::not_found);
  EXPECT_TRUE(raw->delete_object(bucket, key("nothing-here")));
  ASSERT_TRUE(raw->put_object(bucket, key("obj"), "0123456789"));
  auto range = raw->get_object_range(bucket, key("obj"), 2, 5);
  ASSERT_TRUE(range) << to_string(range.error());
  EXPECT_EQ(*range, "23456");
  auto limited = raw->get_object(bucket, key("obj"), 4);
  ASSERT_FALSE(limited);
  EXPECT_EQ(limited.error().code, errc::limit_exceeded);
  // Keys with spaces and unicode survive path encoding and listing.
  ASSERT_TRUE(raw->put_object(bucket, key("dir/a b+c\xc3\xa9"), "x"));
  auto page = raw->list_objects_v2(bucket, key("dir/"));
  ASSERT_TRUE(page);
  ASSERT_EQ(page->objects.size(), 1u);
  EXPECT_EQ(page->objects[0].key, key("dir/a b+c\xc3\xa9"));
  // Continuation tokens walk a listing page by page.
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(raw->put_object(bucket, key("many/" + std::to_string(i)), "x"));
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    auto p = raw->list_objects_v2(bucket, key("many/"), {}, token, 2);
    ASSERT_TRUE(p) << to_string(p.error());
    for (const auto& o : p->objects)
      seen.push_back(o.key);
    token = p->truncated ? p->next_continuation_token : std::string{};
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_EQ(pages, 3);
}

} // namespace
} // namespace stitch
