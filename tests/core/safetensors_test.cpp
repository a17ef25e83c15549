#include "runtime/core/safetensors.hpp"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace st = stitch::safetensors;
using stitch::errc;
using testing::HasSubstr;

namespace {

std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng{seed};
  std::vector<std::byte> out(n);
  for (auto& b : out)
    b = static_cast<std::byte>(rng());
  return out;
}

/// A file with the given raw header (unpadded) and `data_bytes` zero bytes.
std::vector<std::byte> file_with_header(std::string_view header, size_t data_bytes = 0) {
  std::vector<std::byte> out(8 + header.size() + data_bytes);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<std::byte>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::vector<std::byte> size_prefix(uint64_t n) {
  std::vector<std::byte> out(8);
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<std::byte>(n >> (8 * i));
  return out;
}

/// Parses `header` with `data_bytes` of data and expects an invalid_format
/// error whose message contains `needle`.
void expect_format_error(std::string_view header, size_t data_bytes, std::string_view needle) {
  auto file = file_with_header(header, data_bytes);
  auto parsed = st::parse(file);
  ASSERT_FALSE(parsed) << "parsed: " << header;
  EXPECT_EQ(parsed.error().code, errc::invalid_format);
  EXPECT_THAT(parsed.error().message, HasSubstr(std::string{needle})) << header;
}

} // namespace

TEST(safetensors_dtype, names_round_trip_and_unknown_names_fail) {
  for (auto type : st::all_dtypes) {
    auto parsed = st::parse_dtype(st::to_string(type));
    ASSERT_TRUE(parsed) << st::to_string(type);
    EXPECT_EQ(*parsed, type);
  }
  EXPECT_EQ(st::all_dtypes.size(), 20u);
  EXPECT_EQ(st::to_string(st::dtype::bf16), "BF16");
  EXPECT_EQ(st::to_string(st::dtype::f8_e8m0), "F8_E8M0");
  EXPECT_EQ(st::to_string(st::dtype::f6_e2m3), "F6_E2M3");
  EXPECT_FALSE(st::parse_dtype("bf16"));
  EXPECT_FALSE(st::parse_dtype("F128"));
  EXPECT_FALSE(st::parse_dtype(""));
}

TEST(safetensors_dtype, byte_lengths_including_sub_byte_types) {
  const std::vector<uint64_t> shape{3, 5};
  EXPECT_EQ(*st::byte_length(st::dtype::bool_, shape), 15u);
  EXPECT_EQ(*st::byte_length(st::dtype::bf16, shape), 30u);
  EXPECT_EQ(*st::byte_length(st::dtype::c64, shape), 120u);
  EXPECT_EQ(*st::byte_length(st::dtype::f64, shape), 120u);
  EXPECT_EQ(*st::byte_length(st::dtype::f4, shape), 8u);       // 60 bits
  EXPECT_EQ(*st::byte_length(st::dtype::f6_e3m2, shape), 12u); // 90 bits -> 11.25
  EXPECT_EQ(*st::byte_length(st::dtype::f6_e2m3, std::vector<uint64_t>{4}), 3u);
  EXPECT_EQ(*st::byte_length(st::dtype::u8, std::vector<uint64_t>{}), 1u); // a scalar
  EXPECT_EQ(*st::byte_length(st::dtype::f32, std::vector<uint64_t>{0, 7}), 0u);
}

TEST(safetensors_dtype, numel_and_byte_overflow_are_errors) {
  auto numel = st::byte_length(st::dtype::u8, std::vector<uint64_t>{1ull << 32, 1ull << 32});
  ASSERT_FALSE(numel);
  EXPECT_THAT(numel.error().message, HasSubstr("element count"));
  auto bytes = st::byte_length(st::dtype::f32, std::vector<uint64_t>{1ull << 62});
  ASSERT_FALSE(bytes);
  EXPECT_THAT(bytes.error().message, HasSubstr("byte length"));
}

