#include "runtime/pipeline/publisher.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <thread>

#include <pthread.h>

#include "gpu/host_buffer.hpp"
#include "runtime/core/checksum.hpp"
#include "runtime/core/delta_codec.hpp"
#include "runtime/core/version_ref.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/pipeline.hpp"

namespace stitch::pipeline {

namespace fs = std::filesystem;

namespace {

/// A file that exists only while it is open: created unlinked, so a crash
/// leaves nothing behind.
result<int> open_scratch_file(const fs::path& dir, uint64_t size) {
  std::error_code ec;
  fs::path where = dir.empty() ? fs::temp_directory_path(ec) : dir;
  if (ec)
    return make_error(errc::backend_failure, "no temporary directory: " + ec.message());
  fs::create_directories(where, ec);
  int fd = ::open(where.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    // File systems without O_TMPFILE: create, then unlink at once.
    std::string name = (where / "stitch-scratch-XXXXXX").string();
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0)
      ::unlink(name.c_str());
  }
  if (fd < 0)
    return make_error(errc::backend_failure, "cannot create a scratch file in " + where.string()
                                               + ": " + errno_text(errno));
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int err = errno;
    ::close(fd);
    return make_error(errc::backend_failure, "cannot size a scratch file in " + where.string()
                                               + " to " + std::to_string(size)
                                               + " bytes: " + errno_text(err));
  }
  return fd;
}

status pwrite_all(int fd, uint64_t offset, std::span<const std::byte> bytes) {
  return write_file_range(fd, offset, bytes, "a scratch file");
}

status pread_all(int fd, uint64_t offset, std::span<std::byte> out) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n =
      ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return make_error(errc::backend_failure,
                        "reading a scratch file: " + (n < 0 ? errno_text(errno) : "it is short"));
    done += static_cast<size_t>(n);
  }
  return {};
}

/// Bytes kept in host memory up to a bound, in an unlinked scratch file beyond.
class spill_buffer {
public:
  spill_buffer(uint64_t memory_bound, fs::path dir) : bound_(memory_bound), dir_(std::move(dir)) {}
  ~spill_buffer() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  spill_buffer(const spill_buffer&) = delete;
  spill_buffer& operator=(const spill_buffer&) = delete;

  /// Appends; returns where the bytes start.
  result<uint64_t> append(std::span<const std::byte> bytes) {
    const uint64_t at = size_;
    if (fd_ < 0 && memory_.size() + bytes.size() <= bound_) {
      memory_.insert(memory_.end(), bytes.begin(), bytes.end());
    } else {
      if (fd_ < 0) {
        auto fd = open_scratch_file(dir_, 0);
        if (!fd)
          return std::move(fd).error();
        fd_ = *fd;
        if (auto ok = pwrite_all(fd_, 0, memory_); !ok)
          return std::move(ok).error();
        memory_.clear();
        memory_.shrink_to_fit();
      }
      if (auto ok = pwrite_all(fd_, at, bytes); !ok)
        return std::move(ok).error();
    }
    size_ += bytes.size();
    return at;
  }

  status read(uint64_t offset, std::span<std::byte> out) const {
    if (fd_ >= 0)
      return pread_all(fd_, offset, out);
    std::memcpy(out.data(), memory_.data() + offset, out.size());
    return {};
  }

  /// Overwrites bytes appended earlier.
  status patch(uint64_t offset, std::span<const std::byte> bytes) {
    if (fd_ >= 0)
      return pwrite_all(fd_, offset, bytes);
    std::memcpy(memory_.data() + offset, bytes.data(), bytes.size());
    return {};
  }

  /// Empties it; memory keeps its capacity for the next use.
  void clear() {
    memory_.clear();
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = -1;
    size_ = 0;
  }

private:
  uint64_t bound_;
  fs::path dir_;
  std::vector<std::byte> memory_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// A run's remembered last version: its tensors' bytes end to end, in host
/// memory or in an unlinked scratch file.
class version_copy {
public:
  static result<std::shared_ptr<version_copy>> make(uint64_t size, bool in_memory,
                                                    const fs::path& scratch_dir) {
    std::shared_ptr<version_copy> c{new version_copy()};
    c->size_ = size;
    if (in_memory) {
      auto buffer = gpu::staging_allocator().allocate(size);
      if (!buffer)
        return std::move(buffer).error();
      c->memory_ = std::move(*buffer);
    } else {
      auto fd = open_scratch_file(scratch_dir, size);
      if (!fd)
        return std::move(fd).error();
      c->fd_ = *fd;
    }
    return c;
  }
  ~version_copy() {
    if (fd_ >= 0)
      ::close(fd_);
  }

  bool in_memory() const noexcept { return fd_ < 0; }
  uint64_t size() const noexcept { return size_; }
  /// The bytes, for a copy in memory.
  std::span<const std::byte> memory() const noexcept {
    return {memory_.data(), in_memory() ? size_ : 0};
  }

  /// `n` bytes at `offset`: a view of memory, or read into `scratch` (at
  /// least `n` bytes; unused for a copy in memory).
  result<std::span<const std::byte>> read(uint64_t offset, size_t n,
                                          std::span<std::byte> scratch) const {
    if (in_memory())
      return std::span<const std::byte>{memory_.data() + offset, n};
    if (auto ok = pread_all(fd_, offset, scratch.first(n)); !ok)
      return std::move(ok).error();
    return std::span<const std::byte>{scratch.first(n)};
  }

