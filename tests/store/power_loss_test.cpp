// Simulated power loss: a file system wrapper that cuts the power after a
// random number of written bytes and then drops every byte that was not
// synced. After each cut the store must reopen with every acknowledged
// version intact and nothing half written visible.

#include <gtest/gtest.h>

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>

#include "crash_workload.hpp"

namespace stitch {
namespace {

using namespace stitch::testing;

/// Tracks written and synced sizes of every file opened for writing; after
/// `cut()` every write and sync fails, and `drop_unsynced()` truncates each
/// file to what was synced — what a power loss leaves on disk. (Directory
/// entries of unsynced new files are kept: a milder loss than a real one.)
class power_cut_fs final : public rocksdb::FileSystemWrapper {
public:
  explicit power_cut_fs(const std::shared_ptr<rocksdb::FileSystem>& base)
      : rocksdb::FileSystemWrapper(base) {}

  const char* Name() const override { return "power_cut_fs"; }

  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& opts,
                                    std::unique_ptr<rocksdb::FSWritableFile>* out,
                                    rocksdb::IODebugContext* dbg) override {
    if (cut_)
      return rocksdb::IOStatus::IOError("power is off");
    auto s = target()->NewWritableFile(name, opts, out, dbg);
    if (s.ok()) {
      {
        std::lock_guard guard{mutex_};
        files_[name] = sizes{};
      }
      *out = std::make_unique<tracked_file>(std::move(*out), this, name);
    }
    return s;
  }

  /// Cuts the power once `bytes` more bytes have been appended.
  void cut_after(int64_t bytes) { budget_ = bytes; }
  bool is_cut() const { return cut_; }

  void drop_unsynced() {
    std::lock_guard guard{mutex_};
    for (const auto& [name, s] : files_) {
      std::error_code ec;
      if (std::filesystem::exists(name, ec))
        std::filesystem::resize_file(name, s.synced, ec);
    }
    files_.clear();
  }

private:
  struct sizes {
    uint64_t written = 0;
    uint64_t synced = 0;
  };

  class tracked_file final : public rocksdb::FSWritableFileOwnerWrapper {
  public:
    tracked_file(std::unique_ptr<rocksdb::FSWritableFile> f, power_cut_fs* fs, std::string name)
        : rocksdb::FSWritableFileOwnerWrapper(std::move(f)), fs_(fs), name_(std::move(name)) {}

    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& opts,
                             rocksdb::IODebugContext* dbg) override {
      if (!fs_->spend(data.size()))
        return rocksdb::IOStatus::IOError("power is off");
      auto s = target()->Append(data, opts, dbg);
      if (s.ok())
        fs_->appended(name_, data.size());
      return s;
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& opts,
                             const rocksdb::DataVerificationInfo&,
                             rocksdb::IODebugContext* dbg) override {
      return Append(data, opts, dbg);
    }
    rocksdb::IOStatus Sync(const rocksdb::IOOptions& opts, rocksdb::IODebugContext* dbg) override {
      return sync([&] { return target()->Sync(opts, dbg); });
    }
    rocksdb::IOStatus Fsync(const rocksdb::IOOptions& opts, rocksdb::IODebugContext* dbg) override {
      return sync([&] { return target()->Fsync(opts, dbg); });
    }

  private:
    template <class F>
    rocksdb::IOStatus sync(F&& f) {
      if (fs_->is_cut())
        return rocksdb::IOStatus::IOError("power is off");
      auto s = f();
      if (s.ok())
        fs_->synced(name_);
      return s;
    }

    power_cut_fs* fs_;
    std::string name_;
  };

  bool spend(uint64_t n) {
    if (cut_)
      return false;
    if (budget_.fetch_sub(static_cast<int64_t>(n)) < static_cast<int64_t>(n)) {
      cut_ = true;
      return false;
    }
    return true;
  }
  void appended(const std::string& name, uint64_t n) {
    std::lock_guard guard{mutex_};
    files_[name].written += n;
  }
  void synced(const std::string& name) {
    std::lock_guard guard{mutex_};
    files_[name].synced = files_[name].written;
  }

  std::mutex mutex_;
  std::map<std::string, sizes> files_;
  std::atomic<bool> cut_{false};
  std::atomic<int64_t> budget_{INT64_MAX};
};

TEST(store_power_loss, unsynced_bytes_lost_never_lose_acknowledged_versions) {
  std::mt19937 rng{20261130};
  const int rounds = 40;
  int cuts_mid_publish = 0;
  for (int round = 0; round < rounds; ++round) {
    temp_dir dir;
    const std::string path = (dir.path() / "db").string();
    std::set<uint64_t> acked;
    // Some acknowledged history first, with the power on.
    for (int pass = 0; pass < 2; ++pass) {
      auto fs = std::make_shared<power_cut_fs>(rocksdb::FileSystem::Default());
      std::shared_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
      const int64_t budget = pass == 0 ? INT64_MAX : static_cast<int64_t>(rng() % 3'000'000);
      fs->cut_after(budget);
      {
        auto opened = store::open_rocksdb_store(path, store::rocksdb_options{env, true});
        if (opened) {
          auto& db = **opened;
          const int versions = pass == 0 ? static_cast<int>(rng() % 7) : 1000;
          for (int i = 0; i < versions; ++i) {
            auto pointer = db.read_pointer(crash_pool);
            if (!pointer)
              break;
            uint64_t next = *pointer ? (*pointer)->latest.version + 1 : 0;
            auto version = crash_version(next);
            if (!put(db, crash_pool, version))
              break;
            bool moved = next == 0 ? db.claim(crash_pool, version.m.ref).has_value()
                                   : db.compare_and_advance_pointer(crash_pool, (*pointer)->latest,
                                                                    version.m.ref)
                                       .has_value();
            if (!moved)
              break;
            acked.insert(next);
          }
          if (fs->is_cut())
            ++cuts_mid_publish;
        } else {
          ASSERT_TRUE(fs->is_cut())
            << "open failed with the power on: " << to_string(opened.error());
        }
      }
      fs->drop_unsynced();
      check_store(path, acked);
      if (HasFatalFailure())
        FAIL() << "round " << round << ", pass " << pass << ", budget " << budget;
    }
  }
  EXPECT_GT(cuts_mid_publish, rounds / 2) << "the cuts should mostly land in publishes";
}

} // namespace
} // namespace stitch
