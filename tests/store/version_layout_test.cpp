// The msgpack records a backend persists: a version's layout and a pool's
// pointer round-trip, and garbage is `corrupt_data` with a message, never a
// crash or an allocation the size of a forged length.
#include "runtime/store/version_layout.hpp"

#include <gtest/gtest.h>

#include <string>

namespace stitch::store {
namespace {

version_layout two_shards() {
  version_layout l;
  l.location = "run/weight_v000003";
  l.shards = {"model-00001.safetensors", "model-00002.safetensors"};
  l.shard_sizes = {4096, 100};
  l.tensors["a.weight"] = {0, 0, 2048};
  l.tensors["b.weight"] = {0, 2048, 2048};
  l.tensors["c"] = {1, 10, 90};
  return l;
}

TEST(version_layout_record, round_trips) {
  auto l = two_shards();
  auto back = decode_layout(encode_layout(l));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, l);
  pointer_record p{{"run", 7}, 3};
  auto q = decode_pointer(encode_pointer(p));
  ASSERT_TRUE(q) << q.error().message;
  EXPECT_EQ(*q, p);
}

TEST(version_layout_record, a_forged_container_length_is_refused_before_allocating_for_it) {
  // Found by fuzz_records: an array/map header claiming 2^16..2^32 elements
  // in a record of a few dozen bytes made msgpack allocate 64 GiB.
  const unsigned char found[] = {
    0x97, 0x91, 0xb7, 0x6d, 0x6f, 0x64, 0x65, 0x6c, 0x2d, 0x30, 0x30, 0x67, 0x68, 0x74, 0xa8,
    0x62, 0x2e, 0x77, 0x65, 0x69, 0x24, 0x67, 0x68, 0x74, 0x92, 0xde, 0xdd, 0x92, 0x00, 0xcd,
    0x08, 0x00, 0x92, 0xcd, 0x08, 0x00, 0xcd, 0x08, 0x00, 0xb2, 0x72, 0x75, 0x6e, 0x2f, 0x77,
    0x65, 0x69, 0x67, 0x68, 0x74, 0x5f, 0x76, 0x30, 0x30, 0x30, 0x30, 0x30, 0x33};
  std::string bytes(reinterpret_cast<const char*>(found), sizeof found);
  auto l = decode_layout(bytes);
  ASSERT_FALSE(l);
  EXPECT_EQ(l.error().code, errc::corrupt_data);
  // Refused by the size limit (not by a failed 64 GiB allocation).
  EXPECT_NE(l.error().message.find("layout record is corrupt: array size overflow"),
            std::string::npos)
    << l.error().message;
  // An array32 header claiming 4 billion elements.
  std::string huge = "\xdd\xff\xff\xff\xf0";
  auto p = decode_pointer(huge);
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, errc::corrupt_data);
  EXPECT_NE(p.error().message.find("array size overflow"), std::string::npos) << p.error().message;
}

TEST(version_layout_record, inconsistent_or_out_of_bounds_records_are_corrupt) {
  auto l = two_shards();
  l.tensors["c"] = {1, 50, 90}; // past the end of shard 2
  auto bad = decode_layout(encode_layout(l));
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, errc::corrupt_data);
  auto boot_above = decode_pointer(encode_pointer(pointer_record{{"run", 2}, 5}));
  ASSERT_FALSE(boot_above);
  EXPECT_NE(boot_above.error().message.find("boot above latest"), std::string::npos);
  EXPECT_FALSE(decode_pointer(std::string{}));
  EXPECT_FALSE(decode_layout("not msgpack at all"));
}

} // namespace
} // namespace stitch::store