  status write(uint64_t offset, std::span<const std::byte> bytes) {
    if (in_memory()) {
      std::memcpy(memory_.data() + offset, bytes.data(), bytes.size());
      return {};
    }
    return pwrite_all(fd_, offset, bytes);
  }

private:
  version_copy() = default;
  gpu::host_buffer memory_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// Why two tensor lists cannot be related by a delta, or nullopt when they can.
std::optional<std::string> layout_difference(const std::vector<tensor_header>& before,
                                             const std::vector<tensor_header>& after) {
  auto b = before.begin();
  auto a = after.begin();
  for (; b != before.end() && a != after.end(); ++a, ++b) {
    if (a->name != b->name) {
      const bool added = a->name < b->name;
      return "tensor " + in_quotes(added ? a->name : b->name)
             + (added ? " was added" : " was removed");
    }
    if (a->type != b->type)
      return "tensor " + in_quotes(a->name) + " changed dtype from "
             + std::string{safetensors::to_string(b->type)} + " to "
             + std::string{safetensors::to_string(a->type)};
    if (a->shape != b->shape)
      return "tensor " + in_quotes(a->name) + " changed shape";
  }
  if (a != after.end())
    return "tensor " + in_quotes(a->name) + " was added";
  if (b != before.end())
    return "tensor " + in_quotes(b->name) + " was removed";
  return std::nullopt;
}

/// Feeds `count` zero bytes to `c` (untouched bytes of a touched tensor).
status feed_zeros(delta::stream_compressor& c, uint64_t count, std::vector<std::byte>& out) {
  static const std::vector<std::byte> zero(size_t{1} << 20, std::byte{0});
  while (count > 0) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(count, zero.size()));
    if (auto ok = c.update(std::span{zero}.first(k), out); !ok)
      return ok;
    count -= k;
  }
  return {};
}

/// Writes the shards of a version as its tensors stream in, in the order of
/// `plan`: each shard's safetensors header before its first tensor.
class shard_streamer {
public:
  struct item {
    std::string name;
    safetensors::dtype type;
    std::vector<uint64_t> shape;
    uint64_t size;
  };

  static result<shard_streamer> plan(std::vector<item> items, uint64_t max_shard_bytes,
                                     const safetensors::metadata_map& metadata) {
    shard_streamer s;
    std::vector<shard_input> inputs;
    for (const auto& it : items)
      inputs.push_back({it.name, it.size});
    auto p = plan_shards(inputs, max_shard_bytes);
    if (!p)
      return std::move(p).error();
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < items.size(); ++i)
      index[items[i].name] = i;
    for (size_t k = 0; k < p->shards.size(); ++k) {
      const auto& names = p->shard_tensors[k];
      std::vector<safetensors::tensor_spec> specs;
      for (const auto& name : names) {
        const auto& it = items[index.at(name)];
        specs.push_back({it.name, it.type, it.shape});
      }
      auto header = safetensors::serialize_header(specs, metadata);
      if (!header)
        return std::move(header).error();
      s.headers_.push_back(std::move(header->bytes));
    }
    s.plan_ = std::move(*p);
    return s;
  }

  const shard_plan& layout() const noexcept { return plan_; }

  /// The next bytes of the version's tensors, in order: each shard opens
  /// (its safetensors header first) when its bytes begin.
  status write(version_writer& w, std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      if (left_ == 0)
        if (auto ok = open_next(w); !ok)
          return ok;
      const size_t take = static_cast<size_t>(std::min<uint64_t>(left_, bytes.size()));
      if (auto ok = w.write(bytes.first(take)); !ok)
        return ok;
      left_ -= take;
      bytes = bytes.subspan(take);
    }
    return {};
  }

  /// Opens the shards still to come (those holding only empty tensors).
  status finish(version_writer& w) {
    while (next_ < plan_.shards.size())
      if (auto ok = open_next(w); !ok)
        return ok;
    return {};
  }

  /// Fills the manifest's shard fields.
  void describe(manifest& m) const {
    m.shards = plan_.shards;
    m.weight_map = plan_.weight_map;
    m.total_size = plan_.total_size;
  }

private:
  status open_next(version_writer& w) {
    if (next_ >= plan_.shards.size())
      return make_error(errc::invalid_argument, "more bytes than the version's shards hold");
    const size_t k = next_++;
    if (auto ok = w.begin_shard(plan_.shards[k], headers_[k].size() + plan_.shard_bytes[k]); !ok)
      return ok;
    left_ = plan_.shard_bytes[k];
    return w.write(headers_[k]);
  }

  shard_plan plan_;
  std::vector<std::vector<std::byte>> headers_;
  size_t next_ = 0;
  uint64_t left_ = 0;
};

std::vector<shard_streamer::item> anchor_items(const std::vector<tensor_header>& tensors) {
  std::vector<shard_streamer::item> items;
  for (const auto& t : tensors)
    items.push_back({t.name, t.type, t.shape, t.size});
  return items;
}

/// The manifest of a full anchor of `tensors` with checksums `sums`.
manifest anchor_manifest(const version_ref& ref, const std::vector<tensor_header>& tensors,
                         const shard_streamer& shards, std::map<std::string, uint64_t> sums) {
  manifest m;
  m.ref = ref;
  m.kind = version_kind::full;
  shards.describe(m);
  m.checksums = std::move(sums);
  for (const auto& t : tensors) {
    m.touched.push_back(t.name);
    m.tensor_specs[t.name] = {std::string{safetensors::to_string(t.type)}, t.shape};
  }
  return m;
}

