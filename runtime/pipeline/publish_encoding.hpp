#pragma once

// Internal to runtime/pipeline: the buffers and encoders one publish works
// with (runtime/pipeline/publisher.cpp). Not part of the folder's interface.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <pthread.h>

#include "gpu/host_buffer.hpp"

#include "runtime/core/delta_codec.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/core/safetensors.hpp"
#include "runtime/core/shard_plan.hpp"
#include "runtime/core/store_port.hpp"
#include "runtime/pipeline/pipeline.hpp"
#include "runtime/pipeline/publisher.hpp"
#include "runtime/pipeline/tensor_stream.hpp"

namespace stitch::pipeline::detail {

namespace fs = std::filesystem;

/// A file that exists only while it is open, `size` bytes: created unlinked
/// in `dir` (the system's temporary directory when empty), so a crash leaves
/// nothing behind.
result<int> open_scratch_file(const fs::path& dir, uint64_t size);
status pwrite_all(int fd, uint64_t offset, std::span<const std::byte> bytes);
status pread_all(int fd, uint64_t offset, std::span<std::byte> out);

/// Why two tensor lists cannot be related by a delta, or nullopt when they can.
std::optional<std::string> layout_difference(const std::vector<tensor_header>& before,
                                             const std::vector<tensor_header>& after);

/// Feeds `count` zero bytes to `c` (untouched bytes of a touched tensor).
status feed_zeros(delta::stream_compressor& c, uint64_t count, std::vector<std::byte>& out);

/// The manifest entries of a version's non-tensor files, checked.
result<std::map<std::string, file_entry>>
describe_files(const std::map<std::string, std::string>& files);

/// Adds a version's non-tensor files to `writer`.
status add_files(version_writer& writer, const std::map<std::string, std::string>& files);

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

/// An encoding thread's room for one chunk's run list (`xor-sparse`):
/// allocated once at its largest, never zeroed, so only the pages a run list
/// fills are ever touched.

/// The stream items of a full anchor of `tensors`, in order.
std::vector<shard_streamer::item> anchor_items(const std::vector<tensor_header>& tensors);

/// The manifest of a full anchor of `tensors` with checksums `sums`.
manifest anchor_manifest(const version_ref& ref, const std::vector<tensor_header>& tensors,
                         const shard_streamer& shards, std::map<std::string, uint64_t> sums);

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

} // namespace stitch::pipeline::detail