TEST(safetensors_roundtrip, every_dtype_with_metadata) {
  std::vector<std::vector<std::byte>> storage;
  std::vector<st::tensor_to_write> tensors;
  uint32_t seed = 1;
  for (auto type : st::all_dtypes) {
    std::vector<uint64_t> shape{2, 3, 5};
    auto size = st::byte_length(type, shape);
    ASSERT_TRUE(size);
    storage.push_back(random_bytes(*size, seed++));
  }
  size_t i = 0;
  for (auto type : st::all_dtypes) {
    tensors.push_back({"model.layers." + std::to_string(i) + "." + std::string{st::to_string(type)},
                       type,
                       {2, 3, 5},
                       storage[i]});
    ++i;
  }
  st::metadata_map metadata{{"format", "pt"}, {"note", "quote\" and \\ and \xc3\xa9"}};
  auto file = st::serialize(tensors, metadata);
  ASSERT_TRUE(file) << file.error().message;
  auto view = st::parse(*file);
  ASSERT_TRUE(view) << view.error().message;
  EXPECT_EQ(view->metadata, metadata);
  ASSERT_EQ(view->tensors.size(), tensors.size());
  uint64_t offset = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const auto& t = view->tensors[k];
    // Written in the order given, so offset order is that order.
    EXPECT_EQ(t.name, tensors[k].name);
    EXPECT_EQ(t.type, tensors[k].type);
    EXPECT_EQ(t.shape, tensors[k].shape);
    EXPECT_EQ(t.data_begin, offset);
    offset = t.data_end;
    auto bytes = view->bytes(t);
    ASSERT_EQ(bytes.size(), storage[k].size());
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), storage[k].begin())) << t.name;
    EXPECT_EQ(view->find(t.name), &t);
  }
  EXPECT_EQ(view->data_size, offset);
  EXPECT_EQ(view->data_start + view->data_size, file->size());
  EXPECT_EQ(view->find("missing"), nullptr);
}

TEST(safetensors_roundtrip, header_is_padded_with_spaces_to_a_multiple_of_8) {
  for (size_t len = 1; len <= 9; ++len) {
    std::vector<std::byte> data(1);
    std::vector<st::tensor_to_write> tensors{{std::string(len, 'w'), st::dtype::u8, {1}, data}};
    auto file = st::serialize(tensors);
    ASSERT_TRUE(file);
    auto view = st::parse(*file);
    ASSERT_TRUE(view);
    EXPECT_EQ(view->header_size % 8, 0u);
    EXPECT_EQ(view->data_start % 8, 0u);
    std::string header(reinterpret_cast<const char*>(file->data()) + 8, view->header_size);
    auto close = header.rfind('}');
    ASSERT_NE(close, std::string::npos);
    EXPECT_LT(header.size() - close - 1, 8u);
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << header;
  }
}

TEST(safetensors_roundtrip, empty_file_and_empty_tensors) {
  auto empty = st::serialize({});
  ASSERT_TRUE(empty);
  auto view = st::parse(*empty);
  ASSERT_TRUE(view);
  EXPECT_TRUE(view->tensors.empty());
  EXPECT_EQ(view->data_size, 0u);

  std::vector<std::byte> four(4, std::byte{7});
  std::vector<st::tensor_to_write> tensors{{"z", st::dtype::f32, {0}, {}},
                                           {"a", st::dtype::f32, {1}, four},
                                           {"y", st::dtype::f16, {3, 0}, {}}};
  auto file = st::serialize(tensors);
  ASSERT_TRUE(file) << file.error().message;
  auto parsed = st::parse(*file);
  ASSERT_TRUE(parsed) << parsed.error().message;
  ASSERT_EQ(parsed->tensors.size(), 3u);
  // Ties at one offset are ordered by name.
  EXPECT_EQ(parsed->tensors[0].name, "z");
  EXPECT_EQ(parsed->tensors[1].name, "a");
  EXPECT_EQ(parsed->tensors[2].name, "y");
  EXPECT_EQ(parsed->tensors[2].data_begin, 4u);
}

TEST(safetensors_roundtrip, accepts_a_header_written_by_another_writer) {
  // Key order, whitespace and trailing padding as Python's writer produces.
  std::string header =
    R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F16","shape":[2],)"
    R"("data_offsets":[4,8]},"a":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}  )";
  auto file = file_with_header(header, 8);
  auto view = st::parse(file);
  ASSERT_TRUE(view) << view.error().message;
  ASSERT_EQ(view->tensors.size(), 2u);
  EXPECT_EQ(view->tensors[0].name, "a");
  EXPECT_TRUE(view->tensors[0].shape.empty());
  EXPECT_EQ(view->tensors[1].name, "b");
  EXPECT_EQ(view->metadata.at("format"), "pt");
}