/// The manifest entries of a version's non-tensor files, checked.
result<std::map<std::string, file_entry>>
describe_files(const std::map<std::string, std::string>& files) {
  std::map<std::string, file_entry> out;
  for (const auto& [name, bytes] : files)
    out.emplace(name, file_entry{bytes.size(), checksum::tree_checksum(std::as_bytes(
                                                 std::span{bytes.data(), bytes.size()}))});
  if (auto ok = validate_files(out); !ok)
    return make_error(errc::invalid_argument, ok.error().message);
  return out;
}

status add_files(version_writer& writer, const std::map<std::string, std::string>& files) {
  for (const auto& [name, bytes] : files)
    if (auto ok = writer.add_file(name, std::as_bytes(std::span{bytes.data(), bytes.size()})); !ok)
      return ok;
  return {};
}

} // namespace

std::vector<std::byte> encode_delta_frame(std::span<const std::byte> payload) {
  std::vector<std::byte> frame(delta_frame_prefix + payload.size());
  uint64_t length = payload.size();
  for (size_t i = 0; i < delta_frame_prefix; ++i)
    frame[i] = static_cast<std::byte>((length >> (8 * i)) & 0xff);
  if (!payload.empty())
    std::memcpy(frame.data() + delta_frame_prefix, payload.data(), payload.size());
  return frame;
}

struct publisher::run_state {
  uint64_t version = 0;
  /// nullopt when unknown (adopted from the store): the next one anchors.
  std::optional<uint64_t> last_anchor;
  manifest published;
  std::vector<tensor_header> tensors;
  /// Where each tensor starts in `copy`.
  std::vector<uint64_t> offsets;
  /// Shared with the peers' readers of the version it holds (a publisher
  /// offers it), so that replacing it never frees bytes they read.
  std::shared_ptr<version_copy> copy;
  /// `copy` holds `version`'s bytes (false while a publish rewrites it).
  bool valid = false;
};

/// An encoding thread's room for one chunk's run list (`xor-sparse`):
/// allocated once at its largest, never zeroed, so only the pages a run list
/// fills are ever touched.
class run_list {
public:
  result<std::span<std::byte>> room(size_t n) {
    if (n > size_) {
      bytes_.reset(new (std::nothrow) std::byte[n]);
      size_ = bytes_ ? n : 0;
      if (!bytes_)
        return make_error(errc::limit_exceeded, "out of memory for a delta's run list of "
                                                  + std::to_string(n) + " bytes");
    }
    return std::span{bytes_.get(), n};
  }

private:
  std::unique_ptr<std::byte[]> bytes_;
  size_t size_ = 0;
};

/// Where a delta's frames are made, on two threads of its own while the
/// publishing thread reads, compares, XORs and hashes the next chunks. Each
/// chunk of a changed tensor (XORed bytes, or zeros where nothing changed)
/// becomes a zstd frame of its own, so chunks compress in parallel: for
/// `xor-sparse` the frame of the chunk's run list, for `xor` of its XOR
/// bytes. A tensor's delta payload is its chunks' frames back to back (a
/// zstd stream of concatenated frames, which every reader decodes as one),
/// behind the 8-byte length prefix. Results are appended in submission order.
class frame_encoder {
public:
  struct frame_ref {
    size_t tensor;
    uint64_t at;
    uint64_t size;
  };
  static constexpr size_t workers = 2;

  static result<std::unique_ptr<frame_encoder>> start(uint64_t chunk, fs::path scratch_dir) {
    std::unique_ptr<frame_encoder> e{new frame_encoder(chunk * 4, std::move(scratch_dir))};
    // Two buffers per worker: one compressing, one being filled.
    if (auto ok = e->ring_.allocate(2 * workers, chunk); !ok)
      return std::move(ok).error();
    for (size_t k = 0; k < workers; ++k)
      e->threads_.emplace_back([raw = e.get()] { raw->run(); });
    return e;
  }
  ~frame_encoder() {
    {
      std::lock_guard lock{mutex_};
      stopping_ = true;
    }
    changed_.notify_all();
    for (auto& t : threads_)
      t.join();
  }
  frame_encoder(const frame_encoder&) = delete;
  frame_encoder& operator=(const frame_encoder&) = delete;

