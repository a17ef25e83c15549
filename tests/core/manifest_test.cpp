#include "runtime/core/manifest.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

using namespace stitch;
using nlohmann::json;
using testing::HasSubstr;

namespace {

constexpr const char* shard1 = "model-00001-of-00002.safetensors";
constexpr const char* shard2 = "model-00002-of-00002.safetensors";

/// A valid full anchor: tensors a, b (shard 1) and c (shard 2).
json full_doc() {
  return json::parse(R"({
    "metadata": {"total_size": 300, "version": 0, "run_id": "r1", "kind": "full",
                 "delta_encoding": "none", "compression": "none",
                 "checksum": "xxh3-64-tree-1MiB", "touched": ["a", "b", "c"],
                 "shards": ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"],
                 "checksums": {"a": "0123456789abcdef", "b": "0000000000000001",
                               "c": "ffffffffffffffff"}},
    "weight_map": {"a": "model-00001-of-00002.safetensors",
                   "b": "model-00001-of-00002.safetensors",
                   "c": "model-00002-of-00002.safetensors"}})");
}

/// A valid xor delta at version 7 touching b only; checksums cover a, b, c.
json delta_doc() {
  return json::parse(R"({
    "metadata": {"total_size": 100, "version": 7, "run_id": "r1", "kind": "delta",
                 "base_version": 6, "delta_encoding": "xor", "compression": "zstd",
                 "checksum": "xxh3-64-tree-1MiB", "touched": ["b"],
                 "shards": ["model-00001-of-00001.safetensors"],
                 "checksums": {"a": "0123456789abcdef", "b": "0000000000000002",
                               "c": "ffffffffffffffff"}},
    "weight_map": {"b": "model-00001-of-00001.safetensors"}})");
}

result<manifest> parse(const json& doc) {
  return parse_manifest(doc.dump());
}

/// Expects `doc` to be refused with `code` and a message containing each of `parts`.
void expect_refused(const json& doc, std::initializer_list<std::string> parts,
                    errc code = errc::invalid_manifest) {
  auto m = parse(doc);
  ASSERT_FALSE(m) << "accepted: " << doc.dump();
  EXPECT_EQ(m.error().code, code) << m.error().message;
  for (const auto& part : parts)
    EXPECT_THAT(m.error().message, HasSubstr(part));
}

void expect_refused_text(std::string_view text, std::initializer_list<std::string> parts,
                         errc code = errc::invalid_manifest) {
  auto m = parse_manifest(text);
  ASSERT_FALSE(m) << "accepted: " << text;
  EXPECT_EQ(m.error().code, code) << m.error().message;
  for (const auto& part : parts)
    EXPECT_THAT(m.error().message, HasSubstr(part));
}

} // namespace

TEST(manifest, enum_names) {
  EXPECT_EQ(to_string(version_kind::full), "full");
  EXPECT_EQ(to_string(version_kind::delta), "delta");
  EXPECT_EQ(to_string(delta_encoding::none), "none");
  EXPECT_EQ(to_string(delta_encoding::xor_bytes), "xor");
  EXPECT_EQ(to_string(delta_encoding::overwrite), "overwrite");
  EXPECT_EQ(to_string(delta_encoding::xor_sparse), "xor-sparse");
  EXPECT_EQ(to_string(compression::none), "none");
  EXPECT_EQ(to_string(compression::zstd), "zstd");
}

TEST(manifest, parses_full_anchor) {
  auto m = parse(full_doc());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->ref, (version_ref{"r1", 0}));
  EXPECT_TRUE(m->is_full());
  EXPECT_FALSE(m->base_version);
  EXPECT_EQ(m->total_size, 300u);
  EXPECT_EQ(m->touched, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(m->shards.size(), 2u);
  EXPECT_EQ(m->weight_map.at("c"), shard2);
  EXPECT_EQ(m->checksums.at("a"), 0x0123456789abcdefu);
  EXPECT_EQ(m->checksums.at("c"), 0xffffffffffffffffu);
}

