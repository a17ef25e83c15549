#include "runtime/pipeline/materialize.hpp"
#include "store/store_fixtures.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/stager.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/publisher.hpp"
#include "runtime/store/rocksdb_store.hpp"
#include "store/memory_store.hpp"

namespace {

using namespace stitch;
using namespace stitch::pipeline;
using namespace stitch::store;
using stitch::safetensors::dtype;
using stitch::testing::make_tensor;
using stitch::testing::memory_store;
namespace fs = std::filesystem;

tensor_set make_weights(uint64_t seed) {
  std::mt19937_64 rng{seed};
  tensor_set w;
  auto add = [&](host_tensor t) { w.emplace(t.name, std::move(t)); };
  add(make_tensor("embed.weight", dtype::bf16, {64, 32}, rng));
  add(make_tensor("layers.0.weight", dtype::f32, {32, 48}, rng));
  add(make_tensor("layers.1.weight", dtype::f32, {32, 48}, rng));
  add(make_tensor("norm.weight", dtype::f32, {32}, rng));
  add(make_tensor("weird \"quoted\" name ✓", dtype::i32, {7}, rng));
  add(make_tensor("empty", dtype::f16, {0}, rng));
  return w;
}

void mutate_sparse(tensor_set& w, std::mt19937_64& rng) {
  for (auto& [name, t] : w) {
    if (t.bytes.empty() || rng() % 2 != 0)
      continue;
    for (size_t i = 0, n = 1 + rng() % 6; i < n; ++i)
      t.bytes[rng() % t.bytes.size()] ^= static_cast<std::byte>(1 + rng() % 255);
  }
}

publish_request req(std::string run, uint64_t version) {
  publish_request r;
  r.run_id = std::move(run);
  r.version = version;
  return r;
}

class materialize_test : public ::testing::Test {
protected:
  void SetUp() override {
    dir = fs::path{::testing::TempDir()}
          / ("materialize_test_" + std::to_string(::getpid()) + "_"
             + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }

  /// Publishes `count` versions of run r1 (anchor every 4) and remembers them.
  void publish_chain(size_t count, uint64_t max_shard_bytes = default_max_shard_bytes,
                     delta_encoding format = delta_encoding::xor_sparse) {
    publisher pub{store, [&] {
                    publisher_options o;
                    o.anchor_every = 4;
                    o.max_shard_bytes = max_shard_bytes;
                    o.delta_format = format;
                    return o;
                  }()};
    std::mt19937_64 rng{99};
    tensor_set w = make_weights(5);
    for (uint64_t v = 0; v < count; ++v) {
      if (v > 0)
        mutate_sparse(w, rng);
      auto report = pub.publish(req("r1", v), w);
      ASSERT_TRUE(report) << to_string(report.error());
      versions.push_back(w);
    }
  }

  memory_store store;
  fs::path dir;
  std::vector<tensor_set> versions;
};

TEST_F(materialize_test, every_version_of_a_chain) {
  publish_chain(11, 4096);
  for (uint64_t v = 0; v < versions.size(); ++v) {
    auto got = materialize(store, "default", {"r1", v});
    ASSERT_TRUE(got) << v << ": " << to_string(got.error());
    EXPECT_TRUE(*got == versions[v]) << "version " << v;
  }
}

TEST_F(materialize_test, every_version_of_a_chain_of_xor_deltas) {
  // Stores written before xor-sparse (or with publisher.delta_encoding = "xor").
  publish_chain(11, 4096, delta_encoding::xor_bytes);
  auto m = store.read_manifest("default", {"r1", 1});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->encoding, delta_encoding::xor_bytes);
  for (uint64_t v = 0; v < versions.size(); ++v) {
    auto got = materialize(store, "default", {"r1", v});
    ASSERT_TRUE(got) << v << ": " << to_string(got.error());
    EXPECT_TRUE(*got == versions[v]) << "version " << v;
  }
}

TEST_F(materialize_test, with_a_caller_runner) {
  publish_chain(3);
  sequential_for runner;
  auto got = materialize(store, "default", {"r1", 2}, &runner);
  ASSERT_TRUE(got) << to_string(got.error());
  EXPECT_TRUE(*got == versions[2]);
}

TEST_F(materialize_test, large_tensors_take_the_parallel_path) {
  publisher pub{store};
  std::mt19937_64 rng{3};
  tensor_set w;
  auto big = make_tensor("big", dtype::f32, {3, 1024, 1024}, rng); // 12 MiB
  w.emplace(big.name, std::move(big));
  ASSERT_TRUE(pub.publish(req("r1", 0), w));
  w.at("big").bytes[10'000'000] ^= std::byte{0xff};
  auto report = pub.publish(req("r1", 1), w);
  ASSERT_TRUE(report) << to_string(report.error());
  EXPECT_EQ(report->kind, version_kind::delta);
  auto got = materialize(store, "default", {"r1", 1});
  ASSERT_TRUE(got) << to_string(got.error());
  EXPECT_TRUE(*got == w);
}

TEST_F(materialize_test, export_writes_a_directory_that_reads_back_identically) {
  publish_chain(6);
  for (uint64_t v : {uint64_t{0}, uint64_t{5}}) {
    fs::path out = dir / ("v" + std::to_string(v));
    export_options small;
    small.max_shard_bytes = 4096;
    auto ok = export_version(store, "default", {"r1", v}, out, small);
    ASSERT_TRUE(ok) << to_string(ok.error());
    auto loaded = load_hf_directory(out);
    ASSERT_TRUE(loaded) << to_string(loaded.error());
    EXPECT_TRUE(*loaded == versions[v]);
  }
  // Exporting again over an earlier export replaces it.
  auto again = export_version(store, "default", {"r1", 3}, dir / "v0");
  ASSERT_TRUE(again) << to_string(again.error());
  auto loaded = load_hf_directory(dir / "v0");
  ASSERT_TRUE(loaded);
  EXPECT_TRUE(*loaded == versions[3]);
}

TEST_F(materialize_test, corrupt_anchor_bytes_are_a_checksum_mismatch_naming_the_tensor) {
  publish_chain(3);
  ASSERT_TRUE(store.corrupt("default", {"r1", 0}, "layers.1.weight", 17));
  for (uint64_t v : {uint64_t{0}, uint64_t{2}}) {
    auto got = materialize(store, "default", {"r1", v});
    ASSERT_FALSE(got);
    EXPECT_EQ(got.error().code, errc::checksum_mismatch) << to_string(got.error());
    EXPECT_NE(got.error().message.find("'layers.1.weight'"), std::string::npos)
      << got.error().message;
  }
}

TEST_F(materialize_test, anchor_manifest_lists_every_tensor_spec_and_stores_no_extra_tensor) {
  publish_chain(1);
  auto anchor = store.read_manifest("default", {"r1", 0});
  ASSERT_TRUE(anchor);
  ASSERT_EQ(anchor->tensor_specs.size(), versions[0].size());
  EXPECT_EQ(anchor->weight_map.size(), versions[0].size()) << "the directory is plain HF";
  for (const auto& [name, t] : versions[0]) {
    EXPECT_EQ(anchor->tensor_specs.at(name).dtype, safetensors::to_string(t.type));
    EXPECT_EQ(anchor->tensor_specs.at(name).shape, t.shape);
  }
}

TEST_F(materialize_test, anchor_without_specs_is_refused_naming_the_version) {
  manifest m;
  m.ref = {"r1", 0};
  m.kind = version_kind::full;
  m.shards = {"model-00001-of-00001.safetensors"};
  m.weight_map = {{"w", "model-00001-of-00001.safetensors"}};
  m.touched = {"w"};
  m.checksums = {{"w", 1}};
  m.total_size = 4;
  auto specs = read_tensor_specs(m);
  ASSERT_FALSE(specs);
  EXPECT_EQ(specs.error().code, errc::corrupt_data);
  EXPECT_NE(specs.error().message.find("r1/weight_v000000"), std::string::npos);
}

TEST_F(materialize_test, corrupt_delta_bytes_fail_naming_the_tensor) {
  publisher pub{store};
  tensor_set w = make_weights(1);
  ASSERT_TRUE(pub.publish(req("r1", 0), w));
  w.at("norm.weight").bytes[4] ^= std::byte{1};
  ASSERT_TRUE(pub.publish(req("r1", 1), w));
  auto m = store.read_manifest("default", {"r1", 1});
  ASSERT_TRUE(m);
  ASSERT_EQ(m->touched, std::vector<std::string>{"norm.weight"});
  // Somewhere in the zstd frame: either the frame breaks or the bytes differ.
  ASSERT_TRUE(store.corrupt("default", {"r1", 1}, "norm.weight", delta_frame_prefix + 6));
  auto got = materialize(store, "default", {"r1", 1});
  ASSERT_FALSE(got);
  EXPECT_TRUE(got.error().code == errc::checksum_mismatch
              || got.error().code == errc::decode_failure)
    << to_string(got.error());
  EXPECT_NE(got.error().message.find("'norm.weight'"), std::string::npos) << got.error().message;
}

TEST_F(materialize_test, hostile_frame_length_is_refused_without_allocating) {
  publisher pub{store};
  tensor_set w = make_weights(1);
  ASSERT_TRUE(pub.publish(req("r1", 0), w));
  w.at("norm.weight").bytes[4] ^= std::byte{1};
  ASSERT_TRUE(pub.publish(req("r1", 1), w));
  // Flip the top byte of the length prefix: a claim of ~2^63 bytes.
  ASSERT_TRUE(store.corrupt("default", {"r1", 1}, "norm.weight", 7));
  auto got = materialize(store, "default", {"r1", 1});
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code, errc::corrupt_data) << to_string(got.error());
  EXPECT_NE(got.error().message.find("'norm.weight'"), std::string::npos);
}

