// The coordinator's persisted experiments: they round-trip, a missing file
// is a first start, and a corrupt, truncated or foreign file is refused with
// a message naming it (never a crash, never half a record).
#include "runtime/store/experiment_file.hpp"

#include <gtest/gtest.h>

#include <fstream>

#include "store/store_fixtures.hpp"

namespace stitch::store {
namespace {

using stitch::testing::temp_dir;

std::vector<experiment_record> two_runs() {
  experiment_record a;
  a.spec.run_id = "run1";
  a.spec.pool = "p1";
  a.spec.replicas = 3;
  a.spec.commit_mode = "blue_green";
  a.spec.boot_preset = "small";
  a.spec.boot_seed = 11;
  a.spec.boot_dir = "/data/boot";
  a.spec.boot_version = 4;
  a.spec.trainer = {true, 40, 8, 1, 0.25};
  a.trainer_done = true;
  a.next_replica = 9;
  experiment_record b;
  b.spec.run_id = "run2";
  b.spec.trainer.enabled = false;
  return {a, b};
}

TEST(experiment_file, round_trips_every_field) {
  temp_dir dir;
  auto path = dir.path() / "experiments.msgpack";
  ASSERT_TRUE(save_experiments(path, two_runs()));
  auto back = load_experiments(path);
  ASSERT_TRUE(back) << back.error().message;
  ASSERT_EQ(back->size(), 2u);
  const auto& a = (*back)[0];
  EXPECT_EQ(a.spec.run_id, "run1");
  EXPECT_EQ(a.spec.pool, "p1");
  EXPECT_EQ(a.spec.replicas, 3u);
  EXPECT_EQ(a.spec.commit_mode, "blue_green");
  EXPECT_EQ(a.spec.boot_preset, "small");
  EXPECT_EQ(a.spec.boot_seed, 11u);
  EXPECT_EQ(a.spec.boot_dir, "/data/boot");
  EXPECT_EQ(a.spec.boot_version, 4u);
  EXPECT_TRUE(a.spec.trainer.enabled);
  EXPECT_EQ(a.spec.trainer.steps, 40u);
  EXPECT_EQ(a.spec.trainer.samples_per_step, 8u);
  EXPECT_EQ(a.spec.trainer.staleness, 1u);
  EXPECT_DOUBLE_EQ(a.spec.trainer.learning_rate, 0.25);
  EXPECT_TRUE(a.trainer_done);
  EXPECT_EQ(a.next_replica, 9u);
  EXPECT_FALSE((*back)[1].spec.trainer.enabled);
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp"));
  // Replacing it leaves the new record only.
  ASSERT_TRUE(save_experiments(path, {}));
  auto none = load_experiments(path);
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->empty());
}

TEST(experiment_file, a_missing_file_is_a_first_start) {
  temp_dir dir;
  auto got = load_experiments(dir.path() / "nothing-here");
  ASSERT_TRUE(got);
  EXPECT_TRUE(got->empty());
}

TEST(experiment_file, refuses_corrupt_truncated_and_foreign_records_by_name) {
  temp_dir dir;
  auto path = dir.path() / "experiments.msgpack";
  auto bytes = encode_experiments(two_runs());
  auto write = [&](std::string_view b) {
    std::ofstream{path, std::ios::binary | std::ios::trunc}.write(b.data(),
                                                                  static_cast<long>(b.size()));
  };
  for (size_t cut : {size_t{0}, size_t{1}, bytes.size() / 2, bytes.size() - 1}) {
    write(std::string_view{bytes}.substr(0, cut));
    auto got = load_experiments(path);
    ASSERT_FALSE(got) << "a record cut at " << cut << " bytes was read";
    EXPECT_EQ(got.error().code, errc::corrupt_data);
    EXPECT_NE(got.error().message.find(path.string()), std::string::npos) << got.error().message;
  }
  // A forged length: a map claiming 2^32-1 entries.
  write("\xdf\xff\xff\xff\xff");
  EXPECT_FALSE(load_experiments(path));
  // Another format version.
  auto other = bytes;
  other[1] = 2; // [format, experiments]: the fixint after the array header
  write(other);
  auto foreign = load_experiments(path);
  ASSERT_FALSE(foreign);
  EXPECT_NE(foreign.error().message.find("format 2"), std::string::npos) << foreign.error().message;
}

TEST(experiment_file, a_failed_save_leaves_the_old_record) {
  temp_dir dir;
  auto path = dir.path() / "experiments.msgpack";
  ASSERT_TRUE(save_experiments(path, two_runs()));
  // The temporary cannot be created where a directory stands in its way.
  std::filesystem::create_directory(path.string() + ".tmp");
  auto failed = save_experiments(path, {});
  ASSERT_FALSE(failed);
  EXPECT_NE(failed.error().message.find(".tmp"), std::string::npos) << failed.error().message;
  auto back = load_experiments(path);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->size(), 2u);
}

} // namespace
} // namespace stitch::store