TEST(manifest, parses_delta) {
  auto m = parse(delta_doc());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->kind, version_kind::delta);
  EXPECT_EQ(m->base_version, 6u);
  EXPECT_EQ(m->encoding, delta_encoding::xor_bytes);
  EXPECT_EQ(m->comp, compression::zstd);
  EXPECT_EQ(m->checksums.size(), 3u) << "checksums cover untouched tensors too";
  EXPECT_FALSE(m->is_empty_delta());
}

TEST(manifest, touched_is_sorted_on_parse) {
  auto doc = full_doc();
  doc["metadata"]["touched"] = json::array({"c", "a", "b"});
  auto m = parse(doc);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->touched, (std::vector<std::string>{"a", "b", "c"}));
}

TEST(manifest, empty_delta) {
  auto doc = delta_doc();
  doc["metadata"]["touched"] = json::array();
  doc["metadata"]["shards"] = json::array();
  doc["weight_map"] = json::object();
  auto m = parse(doc);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_TRUE(m->is_empty_delta());
}

TEST(manifest, unknown_keys_are_ignored) {
  auto doc = full_doc();
  doc["metadata"]["trainer"] = {{"step", 12}, {"notes", json::array({1, 2})}};
  doc["extra"] = "x";
  EXPECT_TRUE(parse(doc));
}

TEST(manifest, round_trip_full) {
  auto m = parse(full_doc());
  ASSERT_TRUE(m);
  auto again = parse_manifest(to_json(*m));
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(*again, *m);
}

TEST(manifest, round_trip_delta_and_empty_delta) {
  auto m = parse(delta_doc());
  ASSERT_TRUE(m);
  auto again = parse_manifest(to_json(*m));
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(*again, *m);

  manifest empty = *m;
  empty.touched.clear();
  empty.weight_map.clear();
  empty.shards.clear();
  empty.encoding = delta_encoding::overwrite;
  empty.comp = compression::none;
  ASSERT_TRUE(validate(empty));
  auto parsed = parse_manifest(to_json(empty));
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(*parsed, empty);
}

TEST(manifest, round_trip_unusual_names) {
  manifest m;
  m.ref = {"run-1.x_y", 3};
  m.touched = {"layers/0/w\xc3\xa9ight", "model.embed_tokens.weight \"q\""};
  for (const auto& t : m.touched) {
    m.weight_map[t] = "model.safetensors";
    m.checksums[t] = 42;
  }
  m.shards = {"model.safetensors", "unused-00002.safetensors"};
  m.total_size = std::numeric_limits<uint64_t>::max();
  ASSERT_TRUE(validate(m)) << validate(m).error().message;
  auto again = parse_manifest(to_json(m));
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(*again, m);
}

TEST(manifest, to_json_is_stable) {
  auto a = parse(full_doc());
  auto doc = full_doc();
  doc["metadata"]["touched"] = json::array({"c", "b", "a"});
  auto b = parse(doc);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(to_json(*a), to_json(*b));
  auto text = to_json(*a);
  EXPECT_LT(text.find("\"metadata\""), text.find("\"weight_map\""));
}

TEST(manifest, missing_version) {
  auto doc = full_doc();
  doc["metadata"].erase("version");
  expect_refused(doc, {"metadata.version", "missing"});
}

TEST(manifest, negative_version) {
  auto doc = full_doc();
  doc["metadata"]["version"] = -1;
  expect_refused(doc, {"metadata.version", "-1"});
}

TEST(manifest, non_integer_version) {
  for (json bad : {json(7.0), json("7"), json(true), json(nullptr), json::array({7})}) {
    auto doc = full_doc();
    doc["metadata"]["version"] = bad;
    expect_refused(doc, {"metadata.version", "non-negative integer"});
  }
}

TEST(manifest, missing_run_id) {
  auto doc = full_doc();
  doc["metadata"].erase("run_id");
  expect_refused(doc, {"metadata.run_id", "missing"});
}

TEST(manifest, invalid_run_id) {
  for (json bad : {json(""), json(".."), json("a/b"), json(std::string(65, 'x')), json(5)}) {
    auto doc = full_doc();
    doc["metadata"]["run_id"] = bad;
    expect_refused(doc, {"metadata.run_id"});
  }
}

