// The RocksDB store on a file system that fills up: a small tmpfs mounted in
// a private mount namespace (root only; CI runs as root). A publish that runs
// out of space fails naming the cause, leaves nothing visible, claimed or
// taking space; what was stored keeps reading; once space is freed the same
// publish works.

#include <sched.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/pipeline/materialize.hpp"
#include "runtime/pipeline/publisher.hpp"
#include "runtime/store/rocksdb_store.hpp"
#include "store/store_fixtures.hpp"

namespace {

using namespace stitch;
using namespace stitch::store;
using namespace stitch::pipeline;
namespace fs = std::filesystem;
using stitch::safetensors::dtype;
using ::testing::HasSubstr;

/// Threads of this process; the mount namespace must be made before any.
size_t thread_count() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/task"))
    ++n;
  return n;
}

uint64_t used_bytes(const fs::path& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0)
    return 0;
  return (s.f_blocks - s.f_bfree) * s.f_frsize;
}

/// A model of `tensors` random f32 tensors of `mib` MiB each.
tensor_set model(size_t tensors, size_t mib, uint64_t seed) {
  std::mt19937_64 rng{seed};
  tensor_set w;
  for (size_t i = 0; i < tensors; ++i) {
    auto t = stitch::testing::make_tensor("model.layers." + std::to_string(i) + ".weight",
                                          dtype::f32, {mib << 18}, rng);
    w.emplace(t.name, std::move(t));
  }
  return w;
}

publish_request req(std::string run, uint64_t version, bool anchor = false) {
  publish_request r;
  r.run_id = std::move(run);
  r.version = version;
  r.force_anchor = anchor;
  return r;
}

class full_disk_test : public ::testing::Test {
protected:
  void SetUp() override {
    if (::geteuid() != 0)
      GTEST_SKIP() << "a tmpfs needs root (CI runs as root)";
    // Once per process, before any thread starts: threads made later share
    // the namespace, so RocksDB's see the tmpfs too.
    static const std::string private_mounts = []() -> std::string {
      if (thread_count() != 1)
        return "threads were started before the mount namespace could be made";
      if (::unshare(CLONE_NEWNS) != 0)
        return std::string{"mount namespaces cannot be made here: "} + std::strerror(errno);
      if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
        return std::string{"mounts cannot be made private here: "} + std::strerror(errno);
      return {};
    }();
    if (private_mounts.starts_with("threads"))
      FAIL() << private_mounts;
    if (!private_mounts.empty())
      GTEST_SKIP() << private_mounts;
    dir = fs::temp_directory_path() / ("stitch-full-disk-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=24m") != 0)
      GTEST_SKIP() << "a tmpfs cannot be mounted here: " << std::strerror(errno);
    mounted = true;
  }

  void TearDown() override {
    backend.reset();
    if (mounted)
      ::umount2(dir.c_str(), MNT_DETACH);
    if (!dir.empty())
      fs::remove_all(dir);
  }

  void open() {
    auto opened = open_rocksdb_store((dir / "db").string());
    ASSERT_TRUE(opened) << to_string(opened.error());
    backend = std::move(*opened);
  }

  /// Makes the tmpfs `mib` MiB large: space freed (or taken) by the operator.
  void resize(size_t mib) {
    auto opts = "size=" + std::to_string(mib) + "m";
    ASSERT_EQ(::mount("tmpfs", dir.c_str(), "tmpfs", MS_REMOUNT, opts.c_str()), 0)
      << std::strerror(errno);
  }

  void expect_version(version_ref ref, const tensor_set& want) {
    auto got = materialize(*backend, "default", ref);
    ASSERT_TRUE(got) << to_string(got.error());
    ASSERT_EQ(got->size(), want.size());
    for (const auto& [name, t] : want)
      EXPECT_TRUE(got->at(name).bytes == t.bytes) << name;
  }

  fs::path dir;
  bool mounted = false;
  std::unique_ptr<store_backend> backend;
};

