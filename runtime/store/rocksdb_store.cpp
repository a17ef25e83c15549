#include "runtime/store/rocksdb_store.hpp"

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "gpu/host_buffer.hpp"
#include "runtime/store/store_base.hpp"
#include "runtime/store/version_layout.hpp"

namespace stitch::store {

namespace {

constexpr char sep = '\0';

std::string padded(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%020llu", static_cast<unsigned long long>(v));
  return buf;
}

std::string version_key(std::string_view pool, const version_ref& ref) {
  std::string k{pool};
  k += sep;
  k += ref.run_id;
  k += sep;
  k += padded(ref.version);
  return k;
}

std::string pointer_key(std::string_view pool) {
  return "ptr" + std::string(1, sep) + std::string{pool};
}

std::string boot_prefix(std::string_view pool) {
  return "boot" + std::string(1, sep) + std::string{pool} + sep;
}

std::string boot_key(std::string_view pool, std::string_view run) {
  return boot_prefix(pool) + std::string{run};
}

std::string done_prefix(std::string_view pool, std::string_view run) {
  return "done" + std::string(1, sep) + std::string{pool} + sep + std::string{run} + sep;
}

std::string done_key(std::string_view pool, const version_ref& ref) {
  return done_prefix(pool, ref.run_id) + padded(ref.version);
}

std::string manifest_key(std::string_view pool, const version_ref& ref) {
  return version_key(pool, ref) + sep + "m";
}

std::string layout_key(std::string_view pool, const version_ref& ref) {
  return version_key(pool, ref) + sep + "l";
}

stitch::error backend(const rocksdb::Status& s, std::string_view what) {
  return make_error(errc::backend_failure, std::string{what} + ": " + s.ToString());
}

std::optional<uint64_t> parse_number(std::string_view text) {
  if (text.empty() || text.size() > 20)
    return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9')
      return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

/// `weight_v000007-<16 hex digits>`: one attempt's directory.
std::string attempt_name(uint64_t version) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char nonce[17];
  std::snprintf(nonce, sizeof nonce, "%016llx", static_cast<unsigned long long>(rng()));
  return version_dir_name(version) + "-" + nonce;
}

/// The version an attempt directory's name announces.
std::optional<uint64_t> attempt_version(std::string_view name) {
  constexpr std::string_view prefix = "weight_v";
  auto dash = name.rfind('-');
  if (!name.starts_with(prefix) || dash == std::string_view::npos || name.size() - dash != 17)
    return std::nullopt;
  return parse_number(name.substr(prefix.size(), dash - prefix.size()));
}

/// Bytes written before writeback of a shard file is started, so the disk
/// works while the rest streams in and the final sync waits for a short tail.
constexpr uint64_t writeback_every = uint64_t{32} << 20;

/// Open shard files kept for reads.
constexpr size_t max_open_files = 64;

/// Shards at least this large are written with direct I/O, through a buffer
/// of this many bytes.
constexpr uint64_t direct_threshold = uint64_t{1} << 20;
constexpr size_t direct_buffer = size_t{8} << 20;

class rocksdb_store;

/// A direct-I/O shard asks for a flush to the device every this many bytes.
constexpr uint64_t flush_every = uint64_t{64} << 20;

std::atomic<uint64_t> flushes_made{0};

/// Flushes a file's written data to the device (`fdatasync` through a
/// descriptor of its own) on a thread of its own while more is written: a
/// direct write lands in the device's write cache (or, on a VM, the host's),
/// and a single flush at the end of a 1 GB shard waited 0.4 s by itself,
/// after every byte had arrived. Requests coalesce; the first error a flush
/// met is kept for `stop`.
class background_flusher {
public:
  explicit background_flusher(const std::string& path)
      : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ >= 0)
      thread_ = std::thread([this] { run(); });
  }
  ~background_flusher() { (void) stop(); }
  background_flusher(const background_flusher&) = delete;
  background_flusher& operator=(const background_flusher&) = delete;

  /// A flush of what is written so far, after any running one.
  void request() {
    {
      std::lock_guard lock{mutex_};
      ++wanted_;
    }
    changed_.notify_one();
  }