TEST(manifest, unknown_kind) {
  auto doc = full_doc();
  doc["metadata"]["kind"] = "partial";
  expect_refused(doc, {"metadata.kind", "'partial'"});
  doc["metadata"].erase("kind");
  expect_refused(doc, {"metadata.kind", "missing"});
}

TEST(manifest, delta_without_base_version) {
  auto doc = delta_doc();
  doc["metadata"].erase("base_version");
  expect_refused(doc, {"metadata.base_version", "missing", "6"});
}

TEST(manifest, delta_with_wrong_base_version) {
  auto doc = delta_doc();
  doc["metadata"]["base_version"] = 5;
  expect_refused(doc, {"metadata.base_version", "5", "6"});
}

TEST(manifest, delta_at_version_zero) {
  auto doc = delta_doc();
  doc["metadata"]["version"] = 0;
  doc["metadata"]["base_version"] = 0;
  expect_refused(doc, {"metadata.version", "delta"});
}

TEST(manifest, full_anchor_with_base_version) {
  auto doc = full_doc();
  doc["metadata"]["version"] = 4;
  doc["metadata"]["base_version"] = 3;
  expect_refused(doc, {"metadata.base_version", "full anchor"});
}

TEST(manifest, full_anchor_with_delta_encoding) {
  auto doc = full_doc();
  doc["metadata"]["delta_encoding"] = "xor";
  expect_refused(doc, {"metadata.delta_encoding", "full anchor", "xor"});
}

TEST(manifest, parses_an_xor_sparse_delta) {
  auto doc = delta_doc();
  doc["metadata"]["delta_encoding"] = "xor-sparse";
  auto m = parse(doc);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->encoding, delta_encoding::xor_sparse);
  doc["metadata"]["delta_encoding"] = "xor_sparse";
  expect_refused(doc, {"metadata.delta_encoding", "xor_sparse"});
}

TEST(manifest, delta_with_encoding_none) {
  auto doc = delta_doc();
  doc["metadata"]["delta_encoding"] = "none";
  expect_refused(doc, {"metadata.delta_encoding", "none"});
  doc["metadata"].erase("delta_encoding");
  expect_refused(doc, {"metadata.delta_encoding"});
}

TEST(manifest, unknown_delta_encoding) {
  auto doc = delta_doc();
  doc["metadata"]["delta_encoding"] = "bsdiff";
  expect_refused(doc, {"metadata.delta_encoding", "'bsdiff'"});
}

TEST(manifest, unknown_compression) {
  auto doc = delta_doc();
  doc["metadata"]["compression"] = "gzip";
  expect_refused(doc, {"metadata.compression", "'gzip'"});
}

TEST(manifest, unknown_checksum_algorithm) {
  auto doc = full_doc();
  doc["metadata"]["checksum"] = "sha256";
  expect_refused(doc, {"metadata.checksum", "'sha256'"});
  doc["metadata"].erase("checksum");
  expect_refused(doc, {"metadata.checksum", "missing"});
}

TEST(manifest, weight_map_names_shard_not_in_shards) {
  auto doc = full_doc();
  doc["weight_map"]["c"] = "model-00003-of-00003.safetensors";
  expect_refused(doc, {"weight_map['c']", "model-00003-of-00003.safetensors", "metadata.shards"});
}

TEST(manifest, unused_shard_is_fine) {
  auto doc = full_doc();
  doc["metadata"]["shards"].push_back("spare.safetensors");
  EXPECT_TRUE(parse(doc));
}

TEST(manifest, duplicate_shard_is_refused) {
  auto doc = full_doc();
  doc["metadata"]["shards"].push_back(shard1);
  expect_refused(doc, {"metadata.shards", shard1, "twice"});
}

