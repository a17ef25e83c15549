#include "runtime/pipeline/hf_directory.hpp"
#include "store/store_fixtures.hpp"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/core/manifest.hpp"

namespace {

using namespace stitch;
using namespace stitch::pipeline;
using stitch::safetensors::dtype;
using stitch::testing::make_tensor;
namespace fs = std::filesystem;

tensor_set make_weights(uint64_t seed) {
  std::mt19937_64 rng{seed};
  tensor_set w;
  auto add = [&](host_tensor t) { w.emplace(t.name, std::move(t)); };
  add(make_tensor("a.weight", dtype::bf16, {40, 16}, rng));
  add(make_tensor("b.weight", dtype::f32, {30, 10}, rng));
  add(make_tensor("c.bias", dtype::i64, {9}, rng));
  add(make_tensor("d.empty", dtype::f32, {0}, rng));
  add(make_tensor("e.f6", dtype::f6_e2m3, {5}, rng));
  return w;
}

std::vector<std::byte> file_of(const tensor_set& w) {
  std::vector<safetensors::tensor_to_write> tensors;
  for (const auto& [name, t] : w)
    tensors.push_back({t.name, t.type, t.shape, t.bytes});
  return safetensors::serialize(tensors, {{"format", "pt"}}).value();
}

void write_bytes(const fs::path& path, std::span<const std::byte> bytes) {
  std::ofstream out{path, std::ios::binary | std::ios::trunc};
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void write_text(const fs::path& path, std::string_view text) {
  write_bytes(path, std::as_bytes(std::span{text}));
}

std::vector<std::byte> read_bytes(const fs::path& path) {
  std::ifstream in{path, std::ios::binary};
  std::vector<char> chars{std::istreambuf_iterator<char>{in}, {}};
  std::vector<std::byte> out(chars.size());
  if (!chars.empty())
    std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

/// A safetensors file with a hand-written header (for hostile ones).
std::vector<std::byte> raw_file(std::string_view header_json, size_t data_bytes) {
  std::vector<std::byte> out(8 + header_json.size() + data_bytes);
  uint64_t n = header_json.size();
  for (size_t i = 0; i < 8; ++i)
    out[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, header_json.data(), header_json.size());
  return out;
}

class hf_directory_test : public ::testing::Test {
protected:
  void SetUp() override {
    root = fs::path{::testing::TempDir()}
           / ("hf_directory_test_" + std::to_string(::getpid()) + "_"
              + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root);
    fs::create_directories(root / "ckpt");
    dir = root / "ckpt";
  }
  void TearDown() override { fs::remove_all(root); }

  /// A two-shard checkpoint of `w` split by name: a+b | c+d+e.
  void write_two_shards(const tensor_set& w) {
    tensor_set first, second;
    for (const auto& [name, t] : w)
      (name < "c" ? first : second).emplace(name, t);
    write_bytes(dir / "model-00001-of-00002.safetensors", file_of(first));
    write_bytes(dir / "model-00002-of-00002.safetensors", file_of(second));
    std::string index = R"({"metadata": {"total_size": 1}, "weight_map": {)";
    bool comma = false;
    for (const auto& [name, t] : w) {
      index +=
        (comma ? "," : "") + std::string{"\""} + name + "\": \""
        + (name < "c" ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors")
        + "\"";
      comma = true;
    }
    index += "}}";
    write_text(dir / "model.safetensors.index.json", index);
  }

  stitch::error open_error() {
    auto got = open_hf_directory(dir);
    EXPECT_FALSE(got);
    return got ? stitch::error{} : got.error();
  }

  fs::path root;
  fs::path dir;
};

TEST_F(hf_directory_test, reads_a_single_file_checkpoint) {
  auto w = make_weights(1);
  write_bytes(dir / "model.safetensors", file_of(w));
  auto ckpt = open_hf_directory(dir);
  ASSERT_TRUE(ckpt) << to_string(ckpt.error());
  EXPECT_EQ(ckpt->files, std::vector<std::string>{"model.safetensors"});
  ASSERT_EQ(ckpt->tensors.size(), w.size());
  const auto& b = ckpt->tensors.at("b.weight");
  EXPECT_EQ(b.type, dtype::f32);
  EXPECT_EQ(b.shape, (std::vector<uint64_t>{30, 10}));
  EXPECT_EQ(b.file, "model.safetensors");
  EXPECT_EQ(b.size, 1200u);
  std::vector<std::byte> out(b.size);
  ASSERT_TRUE(read_tensor(*ckpt, "b.weight", out));
  EXPECT_EQ(out, w.at("b.weight").bytes);
  std::vector<std::byte> wrong(3);
  EXPECT_FALSE(read_tensor(*ckpt, "b.weight", wrong));
  auto missing = read_tensor(*ckpt, "nope", wrong);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, errc::not_found);

  auto loaded = load_hf_directory(dir);
  ASSERT_TRUE(loaded) << to_string(loaded.error());
  EXPECT_TRUE(*loaded == w);
}

TEST_F(hf_directory_test, reads_a_sharded_checkpoint) {
  auto w = make_weights(2);
  write_two_shards(w);
  auto ckpt = open_hf_directory(dir);
  ASSERT_TRUE(ckpt) << to_string(ckpt.error());
  EXPECT_EQ(ckpt->files.size(), 2u);
  EXPECT_EQ(ckpt->tensors.at("c.bias").file, "model-00002-of-00002.safetensors");
  auto loaded = load_hf_directory(dir);
  ASSERT_TRUE(loaded) << to_string(loaded.error());
  EXPECT_TRUE(*loaded == w);
}

TEST_F(hf_directory_test, write_then_load_round_trips) {
  auto w = make_weights(3);
  fs::path out = root / "export";
  auto ok = write_hf_directory(out, w, 1000);
  ASSERT_TRUE(ok) << to_string(ok.error());
  EXPECT_TRUE(fs::exists(out / "model-00001-of-00003.safetensors"));
  EXPECT_TRUE(fs::exists(out / "model-00003-of-00003.safetensors"));
  auto bytes = read_bytes(out / "model.safetensors.index.json");
  auto index =
    parse_hf_index(std::string_view{reinterpret_cast<const char*>(bytes.data()), bytes.size()});
  ASSERT_TRUE(index) << to_string(index.error());
  EXPECT_EQ(index->weight_map.size(), w.size());
  uint64_t total = 0;
  for (const auto& [name, t] : w)
    total += t.bytes.size();
  EXPECT_EQ(index->total_size, total);
  auto loaded = load_hf_directory(out);
  ASSERT_TRUE(loaded) << to_string(loaded.error());
  EXPECT_TRUE(*loaded == w);
  // Nothing left behind next to it.
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator{root})
    ++entries;
  EXPECT_EQ(entries, 2u); // ckpt and export
}

TEST_F(hf_directory_test, rewriting_replaces_an_earlier_export) {
  fs::path out = root / "export";
  ASSERT_TRUE(write_hf_directory(out, make_weights(4), 1000));
  auto w = make_weights(5);
  auto ok = write_hf_directory(out, w);
  ASSERT_TRUE(ok) << to_string(ok.error());
  EXPECT_FALSE(fs::exists(out / "model-00003-of-00003.safetensors"));
  EXPECT_TRUE(fs::exists(out / "model-00001-of-00001.safetensors"));
  auto loaded = load_hf_directory(out);
  ASSERT_TRUE(loaded);
  EXPECT_TRUE(*loaded == w);
  // An empty directory is fine too.
  fs::create_directories(root / "empty");
  EXPECT_TRUE(write_hf_directory(root / "empty/", w));
  EXPECT_TRUE(load_hf_directory(root / "empty"));
}

TEST_F(hf_directory_test, writing_refuses_a_directory_with_foreign_files) {
  write_text(dir / "notes.txt", "keep me");
  auto ok = write_hf_directory(dir, make_weights(6));
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error().code, errc::invalid_argument);
  EXPECT_NE(ok.error().message.find("notes.txt"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));
  write_text(root / "file", "x");
  EXPECT_FALSE(write_hf_directory(root / "file", make_weights(6)));
}

TEST_F(hf_directory_test, writing_refuses_malformed_tensors) {
  auto w = make_weights(7);
  w.at("a.weight").bytes.pop_back();
  auto ok = write_hf_directory(root / "out", w);
  ASSERT_FALSE(ok);
  EXPECT_NE(ok.error().message.find("a.weight"), std::string::npos);
  EXPECT_FALSE(fs::exists(root / "out"));
}

TEST_F(hf_directory_test, missing_or_empty_directory) {
  auto got = open_error();
  EXPECT_EQ(got.code, errc::not_found);
  auto none = open_hf_directory(root / "does-not-exist");
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, errc::not_found);
}