  /// Stops the thread (a flush running ends first); the errno of the first
  /// flush that failed, 0 when none did.
  int stop() {
    {
      std::lock_guard lock{mutex_};
      stopping_ = true;
    }
    changed_.notify_one();
    if (thread_.joinable())
      thread_.join();
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = -1;
    return failed_;
  }

private:
  void run() {
    std::unique_lock lock{mutex_};
    for (;;) {
      changed_.wait(lock, [&] { return stopping_ || wanted_ > done_; });
      if (stopping_)
        return;
      const uint64_t target = wanted_;
      lock.unlock();
      const int rc = ::fdatasync(fd_);
      const int err = rc == 0 ? 0 : errno;
      flushes_made.fetch_add(1, std::memory_order_relaxed);
      lock.lock();
      done_ = target;
      if (err != 0 && failed_ == 0)
        failed_ = err;
    }
  }

  int fd_ = -1;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t wanted_ = 0;
  uint64_t done_ = 0;
  bool stopping_ = false;
  int failed_ = 0;
};

/// One attempt's directory of shard files.
class file_sink final : public shard_sink {
public:
  file_sink(rocksdb_store& store, std::string pool, version_ref ref, std::string dir,
            std::string name)
      : store_(store), pool_(std::move(pool)), ref_(std::move(ref)), dir_(std::move(dir)),
        name_(std::move(name)) {}
  ~file_sink() override;

  status open_shard(std::string_view name, uint64_t size) override;
  status append(std::span<const std::byte> bytes) override;
  status close_shard() override;
  status finish(const manifest& m, version_layout layout) override;

private:
  rocksdb_store& store_;
  std::string pool_;
  version_ref ref_;
  /// The attempt's directory, and its name (the layout's `location`).
  std::string dir_;
  std::string name_;
  std::unique_ptr<rocksdb::FSWritableFile> file_;
  std::string file_name_;
  uint64_t written_ = 0;
  uint64_t synced_ = 0;
  bool finished_ = false;
  /// Direct I/O (bypassing the page cache, which on many machines writes
  /// back far slower than the device takes direct writes): bytes gather in
  /// an aligned buffer and leave in whole blocks; the tail is padded, then
  /// the file truncated to its size.
  bool direct_ = false;
  gpu::host_buffer buffer_;
  size_t filled_ = 0;
  size_t alignment_ = 4096;
  /// Flushes a large direct shard while it is written.
  std::unique_ptr<background_flusher> flusher_;
  uint64_t flush_asked_at_ = 0;
  status flush_buffer(size_t length);
  /// Asks the flusher for a flush once `flush_every` more bytes went out.
  void maybe_flush();
  /// Stops the flusher: its first error, as the shard's.
  status stop_flusher();
};

class rocksdb_store final : public store_base {
public:
  rocksdb_store(std::unique_ptr<rocksdb::DB> db, std::vector<rocksdb::ColumnFamilyHandle*> cfs,
                std::shared_ptr<rocksdb::FileSystem> fs, std::string root)
      : db_(std::move(db)), cfs_(std::move(cfs)), fs_(std::move(fs)), root_(std::move(root)) {
    sync_.sync = true;
  }

  ~rocksdb_store() override {
    for (auto* cf : cfs_)
      db_->DestroyColumnFamilyHandle(cf);
  }

  status check_schema() {
    std::string value;
    auto s = db_->Get({}, meta(), "schema", &value);
    if (s.ok()) {
      if (value != rocksdb_schema)
        return make_error(errc::corrupt_data,
                          "store schema is '" + value + "', this build reads '"
                            + std::string{rocksdb_schema}
                            + "'; export its versions with the build that wrote it (`stitch "
                              "export`) and publish them into a new store");
      return {};
    }
    if (!s.IsNotFound())
      return backend(s, "reading the schema key");
    std::unique_ptr<rocksdb::Iterator> it{db_->NewIterator({}, meta())};
    it->SeekToFirst();
    if (it->Valid())
      return make_error(errc::corrupt_data, "store has data but no schema key");
    s = db_->Put(sync_, meta(), "schema", std::string{rocksdb_schema});
    if (!s.ok())
      return backend(s, "writing the schema key");
    return {};
  }

