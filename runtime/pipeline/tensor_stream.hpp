#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/safetensors.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/host_tensors.hpp"

/// Where the tensors of a version being published come from, one pass over
/// their bytes (DESIGN §2: a checkpoint directory the node reads, tensors a
/// client streams in, a model in memory).
namespace stitch::pipeline {

/// One tensor of a stream: its name, dtype and shape, and its byte size.
struct tensor_header {
  std::string name;
  safetensors::dtype type = safetensors::dtype::u8;
  std::vector<uint64_t> shape;
  uint64_t size = 0;

  friend bool operator==(const tensor_header&, const tensor_header&) = default;
};

/// Checks a stream's tensor list: valid and unique names in ascending order,
/// dtypes and shapes whose byte size is `size`. Errors name the tensor.
status validate_headers(std::span<const tensor_header> tensors);

/// The tensors of a publish and then their bytes, tensor after tensor in
/// the order listed, each byte read once.
class tensor_stream {
public:
  virtual ~tensor_stream() = default;
  /// In ascending name order (the order of their bytes).
  virtual const std::vector<tensor_header>& tensors() const = 0;
  /// Fills `out` exactly with the next bytes: tensor `index` from `offset`.
  /// Calls come in order, (index, offset) continuing where the last ended.
  virtual status read(size_t index, uint64_t offset, std::span<std::byte> out) = 0;

  /// The next bytes where the stream already holds them, without a copy.
  struct borrowed {
    /// Up to the `max` asked, never past the tensor's end; empty when the
    /// stream lends nothing (then `read` the bytes).
    std::span<const std::byte> bytes;
    /// Keeps `bytes` valid for as long as it is held.
    std::shared_ptr<const void> owner;
  };
  /// Like `read`, in the same order, but lends the next bytes of tensor
  /// `index` from `offset` (at most `max`) instead of copying them: they
  /// count as read. Streams that hold no bytes in memory lend nothing.
  virtual result<borrowed> borrow(size_t index, uint64_t offset, size_t max) {
    (void) index;
    (void) offset;
    (void) max;
    return borrowed{};
  }
  /// The checkpoint's small non-tensor files (`config.json`, ...), by name;
  /// a publish keeps them with the version. None unless the source has them.
  virtual const std::map<std::string, std::string>& files() const {
    static const std::map<std::string, std::string> none;
    return none;
  }
};

/// Tensors held in memory (a built-in model, a test's weights).
class memory_stream final : public tensor_stream {
public:
  /// `weights` must outlive the stream.
  explicit memory_stream(const tensor_set& weights);
  const std::vector<tensor_header>& tensors() const override { return headers_; }
  status read(size_t index, uint64_t offset, std::span<std::byte> out) override;
  /// Lends the tensors' own bytes.
  result<borrowed> borrow(size_t index, uint64_t offset, size_t max) override;

private:
  std::vector<tensor_header> headers_;
  std::vector<const host_tensor*> tensors_;
  std::shared_ptr<const void> lent_ = std::make_shared<int>(0);
};

/// The tensors of an opened Hugging Face checkpoint directory, read from its
/// files (large reads with read-ahead, the file handles kept open).
class directory_stream final : public tensor_stream {
public:
  static result<std::unique_ptr<directory_stream>> open(const std::filesystem::path& directory);
  ~directory_stream() override;
  const std::vector<tensor_header>& tensors() const override { return headers_; }
  status read(size_t index, uint64_t offset, std::span<std::byte> out) override;
  const std::map<std::string, std::string>& files() const override { return files_; }

  /// Where tensor `index`'s bytes lie: a descriptor of its file (open while
  /// this stream lives) and the offset of its first byte; for sending them
  /// without reading them here (`sendfile`).
  struct location {
    int fd = -1;
    uint64_t offset = 0;
  };
  location locate(size_t index) const {
    const hf_tensor& t = *tensors_.at(index);
    return {fds_.at(t.file), t.offset};
  }

private:
  directory_stream() = default;
  hf_checkpoint checkpoint_;
  std::map<std::string, std::string> files_;
  std::vector<tensor_header> headers_;
  std::vector<const hf_tensor*> tensors_;
  /// One descriptor per file, by name.
  std::map<std::string, int> fds_;
};

/// Tensors another thread feeds in as they arrive (a client streaming them to
/// the publisher): `push` hands over the next bytes, the reading side blocks
/// until it has what it asked for. Memory is bounded by what the feeder has
/// pushed and the reader not yet consumed: each pushed piece reports when it
/// was consumed, and more than `max_pending` pieces waiting is refused.
class fed_stream final : public tensor_stream {
public:
  fed_stream(std::vector<tensor_header> tensors, size_t max_pending = 16);

  const std::vector<tensor_header>& tensors() const override { return headers_; }
  /// Blocks until the bytes are there, or fails when the stream was closed
  /// (with its error; without one: "truncated").
  status read(size_t index, uint64_t offset, std::span<std::byte> out) override;
  /// Lends the front piece's next bytes (the piece's owner keeps them); a
  /// piece lent to its end counts as consumed.
  result<borrowed> borrow(size_t index, uint64_t offset, size_t max) override;

  /// The next bytes; `consumed` runs on the reading thread once every byte of
  /// them was read. Refused past the declared total, past `max_pending`
  /// waiting pieces, and after `close`.
  status push(std::vector<char> bytes, std::function<void()> consumed);
  /// The same for bytes another object owns: `bytes` stay valid while
  /// `owner` lives (no copy on the way in).
  status push(std::shared_ptr<const void> owner, std::span<const char> bytes,
              std::function<void()> consumed);
  /// No more bytes will come; with `why`, readers fail with it.
  void close(std::optional<stitch::error> why = std::nullopt);

  /// Bytes the tensors declare, and bytes pushed so far.
  uint64_t total() const noexcept { return total_; }
  uint64_t pushed() const;
  /// Pushed bytes are waiting for the reader: the feeder waits on it, not
  /// the other way round.
  bool has_unread() const;

private:
  struct piece {
    std::shared_ptr<const void> owner;
    std::span<const char> bytes;
    size_t used = 0;
    std::function<void()> consumed;
  };

  std::vector<tensor_header> headers_;
  std::vector<uint64_t> starts_;
  uint64_t total_ = 0;
  size_t max_pending_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<piece> pieces_;
  uint64_t pushed_ = 0;
  uint64_t position_ = 0;
  bool closed_ = false;
  std::optional<stitch::error> why_;
};

} // namespace stitch::pipeline