TEST_F(materialize_test, missing_versions_and_holes) {
  publish_chain(4);
  auto absent = materialize(store, "default", {"r1", 9});
  ASSERT_FALSE(absent);
  EXPECT_EQ(absent.error().code, errc::not_found);
  auto other_run = materialize(store, "default", {"nope", 0});
  ASSERT_FALSE(other_run);
  EXPECT_EQ(other_run.error().code, errc::not_found);

  ASSERT_TRUE(store.erase("default", {"r1", 2}));
  auto hole = materialize(store, "default", {"r1", 3});
  ASSERT_FALSE(hole);
  EXPECT_EQ(hole.error().code, errc::missing_link) << to_string(hole.error());
  // Versions before the hole still build.
  auto before = materialize(store, "default", {"r1", 1});
  ASSERT_TRUE(before) << to_string(before.error());
  EXPECT_TRUE(*before == versions[1]);

  auto bad = materialize(store, "default", {"../x", 0});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, errc::invalid_argument);
}

TEST_F(materialize_test, resumed_run_walks_back_to_its_boot) {
  publisher pub{store};
  std::mt19937_64 rng{5};
  tensor_set w = make_weights(8);
  ASSERT_TRUE(pub.publish(req("r2", 40), w));
  for (uint64_t v = 41; v < 44; ++v) {
    mutate_sparse(w, rng);
    ASSERT_TRUE(pub.publish(req("r2", v), w));
  }
  auto got = materialize(store, "default", {"r2", 43});
  ASSERT_TRUE(got) << to_string(got.error());
  EXPECT_TRUE(*got == w);
}