TEST(manifest, hostile_tensor_names) {
  const std::vector<std::string> hostile = {"",
                                            "..",
                                            "a/../b",
                                            "../a",
                                            "a/..",
                                            "/etc/passwd",
                                            "a\\b",
                                            "..\\a",
                                            "a/./b",
                                            "a//b",
                                            "a/",
                                            "tab\there",
                                            std::string("nul\0x", 5),
                                            "del\x7f",
                                            "\xff\xfe",
                                            "\xc0\xaf",
                                            std::string(1025, 'x')};
  for (const auto& name : hostile) {
    auto ok = validate_tensor_name(name);
    EXPECT_FALSE(ok) << "accepted tensor name "
                     << json(name).dump(-1, ' ', true, json::error_handler_t::replace);
    if (!ok) {
      EXPECT_EQ(ok.error().code, errc::invalid_argument);
      EXPECT_THAT(ok.error().message, HasSubstr("tensor name"));
    }
  }
  for (std::string good : {"model.layers.0.mlp.down_proj.weight", "lm_head.weight", "a/b/c", "x..y",
                           "...", "\xc3\xa9"})
    EXPECT_TRUE(validate_tensor_name(good)) << good;
  EXPECT_TRUE(validate_tensor_name(std::string(1024, 'x')));
}

TEST(manifest, hostile_tensor_name_in_weight_map) {
  auto doc = full_doc();
  doc["weight_map"]["../../etc/passwd"] = shard1;
  doc["metadata"]["touched"].push_back("../../etc/passwd");
  doc["metadata"]["checksums"]["../../etc/passwd"] = "0000000000000000";
  expect_refused(doc, {"weight_map", "../../etc/passwd", ".."});
}

TEST(manifest, hostile_tensor_name_in_checksums) {
  auto doc = delta_doc();
  doc["metadata"]["checksums"]["/abs"] = "0000000000000000";
  expect_refused(doc, {"metadata.checksums", "/abs", "absolute"});
}

TEST(manifest, hostile_shard_names) {
  const std::vector<std::string> hostile = {"",
                                            "../x.safetensors",
                                            "a/b.safetensors",
                                            "/x.safetensors",
                                            "a\\b.safetensors",
                                            "x.bin",
                                            ".safetensors",
                                            "..safetensors",
                                            ".hidden.safetensors",
                                            "x.safetensors\n",
                                            "x y.safetensors",
                                            std::string("x\0.safetensors", 14),
                                            std::string(300, 'a') + ".safetensors"};
  for (const auto& name : hostile) {
    auto ok = validate_shard_name(name);
    EXPECT_FALSE(ok) << "accepted shard name " << json(name).dump();
    if (!ok) {
      EXPECT_THAT(ok.error().message, HasSubstr("shard name"));
    }
  }
  for (std::string good :
       {"model.safetensors", "model-00001-of-00002.safetensors", "a_b.c.safetensors"})
    EXPECT_TRUE(validate_shard_name(good)) << good;
}

TEST(manifest, hostile_shard_name_in_shards_and_weight_map) {
  auto doc = full_doc();
  doc["metadata"]["shards"].push_back("../evil.safetensors");
  expect_refused(doc, {"metadata.shards", "../evil.safetensors"});
  doc = full_doc();
  doc["weight_map"]["a"] = "../evil.safetensors";
  expect_refused(doc, {"weight_map['a']", "../evil.safetensors"});
}

TEST(manifest, delta_touched_must_be_in_weight_map) {
  auto doc = delta_doc();
  doc["metadata"]["touched"] = json::array({"a", "b"});
  expect_refused(doc, {"metadata.touched", "'a'", "weight_map"});
}

TEST(manifest, full_touched_must_equal_weight_map_keys) {
  auto doc = full_doc();
  doc["metadata"]["touched"] = json::array({"a", "c"});
  expect_refused(doc, {"weight_map", "'b'", "metadata.touched"});
  doc = full_doc();
  doc["metadata"]["touched"].push_back("d");
  doc["metadata"]["checksums"]["d"] = "0000000000000000";
  expect_refused(doc, {"metadata.touched", "'d'", "weight_map"});
}