  /// Starts a publish's frames: at `limit` bytes the delta does not pay.
  /// Waits for an earlier publish's work, if any is left (a failed one).
  void reset(uint64_t limit, int level, delta_encoding encoding) {
    std::unique_lock lock{mutex_};
    changed_.wait(lock, [&] { return appended_ == submitted_; });
    if (auto held = ring_.release_acquired())
      ring_.free.push_back(*held);
    failure_ = {};
    frames_.clear();
    refs_.clear();
    bytes_ = 0;
    limit_ = limit;
    level_ = level;
    encoding_ = encoding;
    gave_up_ = false;
  }
  /// The frames of tensor `tensor` start.
  status begin(size_t tensor) { return queue({job::begin, tensor, 0, 0}); }
  /// `n` unchanged bytes (zeros in the XOR).
  status zeros(uint64_t n) {
    for (uint64_t left = n; left > 0;) {
      const uint64_t k = std::min<uint64_t>(left, ring_.buffers.front().size());
      if (auto ok = queue({job::zeros, 0, 0, static_cast<size_t>(k)}); !ok)
        return ok;
      left -= k;
    }
    return {};
  }
  /// A buffer to XOR the next chunk into; waits for one.
  result<std::span<std::byte>> acquire() {
    std::unique_lock lock{mutex_};
    return ring_.acquire(lock, changed_, failure_);
  }
  /// Compresses the first `n` bytes of the acquired buffer.
  status submit(size_t n) {
    result<size_t> buffer = 0;
    {
      std::lock_guard lock{mutex_};
      buffer = ring_.release_acquired();
    }
    if (!buffer)
      return std::move(buffer).error();
    return queue({job::bytes, 0, *buffer, n});
  }
  /// The frames of tensor `tensor` end.
  status end(size_t tensor) { return queue({job::end, tensor, 0, 0}); }
  /// Waits until everything submitted is appended; the first error.
  status finish() {
    std::unique_lock lock{mutex_};
    changed_.wait(lock, [&] { return appended_ == submitted_; });
    return failure_;
  }
  /// The delta stopped paying: the rest of this publish's work is dropped.
  bool gave_up() const noexcept { return gave_up_; }
  /// After `finish`: the frames, and where each tensor's lies.
  spill_buffer& frames() { return frames_; }
  const std::vector<frame_ref>& refs() const { return refs_; }

private:
  struct job {
    enum kind { begin, end, bytes, zeros } what;
    size_t tensor = 0;
    size_t buffer = 0;
    size_t n = 0;
    uint64_t seq = 0;
  };
  /// A job whose compressed bytes (if any) wait for their turn.
  struct finished {
    job what;
    std::vector<std::byte> out;
    status outcome;
  };

  frame_encoder(uint64_t memory_bound, fs::path dir) : frames_(memory_bound, std::move(dir)) {}

  status queue(job j) {
    {
      std::lock_guard lock{mutex_};
      if (!failure_) {
        if (j.what == job::bytes)
          ring_.free.push_back(j.buffer);
        return failure_;
      }
      j.seq = submitted_++;
      if (j.what == job::begin || j.what == job::end) {
        // Nothing to compress: in line for appending at once.
        done_.emplace(j.seq, finished{j, {}, {}});
        drain();
      } else {
        todo_.push_back(j);
      }
    }
    changed_.notify_all();
    return {};
  }

  void run() {
    pthread_setname_np(pthread_self(), "delta-encode");
    run_as_background_thread();
    std::optional<delta::stream_compressor> zstd;
    int zstd_level = 0;
    delta_encoding zstd_encoding = delta_encoding::none;
    run_list runs;
    for (;;) {
      job j;
      int level = 1;
      delta_encoding encoding = delta_encoding::xor_bytes;
      bool skip = false;
      {
        std::unique_lock lock{mutex_};
        changed_.wait(lock, [&] { return stopping_ || !todo_.empty(); });
        if (todo_.empty())
          return;
        j = todo_.front();
        todo_.pop_front();
        level = level_;
        encoding = encoding_;
        skip = !failure_ || gave_up_;
      }
      finished f{j, {}, {}};
      if (zstd && (zstd_level != level || zstd_encoding != encoding))
        zstd.reset();
      zstd_level = level;
      zstd_encoding = encoding;
      if (!skip)
        f.outcome = encoding == delta_encoding::xor_sparse
                      ? compress_runs(zstd, level, j, runs, f.out)
                      : compress(zstd, level, j, f.out);
      {
        std::lock_guard lock{mutex_};
        if (j.what == job::bytes)
          ring_.free.push_back(j.buffer);
        done_.emplace(j.seq, std::move(f));
        drain();
      }
      changed_.notify_all();
    }
  }

  /// One chunk as a zstd frame of its own.
  status compress(std::optional<delta::stream_compressor>& zstd, int level, const job& j,
                  std::vector<std::byte>& out) {
    if (auto ok = next_frame(zstd, j.n, level, delta::finder::xor_delta); !ok)
      return ok;
    auto fed = j.what == job::zeros ? feed_zeros(*zstd, j.n, out)
                                    : zstd->update(ring_.buffers[j.buffer].bytes().first(j.n), out);
    if (!fed)
      return fed;
    return zstd->finish(out);
  }

  /// Starts a frame of `n` bytes on the thread's context, made on first use
  /// (and again whenever the level or encoding changes, by the caller).
  static status next_frame(std::optional<delta::stream_compressor>& zstd, uint64_t n, int level,
                           delta::finder f) {
    if (zstd)
      return zstd->restart(n);
    auto started = delta::stream_compressor::start(n, level, 0, f);
    if (!started)
      return std::move(started).error();
    zstd.emplace(std::move(*started));
    return {};
  }

  /// One chunk's run list (`xor-sparse`) as a zstd frame of its own.
  status compress_runs(std::optional<delta::stream_compressor>& zstd, int level, const job& j,
                       run_list& runs, std::vector<std::byte>& out) {
    std::span<const std::byte> list;
    std::array<std::byte, 11> zero_run{};
    if (j.what == job::zeros) {
      list = std::span{zero_run}.first(delta::sparse_encode_zeros(j.n, zero_run));
    } else {
      auto room = runs.room(delta::sparse_encode_bound(j.n));
      if (!room)
        return std::move(room).error();
      list = room->first(delta::sparse_encode(ring_.buffers[j.buffer].bytes().first(j.n), *room));
    }
    if (auto ok = next_frame(zstd, list.size(), level, delta::finder::literals); !ok)
      return ok;
    if (auto ok = zstd->update(list, out); !ok)
      return ok;
    return zstd->finish(out);
  }