TEST_F(materialize_test, specs_reader_sizes_every_tensor) {
  publish_chain(1);
  auto anchor = store.read_manifest("default", {"r1", 0});
  ASSERT_TRUE(anchor);
  auto specs = read_tensor_specs(*anchor);
  ASSERT_TRUE(specs) << to_string(specs.error());
  ASSERT_EQ(specs->size(), versions[0].size());
  for (const auto& info : *specs) {
    const auto& t = versions[0].at(info.name);
    EXPECT_EQ(info.type, t.type);
    EXPECT_EQ(info.shape, t.shape);
    EXPECT_EQ(info.byte_size(), t.bytes.size());
  }
}

TEST_F(materialize_test, through_the_rocksdb_backend) {
  auto rocks = open_rocksdb_store((dir / "db").string());
  ASSERT_TRUE(rocks) << to_string(rocks.error());
  store_backend& db = **rocks;
  publisher pub{db, [] {
                  publisher_options o;
                  o.anchor_every = 3;
                  o.max_shard_bytes = 4096;
                  return o;
                }()};
  std::mt19937_64 rng{21};
  tensor_set w = make_weights(21);
  std::vector<tensor_set> published;
  for (uint64_t v = 0; v < 5; ++v) {
    if (v > 0)
      mutate_sparse(w, rng);
    auto report = pub.publish(req("r1", v), w);
    ASSERT_TRUE(report) << v << ": " << to_string(report.error());
    published.push_back(w);
  }
  auto again = pub.publish(req("r1", 4), w);
  ASSERT_TRUE(again) << to_string(again.error());
  EXPECT_TRUE(again->idempotent);
  for (uint64_t v = 0; v < 5; ++v) {
    auto got = materialize(db, "default", {"r1", v});
    ASSERT_TRUE(got) << v << ": " << to_string(got.error());
    EXPECT_TRUE(*got == published[v]) << "version " << v;
  }
  auto out = export_version(db, "default", {"r1", 4}, dir / "export");
  ASSERT_TRUE(out) << to_string(out.error());
  auto loaded = load_hf_directory(dir / "export");
  ASSERT_TRUE(loaded);
  EXPECT_TRUE(*loaded == published[4]);
}

} // namespace