TEST(manifest, touched_must_be_strings_without_duplicates) {
  auto doc = delta_doc();
  doc["metadata"]["touched"] = json::array({"b", "b"});
  expect_refused(doc, {"metadata.touched", "'b'", "twice"});
  doc["metadata"]["touched"] = json::array({"b", 3});
  expect_refused(doc, {"metadata.touched[1]", "string"});
  doc["metadata"].erase("touched");
  expect_refused(doc, {"metadata.touched", "missing"});
}

TEST(manifest, validate_requires_sorted_touched) {
  auto m = parse(full_doc());
  ASSERT_TRUE(m);
  std::swap(m->touched[0], m->touched[1]);
  auto ok = validate(*m);
  ASSERT_FALSE(ok);
  EXPECT_THAT(ok.error().message, HasSubstr("metadata.touched"));
}

TEST(manifest, checksums_must_be_16_lowercase_hex) {
  for (json bad :
       {json("0123456789ABCDEF"), json("0123456789abcde"), json("0123456789abcdef0"),
        json("0123456789abcdeg"), json(" 123456789abcdef"), json(12345), json(nullptr)}) {
    auto doc = full_doc();
    doc["metadata"]["checksums"]["a"] = bad;
    expect_refused(doc, {"metadata.checksums['a']", "16 lowercase hex"});
  }
}

TEST(manifest, checksums_must_cover_weight_map) {
  auto doc = delta_doc();
  doc["metadata"]["checksums"].erase("b");
  expect_refused(doc, {"metadata.checksums", "'b'"});
  doc = full_doc();
  doc["metadata"].erase("checksums");
  expect_refused(doc, {"metadata.checksums", "missing"});
}

TEST(manifest, full_anchor_checksums_name_only_its_tensors) {
  auto doc = full_doc();
  doc["metadata"]["checksums"]["zz"] = "0000000000000000";
  expect_refused(doc, {"metadata.checksums", "'zz'", "full anchor"});
}

TEST(manifest, total_size_must_be_non_negative_integer) {
  for (json bad : {json(-5), json(1.5), json("300"), json(nullptr)}) {
    auto doc = full_doc();
    doc["metadata"]["total_size"] = bad;
    expect_refused(doc, {"metadata.total_size", "non-negative integer"});
  }
  auto doc = full_doc();
  doc["metadata"].erase("total_size");
  expect_refused(doc, {"metadata.total_size", "missing"});
}

TEST(manifest, duplicate_key_in_weight_map) {
  std::string text = full_doc().dump();
  auto at = text.find("\"weight_map\":{") + std::string("\"weight_map\":{").size();
  text.insert(at, "\"a\":\"model-00002-of-00002.safetensors\",");
  expect_refused_text(text, {"duplicate key", "'a'", "weight_map"});
}

TEST(manifest, duplicate_key_in_checksums) {
  std::string text = full_doc().dump();
  auto at = text.find("\"checksums\":{") + std::string("\"checksums\":{").size();
  text.insert(at, "\"a\":\"0000000000000000\",");
  expect_refused_text(text, {"duplicate key", "'a'", "metadata.checksums"});
}

TEST(manifest, duplicate_key_in_metadata) {
  std::string text = full_doc().dump();
  auto at = text.find("\"metadata\":{") + std::string("\"metadata\":{").size();
  text.insert(at, "\"version\":9,");
  expect_refused_text(text, {"duplicate key", "'version'", "metadata"});
}

TEST(manifest, malformed_json) {
  expect_refused_text("", {"not valid JSON"});
  expect_refused_text("{\"metadata\": ", {"not valid JSON"});
  expect_refused_text(full_doc().dump() + " x", {"not valid JSON"});
  expect_refused_text("[1,2]", {"must be an object"});
  expect_refused_text("{}", {"metadata", "missing"});
  expect_refused_text(R"({"metadata": [], "weight_map": {}})", {"metadata", "object"});
  auto doc = full_doc();
  doc["weight_map"] = json::array();
  expect_refused(doc, {"weight_map", "object"});
  doc = full_doc();
  doc["weight_map"]["a"] = 1;
  expect_refused(doc, {"weight_map['a']", "string"});
}