  /// Appends finished work in submission order (the lock is held).
  void drain() {
    for (auto it = done_.find(appended_); it != done_.end(); it = done_.find(appended_)) {
      finished f = std::move(it->second);
      done_.erase(it);
      ++appended_;
      if (!failure_ || gave_up_)
        continue;
      if (!f.outcome) {
        failure_ = std::move(f.outcome);
        continue;
      }
      if (auto ok = append(f); !ok)
        failure_ = std::move(ok);
    }
  }

  status append(const finished& f) {
    if (f.what.what == job::begin) {
      frame_at_ = bytes_;
      // The length prefix, filled in when the tensor's frames end.
      return add(std::array<std::byte, delta_frame_prefix>{});
    }
    if (f.what.what == job::end) {
      const uint64_t size = bytes_ - frame_at_;
      std::array<std::byte, delta_frame_prefix> prefix{};
      for (size_t k = 0; k < delta_frame_prefix; ++k)
        prefix[k] = static_cast<std::byte>(((size - delta_frame_prefix) >> (8 * k)) & 0xff);
      if (auto ok = frames_.patch(frame_at_, prefix); !ok)
        return ok;
      refs_.push_back({f.what.tensor, frame_at_, size});
      return {};
    }
    return add(f.out);
  }

  status add(std::span<const std::byte> bytes) {
    auto at = frames_.append(bytes);
    if (!at)
      return std::move(at).error();
    bytes_ += bytes.size();
    if (bytes_ >= limit_) {
      gave_up_ = true;
      frames_.clear();
      refs_.clear();
    }
    return {};
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  buffer_ring ring_;
  std::deque<job> todo_;
  std::map<uint64_t, finished> done_;
  uint64_t submitted_ = 0;
  uint64_t appended_ = 0;
  status failure_;
  bool stopping_ = false;
  std::atomic<bool> gave_up_{false};
  int level_ = 1;
  delta_encoding encoding_ = delta_encoding::xor_sparse;
  // What the appends build (under the lock).
  spill_buffer frames_;
  std::vector<frame_ref> refs_;
  uint64_t bytes_ = 0;
  uint64_t frame_at_ = 0;
  uint64_t limit_ = 0;
  std::vector<std::thread> threads_;
};

/// The buffers one publish works in, kept between publishes (fresh memory
/// costs page faults; a model's worth of publishes would fault in the same
/// buffers again and again).
struct publisher::work_buffers {
  gpu::host_buffer fresh;
  gpu::host_buffer old;
  /// Started by the first delta.
  std::unique_ptr<frame_encoder> encoder;
};

result<std::unique_ptr<publisher::work_buffers>> publisher::take_work_buffers() {
  {
    std::lock_guard guard{mutex_};
    if (!idle_buffers_.empty()) {
      auto w = std::move(idle_buffers_.back());
      idle_buffers_.pop_back();
      return w;
    }
  }
  auto w = std::make_unique<work_buffers>();
  for (auto* b : {&w->fresh, &w->old}) {
    auto got = gpu::staging_allocator().allocate(options_.chunk_bytes);
    if (!got)
      return std::move(got).error();
    *b = std::move(*got);
  }
  return w;
}

void publisher::give_back(std::unique_ptr<work_buffers> w) {
  std::lock_guard guard{mutex_};
  // One set per publish that may run at once is plenty.
  if (idle_buffers_.size() < 4)
    idle_buffers_.push_back(std::move(w));
}

publisher::publisher(store_backend& store, publisher_options options)
    : store_(store), options_(std::move(options)) {
  options_.chunk_bytes = std::clamp<uint64_t>(options_.chunk_bytes, 4096, uint64_t{256} << 20);
  if (options_.delta_format != delta_encoding::xor_bytes)
    options_.delta_format = delta_encoding::xor_sparse;
}

publisher::~publisher() = default;

std::shared_ptr<publisher::run_state>
publisher::find(const std::pair<std::string, std::string>& key) const {
  std::lock_guard guard{mutex_};
  auto it = runs_.find(key);
  if (it == runs_.end() || !it->second->valid)
    return nullptr;
  return it->second;
}

void publisher::forget(const std::pair<std::string, std::string>& key) {
  std::lock_guard guard{mutex_};
  auto it = runs_.find(key);
  if (it == runs_.end())
    return;
  if (it->second->copy && it->second->copy->in_memory())
    memory_in_use_ -= it->second->copy->size();
  runs_.erase(it);
}

std::optional<uint64_t> publisher::last_version(std::string_view pool,
                                                std::string_view run_id) const {
  auto s = find({std::string{pool}, std::string{run_id}});
  if (!s)
    return std::nullopt;
  return s->version;
}

uint64_t publisher::memory_in_use() const {
  std::lock_guard guard{mutex_};
  return memory_in_use_;
}

void publisher::watch(std::shared_ptr<remembered_watcher> w) {
  std::lock_guard guard{mutex_};
  watcher_ = std::move(w);
}

result<publish_report> publisher::publish(const publish_request& request,
                                          const tensor_set& full_weights) {
  for (const auto& [key, t] : full_weights)
    if (key != t.name)
      return make_error(errc::invalid_argument, "tensor " + in_quotes(t.name)
                                                  + " is stored under the key " + in_quotes(key));
  memory_stream source{full_weights};
  return publish(request, source);
}

/// What one publish works with.
struct publisher::pass {
  enum class mode : uint8_t {
    /// The store (or, for a dry run, the remembered copy) already has this
    /// version: check the bytes against it.
    verify,
    anchor,
    delta,
  };
};

result<publish_report> publisher::publish(const publish_request& request, tensor_stream& source) {
  using mode = pass::mode;
  if (auto ok = validate_pool(request.pool); !ok)
    return std::move(ok).error();
  if (auto ok = validate_run_id(request.run_id); !ok)
    return std::move(ok).error();
  const auto& tensors = source.tensors();
  if (auto ok = validate_headers(tensors); !ok)
    return std::move(ok).error();
  // The request's files, else the source's (a checkpoint directory's).
  const auto& file_bytes = request.files.empty() ? source.files() : request.files;
  auto described = describe_files(file_bytes);
  if (!described)
    return std::move(described).error();
  const auto& files = *described;

  const auto key = std::make_pair(request.pool, request.run_id);
  const version_ref ref{request.run_id, request.version};
  auto prev = find(key);
  // `prev` may be rewritten in place below: what it was, for later.
  const bool had_prev = prev != nullptr;
  const uint64_t prev_version = prev ? prev->version : 0;
  const std::optional<uint64_t> prev_anchor = prev ? prev->last_anchor : std::nullopt;
  uint64_t raw_bytes = 0;
  for (const auto& t : tensors)
    raw_bytes += t.size;

  // What the store holds, and a rewind, before a byte is read.
  std::optional<pointer_record> pointer;
  std::optional<manifest> existing;
  if (!request.dry_run) {
    auto p = store_.read_pointer(request.pool);
    if (!p)
      return std::move(p).error();
    pointer = *p;
    auto m = store_.read_manifest(request.pool, ref);
    if (m)
      existing = std::move(*m);
    else if (m.error().code != errc::not_found)
      return std::move(m).error();
    if (!existing && pointer && pointer->latest.run_id == ref.run_id
        && ref.version < pointer->latest.version) {
      auto decision = decide_pointer_move(
        pointer, pointer_proposal{ref, true, pointer->boot_version, std::nullopt});
      if (!decision)
        return std::move(decision).error();
    }
  }

  const bool copy_is_this_version = prev && prev->version == request.version;
  mode how = mode::delta;
  std::string reason;
  const manifest* expected = nullptr;
  if (existing) {
    how = mode::verify;
    expected = &*existing;
  } else if (request.dry_run && copy_is_this_version) {
    how = mode::verify;
    expected = &prev->published;
  } else if (request.force_anchor) {
    reason = "requested (--anchor)";
  } else if (!prev) {
    reason = "first version of run " + in_quotes(request.run_id) + " in pool "
             + in_quotes(request.pool) + " this publisher has seen";
  } else if (copy_is_this_version) {
    reason = "the store no longer holds the remembered version";
  } else if (prev->version + 1 != request.version) {
    reason = "the previous version in memory is " + std::to_string(prev->version) + ", not "
             + std::to_string(request.version - 1);
  } else if (auto diff = layout_difference(prev->tensors, tensors)) {
    reason = "the tensor set changed: " + *diff;
  } else if (!prev->last_anchor) {
    reason = "the run's last anchor is unknown";
  } else if (options_.anchor_every != 0
             && request.version - *prev->last_anchor >= options_.anchor_every) {
    reason = std::to_string(request.version - *prev->last_anchor) + " versions since anchor "
             + std::to_string(*prev->last_anchor)
             + " (anchor_every = " + std::to_string(options_.anchor_every) + ")";
  }
  if (how != mode::verify && !reason.empty())
    how = mode::anchor;

  // The remembered copy: read for a delta (and to verify against itself),
  // rewritten in place by whatever will be remembered after this publish.
  const bool compare_only = how == mode::verify && copy_is_this_version;
  const bool write_copy = !request.dry_run && !compare_only;
  std::shared_ptr<run_state> target;
  std::shared_ptr<remembered_watcher> watcher;
  {
    std::lock_guard guard{mutex_};
    watcher = watcher_;
  }
  // Peers stop reading the remembered version before its bytes change.
  if (write_copy && watcher)
    watcher->rewriting(request.pool, request.run_id);
  if (write_copy) {
    std::lock_guard guard{mutex_};
    auto& slot = runs_[key];
    if (slot && slot->copy && !layout_difference(slot->tensors, tensors)) {
      target = slot;
    } else {
      if (slot && slot->copy && slot->copy->in_memory())
        memory_in_use_ -= slot->copy->size();
      slot.reset();
      const bool fits = memory_in_use_ + raw_bytes <= options_.memory_limit;
      auto copy = version_copy::make(raw_bytes, fits, options_.scratch_dir);
      if (!copy) {
        runs_.erase(key);
        return std::move(copy).error();
      }
      if (fits)
        memory_in_use_ += raw_bytes;
      target = std::make_shared<run_state>();
      target->tensors = tensors;
      uint64_t at = 0;
      for (const auto& t : tensors) {
        target->offsets.push_back(at);
        at += t.size;
      }
      target->copy = std::move(*copy);
      slot = target;
    }
    // Until this publish succeeds the copy holds neither version for sure.
    target->valid = false;
  }
  auto failed = [&](stitch::error err) -> result<publish_report> {
    if (write_copy)
      forget(key);
    return err;
  };
  // The copy a delta or a comparison reads: the remembered one (which the
  // pass also rewrites, chunk by chunk, after reading it).
  const run_state* old = (how == mode::delta || compare_only) ? prev.get() : nullptr;

  const uint64_t chunk = options_.chunk_bytes;
  auto work = take_work_buffers();
  if (!work)
    return failed(std::move(work).error());
  // Back to the idle set whatever happens below.
  std::shared_ptr<work_buffers> held{
    work->release(), [this](work_buffers* w) { give_back(std::unique_ptr<work_buffers>{w}); }};
  const std::span<std::byte> fresh = held->fresh.bytes();
  const std::span<std::byte> scratch = held->old.bytes();

  // An anchor's bytes go to the store on a thread of their own, so the
  // store's writes overlap reading and hashing the next pieces.
  std::unique_ptr<version_writer> writer;
  std::optional<shard_streamer> anchor_shards;
  std::unique_ptr<buffer_pipeline> to_store;
  auto open_anchor = [&]() -> status {
    if (!anchor_shards) {
      auto planned =
        shard_streamer::plan(anchor_items(tensors), options_.max_shard_bytes, {{"format", "pt"}});
      if (!planned)
        return std::move(planned).error();
      anchor_shards = std::move(*planned);
    }
    if (request.dry_run)
      return {};
    auto w = store_.begin_version(request.pool, ref);
    if (!w)
      return std::move(w).error();
    writer = std::move(*w);
    auto p = buffer_pipeline::start(3, chunk, [&](std::span<const std::byte> bytes) {
      return anchor_shards->write(*writer, bytes);
    });
    if (!p)
      return std::move(p).error();
    to_store = std::move(*p);
    return {};
  };
  /// Ends the anchor's stream and stores it.
  auto commit_anchor = [&](const manifest& m) -> status {
    if (auto ok = to_store->finish(); !ok)
      return ok;
    if (auto ok = anchor_shards->finish(*writer); !ok)
      return ok;
    if (auto ok = add_files(*writer, file_bytes); !ok)
      return ok;
    return writer->commit(m);
  };
  if (how == mode::anchor)
    if (auto ok = open_anchor(); !ok)
      return failed(std::move(ok).error());

  // The delta's frames, compressed on the encoder's threads.
  bool delta_pays = how == mode::delta;
  if (delta_pays) {
    if (!held->encoder) {
      auto e = frame_encoder::start(chunk, options_.scratch_dir);
      if (!e)
        return failed(std::move(e).error());
      held->encoder = std::move(*e);
    }
    held->encoder->reset(raw_bytes, options_.zstd_level, options_.delta_format);
  }
  frame_encoder* const encoder = held->encoder.get();
  bool identical = true;
  std::map<std::string, uint64_t> sums;

  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    checksum::tree_hasher hasher;
    /// This tensor changed: its frame is being compressed.
    bool compressing = false;
    uint64_t zeros_pending = 0;
    for (uint64_t off = 0; off < t.size;) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, t.size - off));
      // Bytes the source already holds in memory (a client's pieces) are
      // hashed, compared and stored where they lie; others are read into a
      // buffer first.
      auto lent = source.borrow(i, off, n);
      if (!lent)
        return failed(std::move(lent).error());
      std::span<const std::byte> now;
      if (!lent->bytes.empty()) {
        now = lent->bytes;
        n = now.size();
      } else {
        std::span<std::byte> into = fresh.first(n);
        if (to_store) {
          auto buffer = to_store->acquire();
          if (!buffer)
            return failed(std::move(buffer).error());
          into = buffer->first(n);
        }
        if (auto ok = source.read(i, off, into); !ok)
          return failed(std::move(ok).error());
        now = into;
      }
      hasher.update(now);
      bool same = false;
      if (delta_pays && encoder->gave_up()) {
        // Not smaller than the weights: stop encoding, stream on.
        delta_pays = false;
        compressing = false;
      }
      if (old && (delta_pays || compare_only)) {
        auto before = old->copy->read(old->offsets[i] + off, n, scratch);
        if (!before)
          return failed(std::move(before).error());
        same = std::memcmp(before->data(), now.data(), n) == 0;
        identical = identical && same;
        // Untouched bytes are zeros in the XOR; a tensor compresses only
        // once its first change shows up.
        if (delta_pays && same && !compressing) {
          zeros_pending += n;
        } else if (delta_pays) {
          status sent;
          if (!compressing) {
            compressing = true;
            sent = encoder->begin(i);
            if (sent)
              sent = encoder->zeros(zeros_pending);
            zeros_pending = 0;
          }
          if (sent && same) {
            sent = encoder->zeros(n);
          } else if (sent) {
            auto x = encoder->acquire();
            if (!x)
              return failed(std::move(x).error());
            if (auto ok = delta::xor_encode(*before, now, x->first(n)); !ok)
              return failed(std::move(ok).error());
            sent = encoder->submit(n);
          }
          if (!sent)
            return failed(std::move(sent).error());
        }
      }
      if (write_copy && !same)
        if (auto ok = target->copy->write(target->offsets[i] + off, now); !ok)
          return failed(std::move(ok).error());
      if (to_store) {
        auto ok = lent->owner ? to_store->submit_external(now, std::move(lent->owner))
                              : to_store->submit(n);
        if (!ok)
          return failed(std::move(ok).error());
      }
      off += n;
    }
    sums[t.name] = hasher.digest();
    if (compressing && delta_pays)
      if (auto ok = encoder->end(i); !ok)
        return failed(std::move(ok).error());
  }
  if (how == mode::delta) {
    if (auto ok = encoder->finish(); !ok)
      return failed(std::move(ok).error());
    delta_pays = !encoder->gave_up();
  }

  publish_report report;
  report.raw_bytes = raw_bytes;
  manifest m;
  if (how == mode::verify) {
    if (sums != expected->checksums || !identical || expected->files != files)
      return failed(make_error(errc::version_exists, to_string(ref) + " is already stored in pool "
                                                       + in_quotes(request.pool)
                                                       + " with different content"));
    m = *expected;
    report.idempotent = true;
  } else if (how == mode::delta && delta_pays) {
    spill_buffer& frames = encoder->frames();
    const auto& frame_refs = encoder->refs();
    std::vector<shard_streamer::item> items;
    for (const auto& f : frame_refs)
      items.push_back({tensors[f.tensor].name, safetensors::dtype::u8, {f.size}, f.size});
    auto shards = shard_streamer::plan(items, options_.max_shard_bytes, {});
    if (!shards)
      return failed(std::move(shards).error());
    m.ref = ref;
    m.kind = version_kind::delta;
    m.base_version = request.version - 1;
    m.encoding = options_.delta_format;
    m.comp = compression::zstd;
    shards->describe(m);
    m.checksums = sums;
    for (const auto& f : frame_refs)
      m.touched.push_back(tensors[f.tensor].name);
    m.files = files;
    if (!request.dry_run) {
      auto w = store_.begin_version(request.pool, ref);
      if (!w)
        return failed(std::move(w).error());
      for (const auto& f : frame_refs)
        for (uint64_t off = 0; off < f.size; off += chunk) {
          auto piece = fresh.first(std::min<uint64_t>(chunk, f.size - off));
          if (auto ok = frames.read(f.at + off, piece); !ok)
            return failed(std::move(ok).error());
          if (auto ok = shards->write(**w, piece); !ok)
            return failed(std::move(ok).error());
        }
      if (auto ok = shards->finish(**w); !ok)
        return failed(std::move(ok).error());
      if (auto ok = add_files(**w, file_bytes); !ok)
        return failed(std::move(ok).error());
      if (auto ok = (*w)->commit(m); !ok)
        return failed(std::move(ok).error());
    }
  } else {
    if (how == mode::delta)
      reason = "the delta's bytes are not smaller than the full weights' "
               + std::to_string(raw_bytes) + " bytes";
    if (how == mode::delta) {
      // The second pass: the new bytes are in the remembered copy by now.
      if (auto ok = open_anchor(); !ok)
        return failed(std::move(ok).error());
      for (size_t i = 0; to_store && i < tensors.size(); ++i)
        for (uint64_t off = 0; off < tensors[i].size; off += chunk) {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, tensors[i].size - off));
          auto buffer = to_store->acquire();
          if (!buffer)
            return failed(std::move(buffer).error());
          auto bytes = target->copy->read(target->offsets[i] + off, n, *buffer);
          if (!bytes)
            return failed(std::move(bytes).error());
          if (bytes->data() != buffer->data())
            std::memcpy(buffer->data(), bytes->data(), n);
          if (auto ok = to_store->submit(n); !ok)
            return failed(std::move(ok).error());
        }
    }
    m = anchor_manifest(ref, tensors, *anchor_shards, sums);
    m.files = files;
    if (writer)
      if (auto ok = commit_anchor(m); !ok)
        return failed(std::move(ok).error());
  }
  report.kind = m.kind;
  report.touched = m.touched;
  report.stored_bytes = m.total_size;
  report.encoded_bytes = m.total_size;
  if (!m.is_full()) {
    report.encoded_bytes = 0;
    for (const auto& t : tensors)
      if (std::binary_search(m.touched.begin(), m.touched.end(), t.name))
        report.encoded_bytes += t.size;
  }
  report.reason_for_anchor = m.is_full() && !report.idempotent ? reason : std::string{};
  report.published = m;
  if (request.dry_run)
    return report;

  // The copy holds this version now: lend it before the pointer moves, so
  // that replicas the move wakes find the publisher among its holders.
  if (write_copy && watcher && target->copy->in_memory()) {
    host_weights w;
    w.version = ref;
    auto bytes = target->copy->memory();
    for (size_t i = 0; i < target->tensors.size(); ++i)
      w.tensors.push_back(
        {target->tensors[i].name, bytes.subspan(target->offsets[i], target->tensors[i].size)});
    w.keep = target->copy;
    watcher->remembered(request.pool, std::move(w));
  }

  // Durable first, then visible: move the pointer.
  const std::optional<version_ref> seen =
    pointer ? std::optional<version_ref>{pointer->latest} : std::nullopt;
  auto advance = [&] { return store_.compare_and_advance_pointer(request.pool, seen, ref); };
  if (pointer && pointer->latest == ref) {
    report.pointer = *pointer;
  } else if (had_prev || !m.is_full() || (pointer && pointer->latest.run_id == ref.run_id)) {
    auto moved = advance();
    if (!moved)
      return failed(std::move(moved).error());
    report.pointer = *moved;
  } else {
    auto claimed = store_.claim(request.pool, ref);
    if (claimed) {
      report.claimed = true;
      report.pointer = *claimed;
    } else if (claimed.error().code == errc::version_exists) {
      // The run was claimed here before at another boot: switch back to it.
      auto moved = advance();
      if (!moved)
        return failed(std::move(moved).error());
      report.pointer = *moved;
    } else {
      return failed(std::move(claimed).error());
    }
  }

  // Remember this version for the next delta.
  if (write_copy) {
    target->version = request.version;
    target->published = m;
    if (m.is_full())
      target->last_anchor = request.version;
    else if (had_prev && prev_version + 1 == request.version)
      target->last_anchor = prev_anchor;
    else
      target->last_anchor = std::nullopt;
    {
      std::lock_guard guard{mutex_};
      target->valid = true;
    }
  }
  return report;
}

} // namespace stitch::pipeline