TEST(safetensors_stream, streams_the_same_bytes_as_serialize) {
  auto a = random_bytes(1000, 1);
  auto b = random_bytes(3 * 7 * 2, 2);
  std::vector<st::tensor_to_write> tensors{{"a", st::dtype::u8, {1000}, a},
                                           {"b", st::dtype::bf16, {3, 7}, b}};
  auto whole = st::serialize(tensors, {{"k", "v"}});
  ASSERT_TRUE(whole);

  std::vector<std::byte> streamed;
  std::vector<st::tensor_spec> specs{{"a", st::dtype::u8, {1000}}, {"b", st::dtype::bf16, {3, 7}}};
  auto writer =
    st::stream_writer::start(specs, {{"k", "v"}}, [&](std::span<const std::byte> bytes) {
      streamed.insert(streamed.end(), bytes.begin(), bytes.end());
      return stitch::status{};
    });
  ASSERT_TRUE(writer);
  EXPECT_EQ(writer->remaining(), 1042u);
  EXPECT_FALSE(writer->finish());
  std::vector<std::byte> data = a;
  data.insert(data.end(), b.begin(), b.end());
  std::mt19937 rng{3};
  std::span<const std::byte> rest = data;
  while (!rest.empty()) {
    size_t take = std::min<size_t>(rest.size(), rng() % 97);
    ASSERT_TRUE(writer->write(rest.first(take)));
    rest = rest.subspan(take);
  }
  EXPECT_TRUE(writer->finish());
  std::byte extra{1};
  EXPECT_FALSE(writer->write({&extra, 1}));
  EXPECT_EQ(streamed, *whole);
}

TEST(safetensors_stream, sink_errors_stop_the_write) {
  std::vector<st::tensor_spec> specs{{"a", st::dtype::u8, {4}}};
  int calls = 0;
  auto writer = st::stream_writer::start(specs, {}, [&](std::span<const std::byte>) {
    if (++calls > 1)
      return stitch::status{stitch::make_error(errc::backend_failure, "disk full")};
    return stitch::status{};
  });
  ASSERT_TRUE(writer);
  std::vector<std::byte> data(4);
  auto written = writer->write(data);
  ASSERT_FALSE(written);
  EXPECT_EQ(written.error().code, errc::backend_failure);
  EXPECT_EQ(writer->remaining(), 4u);
}

TEST(safetensors_writer, refuses_bad_input) {
  std::vector<std::byte> four(4);
  auto fails = [&](std::vector<st::tensor_to_write> tensors, std::string_view needle,
                   st::metadata_map metadata = {}) {
    auto out = st::serialize(tensors, metadata);
    ASSERT_FALSE(out) << needle;
    EXPECT_THAT(out.error().message, HasSubstr(std::string{needle}));
  };
  fails({{"a", st::dtype::f32, {2}, four}}, "needs 8");
  fails({{"a", st::dtype::u8, {4}, four}, {"a", st::dtype::u8, {4}, four}}, "duplicate");
  fails({{"../a", st::dtype::u8, {4}, four}}, "'..'");
  fails({{"/a", st::dtype::u8, {4}, four}}, "absolute");
  fails({{"", st::dtype::u8, {4}, four}}, "empty");
  fails({{"__metadata__", st::dtype::u8, {4}, four}}, "reserved");
  fails({{"a\xff", st::dtype::u8, {4}, four}}, "cannot be encoded");
  fails({{"a", st::dtype::u8, {4}, four}}, "cannot be encoded", {{"k", "\xc3"}});
  fails({{"a", st::dtype::u8, std::vector<uint64_t>(65, 1), four}}, "dimensions");
  fails({{"a", st::dtype::u8, {1ull << 40, 1ull << 40}, four}}, "overflows");
}

TEST(safetensors_parse, truncated_size_prefix) {
  std::vector<std::byte> five(5);
  auto parsed = st::parse(five);
  ASSERT_FALSE(parsed);
  EXPECT_EQ(parsed.error().code, errc::invalid_format);
  EXPECT_THAT(parsed.error().message, HasSubstr("fewer than the 8-byte"));
  EXPECT_FALSE(st::parse({}));
}