TEST(manifest, deep_nesting_is_refused) {
  std::string deep(100000, '[');
  std::string text = R"({"metadata": {"x": )" + deep + std::string(100000, ']') + "}}";
  expect_refused_text(text, {"nested deeper"});
  expect_refused_text(deep, {}); // unterminated: any error, no crash
}

TEST(manifest, oversized_input_is_refused) {
  std::string text(max_manifest_bytes + 1, ' ');
  expect_refused_text(text, {"bytes"}, errc::limit_exceeded);
}

TEST(manifest, too_many_elements_is_refused) {
  std::string text = R"({"metadata": {"x": [0)";
  for (size_t i = 0; i < 5 * max_manifest_tensors + 1000; ++i)
    text += ",0";
  text += "]}}";
  expect_refused_text(text, {"keys and values"}, errc::limit_exceeded);
}

TEST(manifest, too_many_tensors_is_refused_by_validate) {
  auto m = parse(full_doc());
  ASSERT_TRUE(m);
  m->touched.assign(max_manifest_tensors + 1, "a");
  auto ok = validate(*m);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error().code, errc::limit_exceeded);
  EXPECT_THAT(ok.error().message, HasSubstr("metadata.touched"));
}

TEST(manifest, validate_reports_out_of_range_enums) {
  auto m = parse(full_doc());
  ASSERT_TRUE(m);
  m->kind = static_cast<version_kind>(9);
  auto ok = validate(*m);
  ASSERT_FALSE(ok);
  EXPECT_THAT(ok.error().message, HasSubstr("metadata.kind"));
}

TEST(hf_index, parses_plain_trainer_index) {
  auto index = parse_hf_index(R"({
    "metadata": {"total_size": 1234},
    "weight_map": {"z.weight": "model-00002-of-00002.safetensors",
                   "a.weight": "model-00001-of-00002.safetensors",
                   "m.weight": "model-00002-of-00002.safetensors"}})");
  ASSERT_TRUE(index) << index.error().message;
  EXPECT_EQ(index->total_size, 1234u);
  EXPECT_EQ(index->weight_map.size(), 3u);
  EXPECT_EQ(index->shards, (std::vector<std::string>{shard2, shard1})) << "first-seen order";
}

TEST(hf_index, reads_a_stitch_manifest_too) {
  auto index = parse_hf_index(full_doc().dump());
  ASSERT_TRUE(index) << index.error().message;
  EXPECT_EQ(index->total_size, 300u);
  EXPECT_EQ(index->weight_map.size(), 3u);
}

TEST(hf_index, refuses_bad_input) {
  auto check = [](std::string_view text, std::initializer_list<std::string> parts) {
    auto index = parse_hf_index(text);
    ASSERT_FALSE(index) << text;
    for (const auto& part : parts)
      EXPECT_THAT(index.error().message, HasSubstr(part));
  };
  check(R"({"weight_map": {}})", {"metadata", "missing"});
  check(R"({"metadata": {}, "weight_map": {}})", {"metadata.total_size", "missing"});
  check(R"({"metadata": {"total_size": -1}, "weight_map": {}})", {"metadata.total_size"});
  check(R"({"metadata": {"total_size": 1}})", {"weight_map", "missing"});
  check(R"({"metadata": {"total_size": 1}, "weight_map": {"a/../b": "m.safetensors"}})",
        {"weight_map", "a/../b"});
  check(R"({"metadata": {"total_size": 1}, "weight_map": {"a": "../m.safetensors"}})",
        {"weight_map['a']", "../m.safetensors"});
  check(R"({"metadata": {"total_size": 1}, "weight_map": {"a": "m.bin"}})", {"weight_map['a']"});
  check(
    R"({"metadata": {"total_size": 1}, "weight_map": {"a": "m.safetensors", "a": "n.safetensors"}})",
    {"duplicate key", "'a'", "weight_map"});
  check(R"({"metadata": {"total_size": 1}, "weight_map": {"a": 5}})", {"weight_map['a']"});
}