TEST_F(hf_directory_test, bad_index_json) {
  write_two_shards(make_weights(8));
  write_text(dir / "model.safetensors.index.json",
             R"({"metadata": {"total_size": 1}, "weight_map": {"a": )");
  auto err = open_error();
  EXPECT_EQ(err.code, errc::invalid_manifest);
  EXPECT_NE(err.message.find("model.safetensors.index.json"), std::string::npos) << err.message;
}

TEST_F(hf_directory_test, index_shard_outside_the_directory) {
  write_bytes(root / "outside.safetensors", file_of(make_weights(9)));
  write_text(
    dir / "model.safetensors.index.json",
    R"({"metadata": {"total_size": 1}, "weight_map": {"a.weight": "../outside.safetensors"}})");
  auto err = open_error();
  EXPECT_NE(err.code, errc::none);
  EXPECT_NE(err.message.find("outside.safetensors"), std::string::npos) << err.message;
}

TEST_F(hf_directory_test, symlink_escaping_the_directory) {
  auto w = make_weights(10);
  write_bytes(root / "secret.safetensors", file_of(w));
  fs::create_symlink(root / "secret.safetensors", dir / "model.safetensors");
  auto err = open_error();
  EXPECT_EQ(err.code, errc::invalid_argument);
  EXPECT_NE(err.message.find("outside"), std::string::npos) << err.message;

  // A symlink that stays inside is fine.
  fs::remove(dir / "model.safetensors");
  write_bytes(dir / "real.safetensors", file_of(w));
  fs::create_symlink("real.safetensors", dir / "model.safetensors");
  auto loaded = load_hf_directory(dir);
  ASSERT_TRUE(loaded) << to_string(loaded.error());
  EXPECT_TRUE(*loaded == w);
}