TEST_F(full_disk_test,
       a_publish_that_runs_out_of_space_fails_cleanly_and_works_once_space_is_freed) {
  open();
  publisher pub{*backend};
  auto v0 = model(2, 1, 1);
  ASSERT_TRUE(pub.publish(req("r", 0), v0));
  auto before = used_bytes(dir);

  // A 40 MiB anchor into 24 MiB: the shard write runs out of space.
  auto v1 = model(10, 4, 2);
  auto full = pub.publish(req("r", 1, true), v1);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code, errc::backend_failure) << to_string(full.error());
  EXPECT_THAT(full.error().message, HasSubstr("No space left on device"));
  EXPECT_THAT(full.error().message, HasSubstr(".safetensors")) << "names the shard";

  // Nothing visible, the pointer where it was, and the attempt's bytes gone
  // (a full disk that stays full after a failed publish fails every later one).
  EXPECT_FALSE(backend->read_manifest("default", {"r", 1}));
  auto pointer = backend->read_pointer("default");
  ASSERT_TRUE(pointer);
  ASSERT_TRUE(pointer->has_value());
  EXPECT_EQ((*pointer)->latest, (version_ref{"r", 0}));
  EXPECT_LE(used_bytes(dir), before + (1u << 20));
  expect_version({"r", 0}, v0);

  // A publish that fits still goes through while the disk is small.
  auto small = v0;
  small.begin()->second.bytes[0] ^= std::byte{1};
  auto fits = pub.publish(req("r", 1), small);
  ASSERT_TRUE(fits) << to_string(fits.error());
  expect_version({"r", 1}, small);

  // Space freed: the large version publishes and reads back.
  resize(96);
  auto again = pub.publish(req("r", 2, true), v1);
  ASSERT_TRUE(again) << to_string(again.error());
  expect_version({"r", 2}, v1);
  pointer = backend->read_pointer("default");
  ASSERT_TRUE(pointer && pointer->has_value());
  EXPECT_EQ((*pointer)->latest, (version_ref{"r", 2}));
}

TEST_F(full_disk_test, records_written_on_a_full_disk_fail_and_the_store_recovers_once_freed) {
  open();
  publisher pub{*backend};
  auto v0 = model(1, 1, 3);
  ASSERT_TRUE(pub.publish(req("r", 0), v0));
  // Stored, not yet claimed: claiming it later writes records only.
  ASSERT_TRUE(stitch::testing::put(
    *backend, "other",
    stitch::testing::full_version("q", 0, {{"a", stitch::testing::random_bytes(64, 1)}})));

  // Fill every byte left, then try the small writes a store makes: a
  // publish (shards and records) of a tiny version.
  {
    std::ofstream filler(dir / "filler", std::ios::binary);
    std::vector<char> block(1 << 16, 'x');
    while (filler.write(block.data(), static_cast<std::streamsize>(block.size())))
      ;
  }
  // A record alone (another pool's claim) goes to RocksDB's write-ahead
  // log, whose space is taken ahead: it either fits or fails naming the cause.
  auto claim = backend->claim("other", {"q", 0});
  if (!claim) {
    EXPECT_THAT(to_string(claim.error()), HasSubstr("space")) << to_string(claim.error());
  }
  auto tiny = v0;
  tiny.begin()->second.bytes[7] ^= std::byte{1};
  auto refused = pub.publish(req("r", 1), tiny);
  ASSERT_FALSE(refused);
  EXPECT_THAT(to_string(refused.error()), HasSubstr("No space left on device"));
  expect_version({"r", 0}, v0);

  // Freed: the same publish goes through without reopening the store.
  fs::remove(dir / "filler");
  claim = backend->claim("other", {"q", 0});
  ASSERT_TRUE(claim) << to_string(claim.error());
  EXPECT_EQ(claim->latest, (version_ref{"q", 0}));
  auto done = pub.publish(req("r", 1), tiny);
  ASSERT_TRUE(done) << to_string(done.error());
  expect_version({"r", 1}, tiny);

  // And the store reopens with everything it acknowledged.
  backend.reset();
  open();
  expect_version({"r", 1}, tiny);
}

} // namespace
