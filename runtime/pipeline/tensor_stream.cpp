#include "runtime/pipeline/tensor_stream.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "runtime/core/manifest.hpp"

namespace stitch::pipeline {

status validate_headers(std::span<const tensor_header> tensors) {
  if (tensors.empty())
    return make_error(errc::invalid_argument, "no tensors to publish");
  const std::string* previous = nullptr;
  for (const auto& t : tensors) {
    if (auto ok = validate_tensor_name(t.name); !ok)
      return ok;
    if (previous && !(*previous < t.name))
      return make_error(errc::invalid_argument,
                        "tensor '" + t.name
                          + "' is out of order or repeated (tensors come in "
                            "ascending name order, each once)");
    previous = &t.name;
    auto size = safetensors::byte_length(t.type, t.shape);
    if (!size)
      return make_error(errc::invalid_argument, "tensor '" + t.name + "': " + size.error().message);
    if (*size != t.size)
      return make_error(errc::invalid_argument,
                        "tensor '" + t.name + "' holds " + std::to_string(t.size)
                          + " bytes but its dtype and shape need " + std::to_string(*size));
  }
  return {};
}

memory_stream::memory_stream(const tensor_set& weights) {
  for (const auto& [name, t] : weights) {
    headers_.push_back({t.name, t.type, t.shape, t.bytes.size()});
    tensors_.push_back(&t);
  }
}

status memory_stream::read(size_t index, uint64_t offset, std::span<std::byte> out) {
  if (index >= tensors_.size() || offset > tensors_[index]->bytes.size()
      || out.size() > tensors_[index]->bytes.size() - offset)
    return make_error(errc::invalid_argument, "read past the end of a tensor");
  if (!out.empty())
    std::memcpy(out.data(), tensors_[index]->bytes.data() + offset, out.size());
  return {};
}

result<tensor_stream::borrowed> memory_stream::borrow(size_t index, uint64_t offset, size_t max) {
  if (index >= tensors_.size() || offset >= tensors_[index]->bytes.size() || max == 0)
    return make_error(errc::invalid_argument, "borrow past the end of a tensor");
  const auto& bytes = tensors_[index]->bytes;
  borrowed out;
  out.bytes = std::span<const std::byte>{bytes}.subspan(
    offset, static_cast<size_t>(std::min<uint64_t>(max, bytes.size() - offset)));
  // The weights outlive the stream (its contract): the owner only marks the
  // bytes as lent.
  out.owner = lent_;
  return out;
}

result<std::unique_ptr<directory_stream>> directory_stream::open(const std::filesystem::path& dir) {
  auto ckpt = open_hf_directory(dir);
  if (!ckpt)
    return std::move(ckpt).error();
  std::unique_ptr<directory_stream> s{new directory_stream()};
  s->checkpoint_ = std::move(*ckpt);
  for (const auto& [name, t] : s->checkpoint_.tensors) {
    s->headers_.push_back({t.name, t.type, t.shape, t.size});
    s->tensors_.push_back(&t);
  }
  for (const auto& file : s->checkpoint_.files) {
    auto fd = open_checkpoint_file(s->checkpoint_, file);
    if (!fd)
      return std::move(fd).error();
    s->fds_[file] = *fd;
  }
  auto files = read_checkpoint_files(dir);
  if (!files)
    return std::move(files).error();
  s->files_ = std::move(*files);
  return s;
}

directory_stream::~directory_stream() {
  for (const auto& [file, fd] : fds_)
    ::close(fd);
}

status directory_stream::read(size_t index, uint64_t offset, std::span<std::byte> out) {
  if (index >= tensors_.size() || offset > tensors_[index]->size
      || out.size() > tensors_[index]->size - offset)
    return make_error(errc::invalid_argument, "read past the end of a tensor");
  const hf_tensor& t = *tensors_[index];
  return read_file_range(fds_.at(t.file), t.offset + offset, out, t.file);
}

fed_stream::fed_stream(std::vector<tensor_header> tensors, size_t max_pending)
    : headers_(std::move(tensors)), max_pending_(std::max<size_t>(max_pending, 1)) {
  for (const auto& t : headers_) {
    starts_.push_back(total_);
    total_ += t.size;
  }
}

uint64_t fed_stream::pushed() const {
  std::lock_guard guard{mutex_};
  return pushed_;
}

bool fed_stream::has_unread() const {
  std::lock_guard guard{mutex_};
  return !pieces_.empty();
}

status fed_stream::push(std::vector<char> bytes, std::function<void()> consumed) {
  auto owned = std::make_shared<const std::vector<char>>(std::move(bytes));
  std::span<const char> view{*owned};
  return push(std::move(owned), view, std::move(consumed));
}

status fed_stream::push(std::shared_ptr<const void> owner, std::span<const char> bytes,
                        std::function<void()> consumed) {
  {
    std::lock_guard guard{mutex_};
    if (closed_)
      return why_ ? *why_ : make_error(errc::invalid_argument, "the stream was closed");
    if (bytes.size() > total_ - pushed_)
      return make_error(errc::invalid_argument,
                        "more bytes than the tensors declare (" + std::to_string(total_) + ")");
    if (pieces_.size() >= max_pending_)
      return make_error(errc::limit_exceeded,
                        "more than " + std::to_string(max_pending_)
                          + " pieces are waiting to be read; wait for their acknowledgements");
    pushed_ += bytes.size();
    pieces_.push_back({std::move(owner), bytes, 0, std::move(consumed)});
  }
  arrived_.notify_all();
  return {};
}

void fed_stream::close(std::optional<stitch::error> why) {
  std::deque<piece> dropped;
  {
    std::lock_guard guard{mutex_};
    if (closed_)
      return;
    closed_ = true;
    why_ = std::move(why);
    // A reader that stopped leaves its pieces here: their senders hear they
    // are done with (the reader's outcome says why).
    if (why_)
      dropped.swap(pieces_);
  }
  arrived_.notify_all();
  for (auto& p : dropped)
    if (p.consumed)
      p.consumed();
}

status fed_stream::read(size_t index, uint64_t offset, std::span<std::byte> out) {
  if (index >= headers_.size() || offset > headers_[index].size
      || out.size() > headers_[index].size - offset)
    return make_error(errc::invalid_argument, "read past the end of a tensor");
  // Piece by piece: each piece used up is consumed before the next is
  // waited for (its sender may wait for that before sending the rest).
  for (size_t got = 0; got < out.size();) {
    auto lent = borrow(index, offset + got, out.size() - got);
    if (!lent)
      return std::move(lent).error();
    std::memcpy(out.data() + got, lent->bytes.data(), lent->bytes.size());
    got += lent->bytes.size();
  }
  return {};
}

result<tensor_stream::borrowed> fed_stream::borrow(size_t index, uint64_t offset, size_t max) {
  if (index >= headers_.size() || offset >= headers_[index].size || max == 0)
    return make_error(errc::invalid_argument, "borrow past the end of a tensor");
  std::vector<std::function<void()>> done;
  borrowed out;
  status outcome;
  {
    std::unique_lock lock{mutex_};
    if (starts_[index] + offset != position_)
      return make_error(errc::invalid_argument, "reads of a fed stream must be sequential");
    for (;;) {
      arrived_.wait(lock, [&] { return !pieces_.empty() || closed_; });
      if (why_) {
        outcome = *why_;
        break;
      }
      if (pieces_.empty()) {
        outcome =
          make_error(errc::invalid_format, "the stream ended after " + std::to_string(position_)
                                             + " of " + std::to_string(total_) + " bytes");
        break;
      }
      auto& p = pieces_.front();
      const size_t take = static_cast<size_t>(
        std::min<uint64_t>({max, p.bytes.size() - p.used, headers_[index].size - offset}));
      if (take > 0) {
        out.bytes = std::as_bytes(p.bytes.subspan(p.used, take));
        out.owner = p.owner;
        p.used += take;
        position_ += take;
      }
      if (p.used == p.bytes.size()) {
        if (p.consumed)
          done.push_back(std::move(p.consumed));
        pieces_.pop_front();
      }
      if (take > 0)
        break;
    }
  }
  for (auto& f : done)
    f();
  if (!outcome)
    return std::move(outcome).error();
  return out;
}

} // namespace stitch::pipeline