namespace {

TEST_F(materialize_test, an_export_through_a_small_buffer_is_byte_identical) {
  publish_chain(6);
  export_options roomy;
  export_options tight;
  tight.buffer_bytes = 1; // clamped to the smallest piece: many pieces per tensor
  for (uint64_t v : {uint64_t{0}, uint64_t{5}}) {
    ASSERT_TRUE(export_version(store, "default", {"r1", v}, dir / "roomy", roomy));
    ASSERT_TRUE(export_version(store, "default", {"r1", v}, dir / "tight", tight));
    for (const auto& e : fs::directory_iterator(dir / "roomy")) {
      std::ifstream a{e.path(), std::ios::binary};
      std::ifstream b{dir / "tight" / e.path().filename(), std::ios::binary};
      std::string x{std::istreambuf_iterator<char>(a), {}};
      std::string y{std::istreambuf_iterator<char>(b), {}};
      EXPECT_EQ(x, y) << e.path().filename() << " of version " << v;
    }
  }
}

TEST_F(materialize_test, streaming_a_tensor_in_pieces_equals_reading_it_whole) {
  publish_chain(6);
  auto reader = version_reader::open(store, "default", {"r1", 5});
  ASSERT_TRUE(reader) << to_string(reader.error());
  std::vector<std::byte> scratch(64);
  std::vector<std::byte> piece(37); // odd, so pieces straddle everything
  for (const auto& t : reader->tensors()) {
    std::vector<std::byte> whole(t.byte_size());
    ASSERT_TRUE(reader->read_into(t, whole, scratch));
    std::vector<std::byte> streamed;
    ASSERT_TRUE(reader->stream(t, piece, scratch, [&](std::span<const std::byte> b) {
      streamed.insert(streamed.end(), b.begin(), b.end());
      return status{};
    }));
    EXPECT_EQ(streamed, whole) << t.name;
    EXPECT_EQ(whole, versions[5].at(t.name).bytes) << t.name;
  }
}

} // namespace

namespace {

TEST_F(materialize_test, an_export_of_corrupt_bytes_fails_and_leaves_no_directory) {
  publish_chain(3);
  ASSERT_TRUE(store.corrupt("default", {"r1", 0}, "layers.1.weight", 17));
  for (uint64_t v : {uint64_t{0}, uint64_t{2}}) {
    auto out = dir / ("corrupt-" + std::to_string(v));
    auto ok = export_version(store, "default", {"r1", v}, out, {});
    ASSERT_FALSE(ok) << v;
    EXPECT_EQ(ok.error().code, errc::checksum_mismatch) << to_string(ok.error());
    EXPECT_NE(ok.error().message.find("layers.1.weight"), std::string::npos) << ok.error().message;
    EXPECT_FALSE(fs::exists(out)) << "a failed export leaves nothing where it was going";
  }
  // Nothing of the failed exports is left beside it either.
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".corrupt-"), std::string::npos) << e.path();
}

} // namespace