  /// Removes attempt directories no record names (publishes that died, and
  /// versions whose deletion was cut short).
  status collect_garbage() {
    const std::string versions = root_ + "/versions";
    if (auto ok = make_dir(versions); !ok)
      return ok;
    for (const auto& pool : children(versions))
      for (const auto& run : children(versions + "/" + pool))
        for (const auto& attempt : children(versions + "/" + pool + "/" + run)) {
          auto v = attempt_version(attempt);
          bool keep = false;
          if (v && validate_pool(pool) && validate_run_id(run)) {
            auto layout = load_layout(pool, {run, *v});
            keep = layout && layout->location == attempt;
          }
          if (!keep)
            remove_tree(versions + "/" + pool + "/" + run + "/" + attempt);
        }
    return {};
  }

  // --- for file_sink -------------------------------------------------------

  rocksdb::FileSystem& fs() { return *fs_; }

  std::string attempt_dir(std::string_view pool, const version_ref& ref,
                          std::string_view name) const {
    return root_ + "/versions/" + std::string{pool} + "/" + ref.run_id + "/" + std::string{name};
  }

  status make_dir(const std::string& dir) {
    auto s = fs_->CreateDirIfMissing(dir, {}, nullptr);
    if (!s.ok())
      return make_error(errc::backend_failure, "cannot create " + dir + ": " + s.ToString());
    return {};
  }

  status sync_dir(const std::string& dir) {
    std::unique_ptr<rocksdb::FSDirectory> d;
    auto s = fs_->NewDirectory(dir, {}, &d, nullptr);
    if (s.ok())
      s = d->Fsync({}, nullptr);
    if (!s.ok())
      return make_error(errc::backend_failure, "cannot sync " + dir + ": " + s.ToString());
    return {};
  }

  std::vector<std::string> children(const std::string& dir) {
    std::vector<std::string> out;
    if (!fs_->GetChildren(dir, {}, &out, nullptr).ok())
      return {};
    std::erase_if(out, [](const std::string& n) { return n == "." || n == ".."; });
    return out;
  }

  void remove_tree(const std::string& dir) {
    for (const auto& name : children(dir)) {
      const auto path = dir + "/" + name;
      if (!fs_->DeleteFile(path, {}, nullptr).ok())
        remove_tree(path);
    }
    (void) fs_->DeleteDir(dir, {}, nullptr);
    // After the unlinks: a read that opened a file before then keeps it for
    // itself only (`open_for_read`).
    forget_files(dir);
  }

  /// Records the attempt's manifest and layout, then frees an earlier
  /// unpublished attempt's bytes. The pool's lock is held.
  status record_attempt(std::string_view pool, const manifest& m, const version_layout& layout) {
    auto earlier = load_layout(pool, m.ref);
    rocksdb::WriteBatch batch;
    batch.Put(manifests(), layout_key(pool, m.ref), encode_layout(layout));
    batch.Put(manifests(), manifest_key(pool, m.ref), to_json(m));
    auto s = db_->Write(sync_, &batch);
    if (!s.ok())
      return backend(s, "recording " + to_string(m.ref));
    forget_layout(pool, m.ref);
    if (earlier && earlier->location != layout.location)
      remove_tree(attempt_dir(pool, m.ref, earlier->location));
    return {};
  }

protected:
  /// RocksDB's lock file keeps every other process (and a second open in
  /// this one) out of the database while it is open: every pointer move
  /// goes through this object.
  bool sole_pointer_writer() const override { return true; }

  result<pointer_snapshot> load_pointer(std::string_view pool) override {
    std::string value;
    auto s = db_->Get({}, meta(), pointer_key(pool), &value);
    if (s.IsNotFound())
      return pointer_snapshot{};
    if (!s.ok())
      return backend(s, "reading the pointer of pool '" + std::string{pool} + "'");
    auto p = decode_pointer(value);
    if (!p)
      return make_error(errc::corrupt_data,
                        "pointer of pool '" + std::string{pool} + "': " + p.error().message);
    return pointer_snapshot{*p, {}};
  }