namespace stitch {
namespace {

manifest anchor_with_specs() {
  manifest m;
  m.ref = {"r", 0};
  m.kind = version_kind::full;
  m.shards = {"model-00001-of-00001.safetensors"};
  m.weight_map = {{"a", "model-00001-of-00001.safetensors"},
                  {"b", "model-00001-of-00001.safetensors"}};
  m.touched = {"a", "b"};
  m.checksums = {{"a", 1}, {"b", 2}};
  m.tensor_specs = {{"a", {"BF16", {4, 8}}}, {"b", {"F32", {3}}}};
  m.total_size = 4 * 8 * 2 + 3 * 4;
  return m;
}

TEST(manifest_tensor_specs, round_trip_through_json) {
  auto m = anchor_with_specs();
  ASSERT_TRUE(validate(m)) << to_string(validate(m).error());
  auto json = to_json(m);
  EXPECT_NE(json.find("\"tensor_specs\":{\"a\":{\"dtype\":\"BF16\",\"shape\":[4,8]}"),
            std::string::npos)
    << json;
  auto back = parse_manifest(json);
  ASSERT_TRUE(back) << to_string(back.error());
  EXPECT_EQ(*back, m);
}

TEST(manifest_tensor_specs, must_cover_exactly_the_stored_tensors_and_their_bytes) {
  auto missing = anchor_with_specs();
  missing.tensor_specs.erase("b");
  auto e1 = validate(missing);
  ASSERT_FALSE(e1);
  EXPECT_NE(e1.error().message.find("lacks tensor 'b'"), std::string::npos) << e1.error().message;

  auto extra = anchor_with_specs();
  extra.tensor_specs["z"] = {"U8", {1}};
  auto e2 = validate(extra);
  ASSERT_FALSE(e2);
  EXPECT_NE(e2.error().message.find("tensor_specs['z']"), std::string::npos);

  auto wrong_size = anchor_with_specs();
  wrong_size.tensor_specs["b"].shape = {4};
  auto e3 = validate(wrong_size);
  ASSERT_FALSE(e3);
  EXPECT_NE(e3.error().message.find("total_size"), std::string::npos) << e3.error().message;

  auto bad_dtype = anchor_with_specs();
  bad_dtype.tensor_specs["a"].dtype = "FP32";
  auto e4 = validate(bad_dtype);
  ASSERT_FALSE(e4);
  EXPECT_NE(e4.error().message.find("tensor_specs['a'].dtype"), std::string::npos);

  auto huge = anchor_with_specs();
  huge.tensor_specs["a"].shape = {UINT64_MAX, UINT64_MAX};
  EXPECT_FALSE(validate(huge));
}

TEST(manifest_tensor_specs, belong_to_full_anchors_only) {
  auto m = anchor_with_specs();
  m.kind = version_kind::delta;
  m.ref.version = 1;
  m.base_version = 0;
  m.encoding = delta_encoding::xor_bytes;
  auto e = validate(m);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("full anchors only"), std::string::npos);
}

TEST(manifest_tensor_specs, malformed_json_is_refused_naming_the_field) {
  auto json = to_json(anchor_with_specs());
  auto replace = [&](std::string from, std::string to) {
    auto s = json;
    s.replace(s.find(from), from.size(), to);
    return parse_manifest(s);
  };
  auto not_array = replace("\"shape\":[4,8]", "\"shape\":\"4x8\"");
  ASSERT_FALSE(not_array);
  EXPECT_NE(not_array.error().message.find("tensor_specs['a'].shape"), std::string::npos);
  auto negative = replace("\"shape\":[4,8]", "\"shape\":[-4,8]");
  ASSERT_FALSE(negative);
  auto no_dtype = replace("\"dtype\":\"BF16\",", "");
  ASSERT_FALSE(no_dtype);
  EXPECT_NE(no_dtype.error().message.find("dtype"), std::string::npos);
}

} // namespace
} // namespace stitch