// A device applying the same delta to its own copy (the GPU replica's
// staging) is handed every decoded piece at its offset, with its encoding;
// here the device is the host stand-in of the staging pipeline, so the test
// runs everywhere (tests/gpu run the same pipeline on CUDA).
TEST_F(materialize_test, a_decoded_sink_rebuilds_each_delta_on_a_device_copy) {
  publish_chain(3); // an anchor and two deltas
  auto stager = gpu::device_stager::create(gpu::host_device, {.chunk_bytes = 1000, .ring = 2});
  ASSERT_TRUE(stager);
  range_reader read = [&](const version_ref& ref, std::string_view tensor, uint64_t offset,
                          std::span<std::byte> out) {
    return store.read_range("default", ref, tensor, offset, out);
  };
  std::set<delta_encoding> seen;
  for (uint64_t v = 1; v < versions.size(); ++v) {
    auto m = store.read_manifest("default", {"r1", v});
    ASSERT_TRUE(m);
    ASSERT_EQ(m->kind, version_kind::delta);
    for (const auto& name : m->touched) {
      auto host = versions[v - 1].at(name).bytes;
      auto dev = gpu::device_buffer::allocate(gpu::host_device, host.size());
      ASSERT_TRUE(dev);
      std::memcpy(dev->data(), host.data(), host.size());
      uint64_t covered = 0;
      decoded_sink sink{
        [&](uint64_t offset, std::span<const std::byte> decoded, delta_encoding encoding) {
          EXPECT_EQ(offset, covered) << "pieces arrive in order";
          covered += decoded.size();
          seen.insert(encoding);
          return encoding == delta_encoding::xor_bytes ? (*stager)->xor_apply(*dev, offset, decoded)
                                                       : (*stager)->write(*dev, offset, decoded);
        }};
      std::vector<std::byte> scratch(333);
      auto applied = apply_delta(read, *m, name, host, scratch, &sink);
      ASSERT_TRUE(applied) << name << ": " << applied.error().message;
      ASSERT_TRUE((*stager)->finish());
      EXPECT_EQ(covered, host.size()) << name;
      EXPECT_EQ(host, versions[v].at(name).bytes) << name;
      EXPECT_TRUE(std::equal(host.begin(), host.end(), dev->host_bytes().begin())) << name;
    }
  }
  // The publisher writes xor-sparse run lists, handed over as xor pieces;
  // `overwrite` pieces take the stager's write, tested on both devices in
  // tests/gpu/device_memory_test.cpp.
  EXPECT_EQ(seen, std::set<delta_encoding>{delta_encoding::xor_bytes});
}

TEST_F(materialize_test, a_sink_that_fails_stops_the_delta) {
  publish_chain(2);
  auto m = store.read_manifest("default", {"r1", 1});
  ASSERT_TRUE(m);
  ASSERT_FALSE(m->touched.empty());
  const auto& name = *m->touched.begin();
  auto host = versions[0].at(name).bytes;
  range_reader read = [&](const version_ref& ref, std::string_view tensor, uint64_t offset,
                          std::span<std::byte> out) {
    return store.read_range("default", ref, tensor, offset, out);
  };
  decoded_sink sink{[](uint64_t, std::span<const std::byte>, delta_encoding) -> status {
    return make_error(errc::engine_unavailable, "the device went away");
  }};
  std::vector<std::byte> scratch(64);
  auto ok = apply_delta(read, *m, name, host, scratch, &sink);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error().message, "the device went away");
}

TEST_F(materialize_test, a_version_deleted_while_its_layout_loads_is_not_read_again) {
  publish_chain(5); // anchors r1/0 and r1/4
  const std::string name = "embed.weight";
  std::vector<std::byte> out(16);
  // Retention deletes r1/0 between the read's published check and its
  // layout: that read fails as "not found"...
  store.delete_after_next_layout_load("default", {"r1", 0});
  auto first = store.read_range("default", {"r1", 0}, name, 0, out);
  ASSERT_FALSE(first);
  EXPECT_EQ(first.error().code, errc::not_found) << to_string(first.error());
  // ...and kept no layout: the next read is refused before any byte read,
  // as for every unpublished version.
  const auto reads = store.range_reads();
  auto second = store.read_range("default", {"r1", 0}, name, 0, out);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, errc::not_found) << to_string(second.error());
  EXPECT_EQ(store.range_reads(), reads);
  // Other versions read on.
  auto other = store.read_range("default", {"r1", 4}, name, 0, out);
  EXPECT_TRUE(other) << to_string(other.error());
}