  result<std::optional<uint64_t>> load_boot(std::string_view pool, std::string_view run) override {
    std::string value;
    auto s = db_->Get({}, meta(), boot_key(pool, run), &value);
    if (s.IsNotFound())
      return std::optional<uint64_t>{};
    if (!s.ok())
      return backend(s, "reading the boot of run '" + std::string{run} + "'");
    auto v = parse_number(value);
    if (!v)
      return make_error(errc::corrupt_data,
                        "boot record of run '" + std::string{run} + "' is corrupt");
    return std::optional<uint64_t>{*v};
  }

  result<manifest> load_manifest(std::string_view pool, const version_ref& ref) override {
    std::string json;
    auto s = db_->Get({}, manifests(), manifest_key(pool, ref), &json);
    if (s.IsNotFound())
      return make_error(errc::not_found,
                        to_string(ref) + " is not stored in pool '" + std::string{pool} + "'");
    if (!s.ok())
      return backend(s, "reading manifest of " + to_string(ref));
    auto m = parse_manifest(json);
    if (!m)
      return make_error(errc::corrupt_data,
                        "stored manifest of " + to_string(ref) + ": " + m.error().message);
    if (m->ref != ref)
      return make_error(errc::corrupt_data,
                        "stored manifest of " + to_string(ref) + " names " + to_string(m->ref));
    return m;
  }

  result<version_layout> load_layout(std::string_view pool, const version_ref& ref) override {
    std::string bytes;
    auto s = db_->Get({}, manifests(), layout_key(pool, ref), &bytes);
    if (s.IsNotFound())
      return make_error(errc::not_found, "no layout of " + to_string(ref));
    if (!s.ok())
      return backend(s, "reading layout of " + to_string(ref));
    auto layout = decode_layout(bytes);
    if (!layout)
      return make_error(errc::corrupt_data, to_string(ref) + ": " + layout.error().message);
    return layout;
  }

  status read_shard(std::string_view pool, const version_ref& ref, const version_layout& layout,
                    const tensor_location& loc, uint64_t offset,
                    std::span<std::byte> out) override {
    auto file = open_for_read(shard_path(pool, ref, layout.location, layout.shards[loc.shard]));
    if (!file)
      return std::move(file).error();
    rocksdb::Slice got;
    auto s = (*file)->Read(loc.offset + offset, out.size(), {}, &got,
                           reinterpret_cast<char*>(out.data()), nullptr);
    if (!s.ok())
      return make_error(errc::backend_failure,
                        "reading " + to_string(ref) + " from its shard file: " + s.ToString());
    if (got.size() != out.size())
      return make_error(errc::corrupt_data, "a shard file of " + to_string(ref) + " is short");
    if (got.data() != reinterpret_cast<const char*>(out.data()))
      std::memcpy(out.data(), got.data(), got.size());
    // Readers stream a tensor in order: have the disk fetch the next range
    // while this one is decoded.
    const uint64_t next = loc.offset + offset + out.size();
    const uint64_t end = loc.offset + loc.size;
    if (out.size() >= (uint64_t{1} << 20) && next < end)
      (void) (*file)->Prefetch(
        next, static_cast<size_t>(std::min<uint64_t>(out.size(), end - next)), {}, nullptr);
    return {};
  }

  result<bool> is_published(std::string_view pool, const version_ref& ref) override {
    std::string value;
    auto s = db_->Get({}, meta(), done_key(pool, ref), &value);
    if (s.IsNotFound())
      return false;
    if (!s.ok())
      return backend(s, "reading the publication record of " + to_string(ref));
    return true;
  }

  status commit_move(std::string_view pool, const pointer_snapshot&,
                     const pointer_commit& move) override {
    // One process owns the database, and the base holds the pool's lock.
    rocksdb::WriteBatch batch;
    batch.Put(meta(), pointer_key(pool), encode_pointer(move.next));
    batch.Put(meta(), done_key(pool, move.target), move.target_is_full ? "F" : "D");
    if (move.new_run)
      batch.Put(meta(), boot_key(pool, move.target.run_id), std::to_string(move.next.boot_version));
    auto s = db_->Write(sync_, &batch);
    if (!s.ok())
      return backend(s, "moving the pointer of pool '" + std::string{pool} + "'");
    return {};
  }