TEST(manifest, files_round_trip_and_are_absent_when_none) {
  auto doc = delta_doc();
  doc["metadata"]["files"] = {{"config.json", {{"size", 612}, {"checksum", "0123456789abcdef"}}},
                              {"tokenizer.model", {{"size", 0}, {"checksum", "2d06800538d394c2"}}}};
  auto m = parse(doc);
  ASSERT_TRUE(m) << m.error().message;
  ASSERT_EQ(m->files.size(), 2u);
  EXPECT_EQ(m->files.at("config.json"), (file_entry{612, 0x0123456789abcdefULL}));
  auto again = parse_manifest(to_json(*m));
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *m);
  // Without files the rendering has no `files` key (older readers' shape).
  auto plain = parse(full_doc());
  ASSERT_TRUE(plain);
  EXPECT_EQ(to_json(*plain).find("\"files\""), std::string::npos);
}

TEST(manifest, hostile_or_oversized_files_are_refused_by_name) {
  auto with = [](json files) {
    auto doc = full_doc();
    doc["metadata"]["files"] = std::move(files);
    return doc;
  };
  auto entry = [](uint64_t size) { return json{{"size", size}, {"checksum", "0123456789abcdef"}}; };
  expect_refused(with(json::array()), {"metadata.files", "object"});
  expect_refused(with({{"config.json", "text"}}), {"metadata.files", "config.json"});
  expect_refused(with({{"config.json", {{"size", 1}}}}), {"checksum"});
  expect_refused(with({{"config.json", {{"size", 1}, {"checksum", "xyz"}}}}), {"hex"});
  expect_refused(with({{"config.json", {{"size", -1}, {"checksum", "0123456789abcdef"}}}}),
                 {"size"});
  for (std::string bad : {"../x", "a/b", ".env", "model-00001-of-00001.safetensors",
                          "model.safetensors.index.json", "x y", ""})
    expect_refused(with({{bad, entry(1)}}), {"file name"});
  expect_refused(with({{"big.bin", entry(max_version_file_bytes + 1)}}), {"big.bin", "bytes"},
                 errc::limit_exceeded);
  json many = json::object();
  for (size_t i = 0; i <= max_version_files; ++i)
    many["f" + std::to_string(i)] = entry(1);
  expect_refused(with(many), {"files"}, errc::limit_exceeded);
  json heavy = json::object();
  for (int i = 0; i < 3; ++i)
    heavy["f" + std::to_string(i)] = entry(max_version_file_bytes);
  expect_refused(with(heavy), {"in all"}, errc::limit_exceeded);
}

TEST(manifest, a_deltas_frames_round_trip_and_must_describe_its_stored_bytes) {
  auto doc = delta_doc();
  doc["metadata"]["frames"] = {{"b", {{"size", 100}, {"checksum", "00000000000000aa"}}}};
  auto m = parse(doc);
  ASSERT_TRUE(m) << m.error().message;
  ASSERT_EQ(m->frames.size(), 1u);
  EXPECT_EQ(m->frames.at("b"), (stitch::file_entry{100, 0xaa}));
  auto again = stitch::parse_manifest(stitch::to_json(*m));
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *m);
  // Older deltas list none, and render without the key.
  auto plain = parse(delta_doc());
  ASSERT_TRUE(plain);
  EXPECT_TRUE(plain->frames.empty());
  EXPECT_EQ(stitch::to_json(*plain).find("\"frames\""), std::string::npos);

  auto with = [](json frames) {
    auto d = delta_doc();
    d["metadata"]["frames"] = std::move(frames);
    return d;
  };
  auto entry = [](int64_t size) { return json{{"size", size}, {"checksum", "00000000000000aa"}}; };
  expect_refused(with(json::array()), {"metadata.frames", "object"});
  expect_refused(with({{"a", entry(100)}}), {"metadata.frames['a']", "does not touch"});
  expect_refused(with({{"b", entry(4)}}), {"8-byte length prefix"});
  expect_refused(with({{"b", entry(101)}}), {"more bytes than total_size"});
  expect_refused(with({{"b", entry(99)}}), {"99 bytes but total_size is 100"});
  expect_refused(with({{"b", entry(-1)}}), {"size"});
  expect_refused(with({{"b", {{"size", 100}, {"checksum", "nope"}}}}), {"hex"});
  auto full = full_doc();
  full["metadata"]["frames"] = json::object({{"a", entry(100)}});
  expect_refused(full, {"frames belongs to deltas only"});
}