TEST_F(hf_directory_test, truncated_shard) {
  write_two_shards(make_weights(11));
  auto path = dir / "model-00002-of-00002.safetensors";
  auto bytes = read_bytes(path);
  bytes.resize(bytes.size() - 5);
  write_bytes(path, bytes);
  auto err = open_error();
  EXPECT_EQ(err.code, errc::invalid_format);
  EXPECT_NE(err.message.find("model-00002-of-00002.safetensors"), std::string::npos) << err.message;

  // Cut inside the header too.
  bytes.resize(20);
  write_bytes(path, bytes);
  err = open_error();
  EXPECT_EQ(err.code, errc::invalid_format);
  EXPECT_NE(err.message.find("model-00002-of-00002.safetensors"), std::string::npos);

  bytes.resize(3);
  write_bytes(path, bytes);
  err = open_error();
  EXPECT_EQ(err.code, errc::invalid_format);
}

TEST_F(hf_directory_test, missing_shard) {
  write_two_shards(make_weights(12));
  fs::remove(dir / "model-00001-of-00002.safetensors");
  auto err = open_error();
  EXPECT_EQ(err.code, errc::not_found);
  EXPECT_NE(err.message.find("model-00001-of-00002.safetensors"), std::string::npos) << err.message;
}

TEST_F(hf_directory_test, duplicate_tensor_across_shards) {
  auto w = make_weights(13);
  write_two_shards(w);
  // The second shard holds a.weight as well.
  tensor_set second;
  for (const auto& [name, t] : w)
    if (name >= "c" || name == "a.weight")
      second.emplace(name, t);
  write_bytes(dir / "model-00002-of-00002.safetensors", file_of(second));
  auto err = open_error();
  EXPECT_EQ(err.code, errc::invalid_format);
  EXPECT_NE(err.message.find("'a.weight' appears in both"), std::string::npos) << err.message;
}