TEST(safetensors_parse, header_size_over_the_limit_or_the_file) {
  auto huge = size_prefix(st::max_header_size + 1);
  auto parsed = st::parse(huge);
  ASSERT_FALSE(parsed);
  EXPECT_THAT(parsed.error().message, HasSubstr("exceeds the limit"));

  auto beyond = size_prefix(1000);
  beyond.resize(100, std::byte{' '});
  parsed = st::parse(beyond);
  ASSERT_FALSE(parsed);
  EXPECT_THAT(parsed.error().message, HasSubstr("exceeds the 92 bytes available"));

  auto max_size = size_prefix(~uint64_t{0});
  EXPECT_FALSE(st::parse(max_size));
}

TEST(safetensors_parse, header_must_be_a_json_object) {
  expect_format_error("[1,2]", 0, "not a JSON object");
  expect_format_error("\"text\"", 0, "not a JSON object");
  expect_format_error("", 0, "not a JSON object");
  expect_format_error("   {}", 0, "not a JSON object");
  expect_format_error("{", 0, "not valid JSON");
  expect_format_error("{} x", 0, "not valid JSON");
  expect_format_error("{}{}", 0, "not valid JSON");
  expect_format_error(R"({"a\xff":{}})", 0, "not valid JSON");
  expect_format_error(R"({"a":5})", 0, "tensor 'a' is a number, not an object");
  expect_format_error(R"({"a":[]})", 0, "tensor 'a' is an array");
}

TEST(safetensors_parse, tensor_fields_have_the_right_types) {
  expect_format_error(R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4,
                      "unknown dtype 'F33'");
  expect_format_error(R"({"a":{"dtype":5,"shape":[1],"data_offsets":[0,1]}})", 1,
                      "dtype of 'a' is a number");
  expect_format_error(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1,
                      "shape of 'a' has an entry that is a negative number");
  expect_format_error(R"({"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}})", 1,
                      "shape of 'a' has an entry that is a non-integer number");
  expect_format_error(R"({"a":{"dtype":"U8","shape":[1e400],"data_offsets":[0,1]}})", 1,
                      "number overflow");
  expect_format_error(R"({"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,1]}})",
                      1, "non-integer");
  expect_format_error(R"({"a":{"dtype":"U8","shape":["1"],"data_offsets":[0,1]}})", 1,
                      "is a string");
  expect_format_error(R"({"a":{"dtype":"U8","shape":[[1]],"data_offsets":[0,1]}})", 1,
                      "is an array");
  expect_format_error(R"({"a":{"dtype":"U8","shape":1,"data_offsets":[0,1]}})", 1,
                      "shape of 'a' is a number, not an array");
  expect_format_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,-1]}})", 1,
                      "data_offsets of 'a' has an entry that is a negative number");
  expect_format_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1,
                      "must have 2 entries");
  expect_format_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 1,
                      "more than 2 entries");
  expect_format_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":null}})", 1,
                      "data_offsets of 'a' is null");
  expect_format_error(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", 1, "has no dtype");
  expect_format_error(R"({"a":{"dtype":"U8","data_offsets":[0,1]}})", 1, "has no shape");
  expect_format_error(R"({"a":{"dtype":"U8","shape":[1]}})", 1, "has no data_offsets");
  expect_format_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", 1,
                      "unknown key 'x'");
  expect_format_error(R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1,
                      "duplicate key 'dtype'");
  std::string deep_shape = "[";
  for (int i = 0; i < 65; ++i)
    deep_shape += i == 0 ? "1" : ",1";
  expect_format_error(R"({"a":{"dtype":"U8","shape":)" + deep_shape + R"(],"data_offsets":[0,1]}})",
                      1, "more than 64 dimensions");
}

TEST(safetensors_parse, deep_nesting_fails_fast) {
  std::string deep = R"({"a":{"dtype":"U8","shape":)" + std::string(100000, '[');
  expect_format_error(deep, 0, "is an array");
}