  result<std::unique_ptr<shard_sink>> open_sink(std::string_view pool,
                                                const version_ref& ref) override {
    const std::string run_dir = root_ + "/versions/" + std::string{pool} + "/" + ref.run_id;
    for (const auto& dir : {root_ + "/versions", root_ + "/versions/" + std::string{pool}, run_dir})
      if (auto ok = make_dir(dir); !ok)
        return std::move(ok).error();
    auto name = attempt_name(ref.version);
    auto dir = run_dir + "/" + name;
    if (auto ok = make_dir(dir); !ok)
      return std::move(ok).error();
    return std::unique_ptr<shard_sink>{
      std::make_unique<file_sink>(*this, std::string{pool}, ref, dir, name)};
  }

  result<std::vector<std::string>> claimed_runs(std::string_view pool) override {
    std::vector<std::string> runs;
    const auto prefix = boot_prefix(pool);
    std::unique_ptr<rocksdb::Iterator> it{db_->NewIterator({}, meta())};
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next())
      runs.push_back(it->key().ToString().substr(prefix.size()));
    if (!it->status().ok())
      return backend(it->status(), "listing the runs of pool '" + std::string{pool} + "'");
    return runs;
  }

  result<std::vector<std::string>> pools() override {
    std::vector<std::string> out;
    const auto prefix = "ptr" + std::string(1, sep);
    std::unique_ptr<rocksdb::Iterator> it{db_->NewIterator({}, meta())};
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next())
      out.push_back(it->key().ToString().substr(prefix.size()));
    if (!it->status().ok())
      return backend(it->status(), "listing the pools");
    return out;
  }

  result<std::vector<stored_version>> published_versions(std::string_view pool,
                                                         std::string_view run) override {
    std::vector<stored_version> out;
    const auto prefix = done_prefix(pool, run);
    std::unique_ptr<rocksdb::Iterator> it{db_->NewIterator({}, meta())};
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      auto v = parse_number(it->key().ToString().substr(prefix.size()));
      if (v)
        out.push_back({*v, it->value() == "F"});
    }
    if (!it->status().ok())
      return backend(it->status(), "listing the versions of run '" + std::string{run} + "'");
    return out;
  }

  status delete_version(std::string_view pool, const version_ref& ref) override {
    auto layout = load_layout(pool, ref);
    // The records go first, in one synced batch: the version is unreadable
    // before any byte of it is.
    rocksdb::WriteBatch batch;
    batch.Delete(meta(), done_key(pool, ref));
    batch.Delete(manifests(), manifest_key(pool, ref));
    batch.Delete(manifests(), layout_key(pool, ref));
    auto s = db_->Write(sync_, &batch);
    if (!s.ok())
      return backend(s, "deleting " + to_string(ref));
    forget_layout(pool, ref);
    if (layout)
      remove_tree(attempt_dir(pool, ref, layout->location));
    return {};
  }