TEST_F(hf_directory_test, index_and_shards_disagree) {
  auto w = make_weights(14);
  write_two_shards(w);
  // The index names a tensor no shard holds.
  write_text(
    dir / "model.safetensors.index.json",
    R"({"metadata": {"total_size": 5}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                 "b.weight": "model-00001-of-00002.safetensors",
                 "c.bias": "model-00002-of-00002.safetensors",
                 "d.empty": "model-00002-of-00002.safetensors",
                 "e.f6": "model-00002-of-00002.safetensors",
                 "ghost": "model-00002-of-00002.safetensors"}})");
  auto err = open_error();
  EXPECT_EQ(err.code, errc::invalid_manifest);
  EXPECT_NE(err.message.find("'ghost'"), std::string::npos) << err.message;

  // A shard holds a tensor the index does not list.
  write_text(
    dir / "model.safetensors.index.json",
    R"({"metadata": {"total_size": 5}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                 "c.bias": "model-00002-of-00002.safetensors",
                 "d.empty": "model-00002-of-00002.safetensors",
                 "e.f6": "model-00002-of-00002.safetensors"}})");
  err = open_error();
  EXPECT_EQ(err.code, errc::invalid_manifest);
  EXPECT_NE(err.message.find("'b.weight'"), std::string::npos) << err.message;
}

TEST_F(hf_directory_test, hostile_headers) {
  // A header size far beyond the file.
  auto huge = raw_file("{}", 0);
  huge[4] = std::byte{0x01};
  write_bytes(dir / "model.safetensors", huge);
  auto err = open_error();
  EXPECT_EQ(err.code, errc::invalid_format);
  EXPECT_NE(err.message.find("model.safetensors"), std::string::npos);

  // A tensor whose offsets run past the file.
  write_bytes(
    dir / "model.safetensors",
    raw_file(R"({"x":{"dtype":"F32","shape":[1000000000000],"data_offsets":[0,4000000000000]}})",
             16));
  err = open_error();
  EXPECT_EQ(err.code, errc::invalid_format);

  // A tensor named like a path.
  write_bytes(dir / "model.safetensors",
              raw_file(R"({"../evil":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4));
  err = open_error();
  EXPECT_EQ(err.code, errc::invalid_format);
  EXPECT_NE(err.message.find("evil"), std::string::npos) << err.message;

  // Every other name that could leave a directory or break a log line.
  for (std::string name :
       {std::string{"/etc/passwd"}, std::string{"a/../../b"}, std::string{"a\\\\b"},
        std::string{"nul\\u0000byte"}, std::string{"bad\xff\xfe"}, std::string(2000, 'x')}) {
    write_bytes(
      dir / "model.safetensors",
      raw_file("{\"" + name + "\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4));
    err = open_error();
    EXPECT_EQ(err.code, errc::invalid_format) << name;
    EXPECT_NE(err.message.find("model.safetensors"), std::string::npos) << err.message;
  }

  // Not a regular file.
  fs::remove(dir / "model.safetensors");
  fs::create_directory(dir / "model.safetensors");
  err = open_error();
  EXPECT_NE(err.code, errc::none);
}

TEST_F(hf_directory_test, oversized_index_is_refused_before_reading) {
  write_two_shards(make_weights(15));
  {
    std::ofstream out{dir / "model.safetensors.index.json", std::ios::binary | std::ios::trunc};
    out.seekp(static_cast<std::streamoff>(max_manifest_bytes) + 10);
    out.put('}');
  }
  auto err = open_error();
  EXPECT_EQ(err.code, errc::limit_exceeded);
}

} // namespace