TEST(safetensors_parse, metadata_is_a_string_map) {
  expect_format_error(R"({"__metadata__":{"k":1}})", 0, "__metadata__ value of 'k' is a number");
  expect_format_error(R"({"__metadata__":{"k":{}}})", 0, "__metadata__ value of 'k' is an object");
  expect_format_error(R"({"__metadata__":["k"]})", 0, "__metadata__ is an array, not an object");
  expect_format_error(R"({"__metadata__":"k"})", 0, "__metadata__ is a string");
  expect_format_error(R"({"__metadata__":{"k":"1","k":"2"}})", 0, "duplicate __metadata__ key 'k'");
  expect_format_error(R"({"__metadata__":{},"__metadata__":{}})", 0, "duplicate __metadata__ key");
  auto ok = st::parse(file_with_header(R"({"__metadata__":{}})"));
  ASSERT_TRUE(ok);
  EXPECT_TRUE(ok->metadata.empty());
}

TEST(safetensors_parse, offsets_must_tile_the_data_section) {
  const std::string a4 = R"("a":{"dtype":"U8","shape":[4],"data_offsets":)";
  const std::string b4 = R"("b":{"dtype":"U8","shape":[4],"data_offsets":)";
  expect_format_error("{" + a4 + "[0,4]}," + b4 + "[8,12]}}", 12, "gap in data section");
  expect_format_error("{" + a4 + "[4,8]}}", 8, "gap in data section");
  expect_format_error("{" + a4 + "[0,4]}," + b4 + "[2,6]}}", 6, "overlaps");
  expect_format_error("{" + a4 + "[0,4]}," + b4 + "[0,4]}}", 4, "overlaps");
  expect_format_error("{" + a4 + "[4,0]}}", 4, "end before they begin");
  expect_format_error("{" + a4 + "[0,4]}}", 3, "beyond the data section");
  expect_format_error("{" + a4 + "[0,4]}}", 5, "1 trailing bytes");
  expect_format_error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,18446744073709551615]}})",
                      4, "needs 4");
}

TEST(safetensors_parse, byte_length_must_match_dtype_and_shape) {
  expect_format_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4,
                      "has 4 bytes but dtype F32 shape [2] needs 8");
  expect_format_error(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})", 1, "needs 2");
  expect_format_error(
    R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0, "overflows");
}

TEST(safetensors_parse, duplicate_tensor_names_are_refused) {
  expect_format_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                      R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                      2, "duplicate tensor name 'a'");
}

TEST(safetensors_parse, hostile_names_are_refused) {
  auto header = [](std::string_view name) {
    return R"({")" + std::string{name} + R"(":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  };
  expect_format_error(header("../x"), 1, "'..' component");
  expect_format_error(header("a/../../x"), 1, "'..' component");
  expect_format_error(header(".."), 1, "'..' component");
  expect_format_error(header("/abs"), 1, "absolute path");
  expect_format_error(header("a\\u0000b"), 1, "control byte");
  expect_format_error(header("a\\nb"), 1, "control byte");
  expect_format_error(header("a\\\\b"), 1, "backslash");
  expect_format_error(header(""), 1, "empty");
  expect_format_error(header(std::string(1025, 'n')), 1, "longer than 1024");
  // Dots inside a component are ordinary names.
  EXPECT_TRUE(st::parse(file_with_header(header("model..weight/..a"), 1)));
}

TEST(safetensors_parse, header_alone_with_and_without_the_file_size) {
  std::vector<std::byte> data(16);
  std::vector<st::tensor_to_write> tensors{{"a", st::dtype::f32, {4}, data}};
  auto file = st::serialize(tensors);
  ASSERT_TRUE(file);
  auto size = st::read_header_size(*file);
  ASSERT_TRUE(size);
  auto prefix = std::span<const std::byte>{*file}.first(8 + *size);
  auto view = st::parse_header(prefix);
  ASSERT_TRUE(view) << view.error().message;
  EXPECT_EQ(view->data_size, 16u);
  EXPECT_TRUE(view->data.empty());
  EXPECT_TRUE(view->bytes(view->tensors[0]).empty());
  EXPECT_TRUE(st::parse_header(prefix, file->size()));
  auto short_file = st::parse_header(prefix, file->size() - 1);
  ASSERT_FALSE(short_file);
  EXPECT_THAT(short_file.error().message, HasSubstr("beyond the data section"));
  EXPECT_FALSE(st::parse_header(prefix, file->size() + 1));
  EXPECT_FALSE(st::parse_header(std::span<const std::byte>{*file}.first(8 + *size - 1)));
}