private:
  rocksdb::ColumnFamilyHandle* meta() const { return cfs_[0]; }
  rocksdb::ColumnFamilyHandle* manifests() const { return cfs_[1]; }

  std::string shard_path(std::string_view pool, const version_ref& ref, std::string_view location,
                         std::string_view shard) const {
    return attempt_dir(pool, ref, location) + "/" + std::string{shard};
  }

  /// An open shard file, from the cache of recently read ones.
  result<std::shared_ptr<rocksdb::FSRandomAccessFile>> open_for_read(const std::string& path) {
    uint64_t forgotten = 0;
    {
      std::lock_guard guard{files_mutex_};
      if (auto it = open_files_.find(path); it != open_files_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second.second);
        return it->second.first;
      }
      forgotten = files_forgotten_;
    }
    std::unique_ptr<rocksdb::FSRandomAccessFile> raw;
    auto s = fs_->NewRandomAccessFile(path, rocksdb::FileOptions{}, &raw, nullptr);
    if (!s.ok())
      return make_error(s.IsNotFound() || s.IsPathNotFound() ? errc::corrupt_data
                                                             : errc::backend_failure,
                        "cannot open a shard file of the store: " + s.ToString());
    raw->Hint(rocksdb::FSRandomAccessFile::kSequential);
    std::shared_ptr<rocksdb::FSRandomAccessFile> file{std::move(raw)};
    std::lock_guard guard{files_mutex_};
    if (auto it = open_files_.find(path); it != open_files_.end())
      return it->second.first;
    // A file opened while files were being forgotten may be one that was
    // just deleted: it serves this read only, or its disk space would stay
    // held until the cache evicts it.
    if (files_forgotten_ != forgotten)
      return file;
    lru_.push_front(path);
    open_files_.emplace(path, std::make_pair(file, lru_.begin()));
    while (open_files_.size() > max_open_files) {
      open_files_.erase(lru_.back());
      lru_.pop_back();
    }
    return file;
  }

  /// Closes cached files under `dir` (deleted or replaced).
  void forget_files(const std::string& dir) {
    std::lock_guard guard{files_mutex_};
    ++files_forgotten_;
    const auto prefix = dir + "/";
    for (auto it = open_files_.begin(); it != open_files_.end();) {
      if (it->first.starts_with(prefix)) {
        lru_.erase(it->second.second);
        it = open_files_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> cfs_;
  std::shared_ptr<rocksdb::FileSystem> fs_;
  std::string root_;
  rocksdb::WriteOptions sync_;
  std::mutex files_mutex_;
  /// `forget_files` calls so far.
  uint64_t files_forgotten_ = 0;
  std::list<std::string> lru_;
  std::unordered_map<std::string, std::pair<std::shared_ptr<rocksdb::FSRandomAccessFile>,
                                            std::list<std::string>::iterator>>
    open_files_;
};

file_sink::~file_sink() {
  flusher_.reset();
  if (finished_)
    return;
  if (file_)
    (void) file_->Close({}, nullptr);
  file_.reset();
  store_.remove_tree(dir_);
}

status file_sink::open_shard(std::string_view name, uint64_t size) {
  if (file_)
    return make_error(errc::invalid_argument,
                      "the previous shard of " + to_string(ref_) + " was not closed");
  file_name_ = dir_ + "/" + std::string{name};
  rocksdb::FileOptions opts;
  // Large shards go direct where the file system allows it.
  opts.use_direct_writes = size >= direct_threshold;
  auto s = store_.fs().NewWritableFile(file_name_, opts, &file_, nullptr);
  if (!s.ok() && opts.use_direct_writes) {
    opts.use_direct_writes = false;
    s = store_.fs().NewWritableFile(file_name_, opts, &file_, nullptr);
  }
  if (!s.ok())
    return make_error(errc::backend_failure, "cannot create " + file_name_ + ": " + s.ToString());
  direct_ = opts.use_direct_writes;
  filled_ = 0;
  if (direct_) {
    alignment_ = std::max<size_t>(file_->GetRequiredBufferAlignment(), 512);
    if (!buffer_) {
      auto b = gpu::staging_allocator().allocate(direct_buffer);
      if (!b)
        return std::move(b).error();
      buffer_ = std::move(*b);
    }
  }
  // One extent where the file system allows it; a failure here is harmless.
  if (size > 0)
    (void) file_->Allocate(0, size, {}, nullptr);
  written_ = 0;
  synced_ = 0;
  flush_asked_at_ = 0;
  if (direct_ && size >= 2 * flush_every)
    flusher_ = std::make_unique<background_flusher>(file_name_);
  return {};
}

void file_sink::maybe_flush() {
  if (flusher_ && written_ - flush_asked_at_ >= flush_every) {
    flusher_->request();
    flush_asked_at_ = written_;
  }
}

status file_sink::stop_flusher() {
  if (!flusher_)
    return {};
  const int err = flusher_->stop();
  flusher_.reset();
  if (err != 0)
    return make_error(errc::backend_failure,
                      "flushing " + file_name_ + " to the device: " + std::strerror(err));
  return {};
}

status file_sink::flush_buffer(size_t length) {
  auto s = file_->Append(rocksdb::Slice{reinterpret_cast<const char*>(buffer_.data()), length}, {},
                         nullptr);
  if (!s.ok())
    return make_error(errc::backend_failure, "writing " + file_name_ + ": " + s.ToString());
  filled_ = 0;
  return {};
}

status file_sink::append(std::span<const std::byte> bytes) {
  if (!file_)
    return make_error(errc::invalid_argument, "no shard of " + to_string(ref_) + " is open");
  if (direct_) {
    while (!bytes.empty()) {
      const size_t take = std::min(bytes.size(), buffer_.size() - filled_);
      std::memcpy(buffer_.data() + filled_, bytes.data(), take);
      filled_ += take;
      bytes = bytes.subspan(take);
      written_ += take;
      if (filled_ == buffer_.size()) {
        if (auto ok = flush_buffer(filled_); !ok)
          return ok;
        maybe_flush();
      }
    }
    return {};
  }
  auto s = file_->Append(rocksdb::Slice{reinterpret_cast<const char*>(bytes.data()), bytes.size()},
                         {}, nullptr);
  if (!s.ok())
    return make_error(errc::backend_failure, "writing " + file_name_ + ": " + s.ToString());
  written_ += bytes.size();
  if (written_ - synced_ >= writeback_every) {
    // Starts writeback of what is written so far; does not wait.
    (void) file_->RangeSync(synced_, written_ - synced_, {}, nullptr);
    synced_ = written_;
  }
  return {};
}

status file_sink::close_shard() {
  if (!file_)
    return {};
  if (direct_ && filled_ > 0) {
    // The tail goes out padded to a whole block; the file is then cut to size.
    const size_t padded = (filled_ + alignment_ - 1) / alignment_ * alignment_;
    std::memset(buffer_.data() + filled_, 0, padded - filled_);
    if (auto ok = flush_buffer(padded); !ok)
      return ok;
    auto t = file_->Truncate(written_, {}, nullptr);
    if (!t.ok())
      return make_error(errc::backend_failure, "truncating " + file_name_ + ": " + t.ToString());
  }
  if (auto ok = stop_flusher(); !ok)
    return ok;
  auto s = file_->Sync({}, nullptr);
  if (s.ok())
    s = file_->Close({}, nullptr);
  file_.reset();
  if (!s.ok())
    return make_error(errc::backend_failure, "syncing " + file_name_ + ": " + s.ToString());
  return {};
}

status file_sink::finish(const manifest& m, version_layout layout) {
  if (auto ok = close_shard(); !ok)
    return ok;
  // The directory entries (and the new directories above) are durable
  // before a record names them.
  const auto run_dir = dir_.substr(0, dir_.rfind('/'));
  const auto pool_dir = run_dir.substr(0, run_dir.rfind('/'));
  for (const auto& d : {dir_, run_dir, pool_dir})
    if (auto ok = store_.sync_dir(d); !ok)
      return ok;
  layout.location = name_;
  if (auto ok = store_.record_attempt(pool_, m, layout); !ok)
    return ok;
  finished_ = true;
  return {};
}

} // namespace

uint64_t background_shard_flushes() noexcept {
  return flushes_made.load(std::memory_order_relaxed);
}

result<std::unique_ptr<store_backend>> open_rocksdb_store(const std::string& path,
                                                          rocksdb_options opts) {
  rocksdb::DBOptions db_opts;
  db_opts.create_if_missing = opts.create_if_missing;
  db_opts.create_missing_column_families = true;
  if (opts.env)
    db_opts.env = opts.env.get();
  rocksdb::ColumnFamilyOptions small;
  std::vector<std::string> names{rocksdb::kDefaultColumnFamilyName, "manifests"};
  // A store of an older schema has more families; open them all so the
  // schema check can say what it found.
  std::vector<std::string> existing;
  if (rocksdb::DB::ListColumnFamilies(db_opts, path, &existing).ok())
    for (const auto& n : existing)
      if (std::find(names.begin(), names.end(), n) == names.end())
        names.push_back(n);
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const auto& n : names)
    descriptors.push_back({n, small});
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  auto s = rocksdb::DB::Open(db_opts, path, descriptors, &handles, &raw);
  if (!s.ok())
    return make_error(errc::backend_failure, "opening store at '" + path + "': " + s.ToString());
  auto fs = opts.env ? opts.env->GetFileSystem() : rocksdb::FileSystem::Default();
  auto store =
    std::make_unique<rocksdb_store>(std::unique_ptr<rocksdb::DB>{raw}, handles, fs, path);
  if (auto ok = store->check_schema(); !ok)
    return std::move(ok).error();
  if (auto ok = store->collect_garbage(); !ok)
    return std::move(ok).error();
  return std::unique_ptr<store_backend>{std::move(store)};
}

} // namespace stitch::store
