#include "runtime/pipeline/hf_directory.hpp"

#include "runtime/pipeline/tensor_stream.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <system_error>
#include <utility>

#include "gpu/host_buffer.hpp"
#include "runtime/core/manifest.hpp"

namespace stitch::pipeline {

namespace fs = std::filesystem;

namespace {

/// Closes a file descriptor when it goes out of scope.
class unique_fd {
public:
  explicit unique_fd(int fd = -1) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }

  /// Closes now, reporting the error a deferred write may surface only here.
  int close() noexcept {
    int rc = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return rc;
  }

private:
  void reset() noexcept {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = -1;
  }

  int fd_;
};

/// A regular file opened for reading, with its size.
struct open_file {
  unique_fd fd;
  uint64_t size = 0;
};

/// Resolves `name` inside `directory` (already canonical) and refuses a
/// result outside it: names come from files we do not trust.
result<fs::path> resolve_inside(const fs::path& directory, std::string_view name) {
  std::error_code ec;
  fs::path resolved = fs::canonical(directory / fs::path{std::string{name}}, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory)
      return make_error(errc::not_found,
                        "file " + in_quotes(name) + " is missing from " + directory.string());
    return make_error(errc::backend_failure, "cannot resolve " + in_quotes(name) + " in "
                                               + directory.string() + ": " + ec.message());
  }
  fs::path relative = resolved.lexically_relative(directory);
  if (relative.empty() || *relative.begin() == ".." || relative.is_absolute())
    return make_error(errc::invalid_argument, "file " + in_quotes(name) + " resolves to "
                                                + resolved.string() + ", outside "
                                                + directory.string());
  return resolved;
}

result<open_file> open_regular(const fs::path& path, std::string_view shown) {
  // The path is already resolved, so a symlink here was swapped in since.
  unique_fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)};
  if (fd.get() < 0) {
    int err = errno;
    return make_error(err == ENOENT ? errc::not_found : errc::backend_failure,
                      "cannot open " + in_quotes(shown) + ": " + errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    return make_error(errc::backend_failure,
                      "cannot stat " + in_quotes(shown) + ": " + errno_text(errno));
  if (!S_ISREG(st.st_mode))
    return make_error(errc::invalid_argument, in_quotes(shown) + " is not a regular file");
  return open_file{std::move(fd), static_cast<uint64_t>(st.st_size)};
}

/// Reads exactly `out.size()` bytes at `offset`; a short read means the file
/// shrank under us.
status pread_all(int fd, std::span<std::byte> out, uint64_t offset, std::string_view shown) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n =
      ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return make_error(errc::backend_failure,
                        "cannot read " + in_quotes(shown) + ": " + errno_text(errno));
    }
    if (n == 0)
      return make_error(errc::invalid_format, in_quotes(shown) + " is truncated: it ended at byte "
                                                + std::to_string(offset + done) + " while reading "
                                                + std::to_string(out.size()) + " bytes at "
                                                + std::to_string(offset));
    done += static_cast<size_t>(n);
  }
  return {};
}

/// Reads and validates a safetensors file's header without its data.
result<safetensors::file_view> read_header(const open_file& file, std::string_view shown) {
  auto where = [&](const std::string& what) {
    return make_error(errc::invalid_format, in_quotes(shown) + ": " + what);
  };
  if (file.size < 8)
    return where("the file is " + std::to_string(file.size)
                 + " bytes, too short for the 8-byte header size");
  std::vector<std::byte> head(8);
  if (auto ok = pread_all(file.fd.get(), head, 0, shown); !ok)
    return std::move(ok).error();
  auto header_size = safetensors::read_header_size(head);
  if (!header_size)
    return where(header_size.error().message);
  if (*header_size > file.size - 8)
    return where("the header claims " + std::to_string(*header_size) + " bytes but the file is "
                 + std::to_string(file.size) + " bytes");
  head.resize(8 + *header_size);
  if (auto ok = pread_all(file.fd.get(), std::span{head}.subspan(8), 8, shown); !ok)
    return std::move(ok).error();
  auto view = safetensors::parse_header(head, file.size);
  if (!view)
    return where(view.error().message);
  for (const auto& t : view->tensors)
    if (auto ok = validate_tensor_name(t.name); !ok)
      return where(ok.error().message);
  return view;
}

result<std::string> read_small_file(const open_file& file, std::string_view shown, uint64_t limit) {
  if (file.size > limit)
    return make_error(errc::limit_exceeded, in_quotes(shown) + " is " + std::to_string(file.size)
                                              + " bytes, more than the " + std::to_string(limit)
                                              + " accepted");
  std::string text(file.size, '\0');
  if (auto ok = pread_all(file.fd.get(), std::as_writable_bytes(std::span{text}), 0, shown); !ok)
    return std::move(ok).error();
  return text;
}

bool exists_no_follow(const fs::path& path) {
  std::error_code ec;
  return fs::symlink_status(path, ec).type() != fs::file_type::not_found && !ec;
}

} // namespace

result<hf_checkpoint> open_hf_directory(const fs::path& directory) {
  std::error_code ec;
  fs::path dir = fs::canonical(directory, ec);
  if (ec)
    return make_error(errc::not_found, "checkpoint directory " + directory.string()
                                         + " cannot be opened: " + ec.message());
  if (!fs::is_directory(dir, ec))
    return make_error(errc::invalid_argument, directory.string() + " is not a directory");

  hf_checkpoint ckpt;
  ckpt.directory = dir;
  std::map<std::string, std::string> index_map;
  const bool sharded = exists_no_follow(dir / hf_index_file);
  if (sharded) {
    auto path = resolve_inside(dir, hf_index_file);
    if (!path)
      return std::move(path).error();
    auto file = open_regular(*path, hf_index_file);
    if (!file)
      return std::move(file).error();
    auto text = read_small_file(*file, hf_index_file, max_manifest_bytes);
    if (!text)
      return std::move(text).error();
    auto index = parse_hf_index(*text);
    if (!index) {
      auto code =
        index.error().code == errc::limit_exceeded ? errc::limit_exceeded : errc::invalid_manifest;
      return make_error(code, std::string{hf_index_file} + " in " + dir.string() + ": "
                                + index.error().message);
    }
    ckpt.files = std::move(index->shards);
    index_map = std::move(index->weight_map);
  } else if (exists_no_follow(dir / hf_single_file)) {
    ckpt.files.emplace_back(hf_single_file);
  } else {
    return make_error(errc::not_found, dir.string() + " holds neither "
                                         + std::string{hf_single_file} + " nor "
                                         + std::string{hf_index_file});
  }

  // Every header first, so a tensor in two shards is reported as such.
  std::map<std::string, std::string> holder;
  for (const auto& name : ckpt.files) {
    auto path = resolve_inside(dir, name);
    if (!path) {
      if (path.error().code == errc::not_found && sharded)
        return make_error(errc::not_found, "shard " + in_quotes(name) + " named by "
                                             + std::string{hf_index_file} + " is missing from "
                                             + dir.string());
      return std::move(path).error();
    }
    auto file = open_regular(*path, name);
    if (!file)
      return std::move(file).error();
    auto view = read_header(*file, name);
    if (!view)
      return std::move(view).error();
    ckpt.file_sizes[name] = file->size;
    for (auto& t : view->tensors) {
      auto [it, fresh] = holder.emplace(t.name, name);
      if (!fresh)
        return make_error(errc::invalid_format, "tensor " + in_quotes(t.name) + " appears in both "
                                                  + in_quotes(it->second) + " and "
                                                  + in_quotes(name));
      if (sharded) {
        auto mapped = index_map.find(t.name);
        if (mapped == index_map.end())
          return make_error(errc::invalid_manifest,
                            "shard " + in_quotes(name) + " holds tensor " + in_quotes(t.name)
                              + ", which " + std::string{hf_index_file} + " does not list");
        if (mapped->second != name)
          return make_error(errc::invalid_manifest, "shard " + in_quotes(name) + " holds tensor "
                                                      + in_quotes(t.name) + ", which "
                                                      + std::string{hf_index_file} + " assigns to "
                                                      + in_quotes(mapped->second));
      }
      uint64_t size = t.byte_size();
      ckpt.total_size += size;
      ckpt.tensors.emplace(t.name, hf_tensor{t.name, t.type, std::move(t.shape), name,
                                             view->data_start + t.data_begin, size});
    }
  }
  for (const auto& [tensor, shard] : index_map)
    if (!ckpt.tensors.contains(tensor))
      return make_error(errc::invalid_manifest, std::string{hf_index_file} + " assigns tensor "
                                                  + in_quotes(tensor) + " to " + in_quotes(shard)
                                                  + ", which does not hold it");
  return ckpt;
}

namespace {

result<open_file> reopen(const hf_checkpoint& ckpt, const std::string& name) {
  auto path = resolve_inside(ckpt.directory, name);
  if (!path)
    return std::move(path).error();
  auto file = open_regular(*path, name);
  if (!file)
    return std::move(file).error();
  auto known = ckpt.file_sizes.find(name);
  if (known == ckpt.file_sizes.end() || known->second != file->size)
    return make_error(errc::invalid_format, in_quotes(name) + " in " + ckpt.directory.string()
                                              + " changed size since the checkpoint was opened");
  return file;
}

} // namespace

result<int> open_checkpoint_file(const hf_checkpoint& ckpt, const std::string& file) {
  auto opened = reopen(ckpt, file);
  if (!opened)
    return std::move(opened).error();
  ::posix_fadvise(opened->fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  // Handed over: the caller closes it.
  return opened->fd.release();
}

status read_file_range(int fd, uint64_t offset, std::span<std::byte> out, std::string_view shown) {
  return pread_all(fd, out, offset, shown);
}

status write_file_range(int fd, uint64_t offset, std::span<const std::byte> bytes,
                        std::string_view shown) {
  while (!bytes.empty()) {
    ssize_t n = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return make_error(errc::backend_failure,
                        "cannot write " + in_quotes(shown) + ": " + errno_text(errno));
    }
    bytes = bytes.subspan(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return {};
}

status read_tensor(const hf_checkpoint& ckpt, std::string_view name, std::span<std::byte> out) {
  auto it = ckpt.tensors.find(std::string{name});
  if (it == ckpt.tensors.end())
    return make_error(errc::not_found, "tensor " + in_quotes(name) + " is not in the checkpoint "
                                         + ckpt.directory.string());
  const hf_tensor& t = it->second;
  if (out.size() != t.size)
    return make_error(errc::invalid_argument, "tensor " + in_quotes(name) + " is "
                                                + std::to_string(t.size) + " bytes, not "
                                                + std::to_string(out.size()));
  auto file = reopen(ckpt, t.file);
  if (!file)
    return std::move(file).error();
  return pread_all(file->fd.get(), out, t.offset, t.file);
}

status stream_tensor(const hf_checkpoint& ckpt, std::string_view name, std::span<std::byte> piece,
                     const safetensors::byte_sink& sink) {
  auto it = ckpt.tensors.find(std::string{name});
  if (it == ckpt.tensors.end())
    return make_error(errc::not_found, "tensor " + in_quotes(name) + " is not in the checkpoint "
                                         + ckpt.directory.string());
  if (piece.empty())
    return make_error(errc::invalid_argument, "streaming a tensor needs a non-empty buffer");
  const hf_tensor& t = it->second;
  auto file = reopen(ckpt, t.file);
  if (!file)
    return std::move(file).error();
  for (uint64_t done = 0; done < t.size;) {
    auto n = static_cast<size_t>(std::min<uint64_t>(piece.size(), t.size - done));
    if (auto ok = pread_all(file->fd.get(), piece.first(n), t.offset + done, t.file); !ok)
      return ok;
    if (auto ok = sink(piece.first(n)); !ok)
      return ok;
    done += n;
  }
  return {};
}

result<tensor_set> load_hf_directory(const fs::path& directory) {
  auto ckpt = open_hf_directory(directory);
  if (!ckpt)
    return std::move(ckpt).error();
  tensor_set out;
  // One open per file rather than per tensor.
  for (const auto& name : ckpt->files) {
    auto file = reopen(*ckpt, name);
    if (!file)
      return std::move(file).error();
    for (const auto& [tensor, info] : ckpt->tensors) {
      if (info.file != name)
        continue;
      host_tensor t{info.name, info.type, info.shape, {}};
      t.bytes.resize(info.size);
      if (auto ok = pread_all(file->fd.get(), t.bytes, info.offset, name); !ok)
        return std::move(ok).error();
      out.emplace(tensor, std::move(t));
    }
  }
  return out;
}

namespace {

/// `model-00001-of-00002.safetensors`: a name `shard_name` produces.
bool is_export_shard_name(std::string_view name) {
  constexpr std::string_view prefix = "model-";
  constexpr std::string_view middle = "-of-";
  constexpr std::string_view suffix = ".safetensors";
  if (name.size() != prefix.size() + 5 + middle.size() + 5 + suffix.size())
    return false;
  if (!name.starts_with(prefix) || !name.ends_with(suffix))
    return false;
  auto digits = [&](size_t at) {
    return std::all_of(name.begin() + static_cast<ptrdiff_t>(at),
                       name.begin() + static_cast<ptrdiff_t>(at + 5),
                       [](char c) { return c >= '0' && c <= '9'; });
  };
  return digits(prefix.size()) && name.substr(prefix.size() + 5, middle.size()) == middle
         && digits(prefix.size() + 5 + middle.size());
}

/// Only the files an earlier export wrote may be replaced.
status check_replaceable(const fs::path& target, const std::map<std::string, std::string>& files) {
  std::error_code ec;
  auto st = fs::symlink_status(target, ec);
  if (ec || st.type() == fs::file_type::not_found)
    return {};
  if (st.type() == fs::file_type::symlink)
    return make_error(errc::invalid_argument,
                      "output " + target.string() + " is a symlink; refusing to replace it");
  if (st.type() != fs::file_type::directory)
    return make_error(errc::invalid_argument,
                      "output " + target.string() + " exists and is not a directory");
  fs::directory_iterator it{target, ec};
  if (ec)
    return make_error(errc::backend_failure,
                      "cannot list " + target.string() + ": " + ec.message());
  for (; it != fs::directory_iterator{}; it.increment(ec)) {
    std::string name = it->path().filename().string();
    bool ours = it->is_regular_file(ec) && !it->is_symlink(ec)
                && (name == hf_index_file || is_export_shard_name(name) || files.contains(name));
    if (!ours)
      return make_error(errc::invalid_argument,
                        "output " + target.string() + " holds " + in_quotes(name)
                          + ", which no earlier export wrote; refusing to replace the directory");
  }
  if (ec)
    return make_error(errc::backend_failure,
                      "cannot list " + target.string() + ": " + ec.message());
  return {};
}

status fsync_directory(const fs::path& dir) {
  unique_fd fd{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (fd.get() < 0 || ::fsync(fd.get()) != 0)
    return make_error(errc::backend_failure,
                      "cannot fsync " + dir.string() + ": " + errno_text(errno));
  return {};
}

status write_all(int fd, std::span<const std::byte> bytes, const fs::path& path) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return make_error(errc::backend_failure,
                        "cannot write " + path.string() + ": " + errno_text(errno));
    }
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
  return {};
}

/// Large files that must be durable (`sync`) are written with direct I/O:
/// the page cache would only hold bytes until the fsync writes them back,
/// slower than the device takes direct writes. Without `sync` (an export the
/// user did not ask to be durable, an engine's staged copy) they go through
/// the page cache, as `cp` writes: the write ends at memory speed, the kernel
/// writes back behind it, and whoever reads the directory next (an engine
/// loading it) finds it cached.
constexpr uint64_t direct_threshold = uint64_t{1} << 20;
constexpr size_t direct_block = 4096;
constexpr size_t direct_buffer = size_t{8} << 20;

/// Creates `path` (which must not exist), lets `fill` write it through the
/// sink, then (with `sync`) fsyncs and closes it. With `sync`, a file of
/// `expected_size` bytes or more goes through an aligned buffer with O_DIRECT
/// where the file system allows it: whole blocks out, the tail padded, then the file cut to
/// its size.
template <class Fill>
status write_new_file(const fs::path& path, bool sync, uint64_t expected_size, Fill&& fill) {
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  bool direct = sync && expected_size >= direct_threshold;
  unique_fd fd{::open(path.c_str(), flags | (direct ? O_DIRECT : 0), 0644)};
  if (fd.get() < 0 && direct && errno == EINVAL) {
    direct = false;
    fd = unique_fd{::open(path.c_str(), flags, 0644)};
  }
  if (fd.get() < 0)
    return make_error(errc::backend_failure,
                      "cannot create " + path.string() + ": " + errno_text(errno));
  gpu::host_buffer buffer;
  size_t filled = 0;
  uint64_t written = 0;
  if (direct) {
    auto b = gpu::staging_allocator().allocate(direct_buffer);
    if (!b)
      return std::move(b).error();
    buffer = std::move(*b);
  }
  safetensors::byte_sink sink = [&](std::span<const std::byte> bytes) -> status {
    if (!direct)
      return write_all(fd.get(), bytes, path);
    while (!bytes.empty()) {
      const size_t take = std::min(bytes.size(), buffer.size() - filled);
      std::memcpy(buffer.data() + filled, bytes.data(), take);
      filled += take;
      written += take;
      bytes = bytes.subspan(take);
      if (filled == buffer.size()) {
        if (auto ok = write_all(fd.get(), buffer.bytes(), path); !ok)
          return ok;
        filled = 0;
      }
    }
    return {};
  };
  if (auto ok = fill(sink); !ok)
    return ok;
  if (direct && filled > 0) {
    const size_t padded = (filled + direct_block - 1) / direct_block * direct_block;
    std::memset(buffer.data() + filled, 0, padded - filled);
    if (auto ok = write_all(fd.get(), buffer.bytes().first(padded), path); !ok)
      return ok;
    if (::ftruncate(fd.get(), static_cast<off_t>(written)) != 0)
      return make_error(errc::backend_failure,
                        "cannot truncate " + path.string() + ": " + errno_text(errno));
  }
  if (sync && ::fsync(fd.get()) != 0)
    return make_error(errc::backend_failure,
                      "cannot fsync " + path.string() + ": " + errno_text(errno));
  if (fd.close() != 0)
    return make_error(errc::backend_failure,
                      "cannot close " + path.string() + ": " + errno_text(errno));
  return {};
}

void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
}

std::string index_json(const shard_plan& plan) {
  std::string out = "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(plan.total_size)
                    + "\n  },\n  \"weight_map\": {";
  bool first = true;
  for (const auto& [tensor, shard] : plan.weight_map) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    append_json_string(out, tensor);
    out += ": ";
    append_json_string(out, shard);
  }
  out += first ? "}\n}\n" : "\n  }\n}\n";
  return out;
}

/// Writes every file of the checkpoint into `dir` (empty, ours).
status write_files(const fs::path& dir, std::span<const safetensors::tensor_spec> tensors,
                   const tensor_filler& fill, const shard_plan& plan, bool sync,
                   const std::map<std::string, std::string>& files, const shard_reuse& reuse) {
  for (const auto& [name, bytes] : files) {
    if (auto ok = validate_file_name(name); !ok)
      return ok;
    auto ok =
      write_new_file(dir / name, sync, bytes.size(), [&](const safetensors::byte_sink& sink) {
        return sink(std::as_bytes(std::span{bytes.data(), bytes.size()}));
      });
    if (!ok)
      return ok;
  }
  const safetensors::metadata_map metadata{{"format", "pt"}};
  std::map<std::string, const safetensors::tensor_spec*> by_name;
  for (const auto& t : tensors)
    by_name.emplace(t.name, &t);
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    if (reuse)
      if (auto from = reuse(plan.shards[i], plan.shard_tensors[i]);
          from && ::link(from->c_str(), (dir / plan.shards[i]).c_str()) == 0)
        continue;
    std::vector<safetensors::tensor_spec> specs;
    for (const auto& name : plan.shard_tensors[i])
      specs.push_back(*by_name.at(name));
    auto ok = write_new_file(
      dir / plan.shards[i], sync, plan.shard_bytes[i],
      [&](const safetensors::byte_sink& sink) -> status {
        auto writer = safetensors::stream_writer::start(specs, metadata, sink);
        if (!writer)
          return std::move(writer).error();
        for (const auto& name : plan.shard_tensors[i]) {
          const uint64_t before = writer->remaining();
          safetensors::byte_sink into = [&](std::span<const std::byte> bytes) {
            return writer->write(bytes);
          };
          if (auto w = fill(name, into); !w)
            return w;
          auto expected = safetensors::byte_length(by_name.at(name)->type, by_name.at(name)->shape);
          if (!expected || before - writer->remaining() != *expected)
            return make_error(errc::invalid_argument,
                              "tensor " + in_quotes(name) + " did not get exactly its bytes");
        }
        return writer->finish();
      });
    if (!ok)
      return ok;
  }
  const std::string index = index_json(plan);
  return write_new_file(
    dir / hf_index_file, sync, index.size(),
    [&](const safetensors::byte_sink& sink) { return sink(std::as_bytes(std::span{index})); });
}

std::string temp_suffix() {
  std::random_device rd;
  return std::to_string(::getpid()) + "-" + std::to_string(rd());
}

} // namespace

namespace {

/// Weights in other formats that HF repositories carry next to safetensors
/// (`pytorch_model.bin`, ...): not kept with a version, whose weights are the
/// safetensors.
bool is_other_weight_format(std::string_view name) {
  for (std::string_view ext :
       {".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx", ".npz", ".pkl"})
    if (name.ends_with(ext))
      return true;
  return false;
}

} // namespace

result<std::map<std::string, std::string>> read_checkpoint_files(const fs::path& given) {
  std::map<std::string, std::string> files;
  std::error_code ec;
  const fs::path directory = fs::canonical(given, ec);
  if (ec)
    return make_error(errc::not_found, "cannot open " + given.string() + ": " + ec.message());
  fs::directory_iterator it{directory, ec};
  if (ec)
    return make_error(errc::not_found, "cannot list " + directory.string() + ": " + ec.message());
  uint64_t total = 0;
  for (; it != fs::directory_iterator{}; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name.front() == '.' || name == hf_index_file
        || name.ends_with(".safetensors") || is_other_weight_format(name)
        || !it->is_regular_file(ec))
      continue;
    if (auto ok = validate_file_name(name); !ok)
      return make_error(errc::invalid_argument,
                        "checkpoint file " + in_quotes(name) + " in " + directory.string()
                          + " cannot be kept with the version: " + ok.error().message
                          + " (rename or remove it)");
    if (files.size() == max_version_files)
      return make_error(errc::limit_exceeded,
                        directory.string() + " holds more than " + std::to_string(max_version_files)
                          + " non-tensor files (a version keeps at most that)");
    // Read through a descriptor checked like the shards' (no escape by symlink).
    const auto size = it->file_size(ec);
    if (ec)
      return make_error(errc::backend_failure,
                        "cannot stat " + it->path().string() + ": " + ec.message());
    if (size > max_version_file_bytes || total + size > max_version_files_total)
      return make_error(errc::limit_exceeded,
                        "checkpoint file " + in_quotes(name) + " in " + directory.string() + " has "
                          + std::to_string(size) + " bytes; a version keeps files of at most "
                          + std::to_string(max_version_file_bytes) + " bytes each, "
                          + std::to_string(max_version_files_total)
                          + " in all (move it elsewhere)");
    auto resolved = resolve_inside(directory, name);
    if (!resolved)
      return std::move(resolved).error();
    unique_fd fd{::open(resolved->c_str(), O_RDONLY | O_CLOEXEC)};
    if (fd.get() < 0)
      return make_error(errc::backend_failure,
                        "cannot open " + resolved->string() + ": " + errno_text(errno));
    std::string bytes(size, '\0');
    if (auto ok = read_file_range(fd.get(), 0, std::as_writable_bytes(std::span{bytes}), name); !ok)
      return std::move(ok).error();
    total += size;
    files.emplace(name, std::move(bytes));
  }
  if (ec)
    return make_error(errc::backend_failure,
                      "cannot list " + directory.string() + ": " + ec.message());
  return files;
}

status write_hf_directory(const fs::path& directory, const tensor_set& tensors,
                          uint64_t max_shard_bytes,
                          const std::map<std::string, std::string>& files) {
  std::vector<safetensors::tensor_spec> specs;
  std::vector<tensor_header> headers;
  for (const auto& [key, t] : tensors) {
    if (key != t.name)
      return make_error(errc::invalid_argument, "tensor " + in_quotes(t.name)
                                                  + " is stored under the key " + in_quotes(key));
    headers.push_back({t.name, t.type, t.shape, t.bytes.size()});
    specs.push_back({t.name, t.type, t.shape});
  }
  // The same checks as every published stream's (names, order, sizes).
  if (!headers.empty())
    if (auto ok = validate_headers(headers); !ok)
      return ok;
  tensor_filler fill = [&](const std::string& name, const safetensors::byte_sink& sink) {
    return sink(tensors.at(name).bytes);
  };
  return write_hf_directory(directory, specs, fill, max_shard_bytes, true, files);
}

status write_hf_directory(const fs::path& directory,
                          std::span<const safetensors::tensor_spec> tensors,
                          const tensor_filler& fill, uint64_t max_shard_bytes, bool sync,
                          const std::map<std::string, std::string>& files,
                          const shard_reuse& reuse) {
  fs::path target = directory.lexically_normal();
  if (!target.has_filename())
    target = target.parent_path();
  const std::string base = target.filename().string();
  if (base.empty() || base == "." || base == "..")
    return make_error(errc::invalid_argument, "output directory " + directory.string()
                                                + " must name a directory, not '.' or '..'");

  std::vector<shard_input> inputs;
  for (const auto& t : tensors) {
    if (auto ok = validate_tensor_name(t.name); !ok)
      return ok;
    auto size = safetensors::byte_length(t.type, t.shape);
    if (!size)
      return make_error(errc::invalid_argument,
                        "tensor " + in_quotes(t.name) + ": " + size.error().message);
    inputs.push_back({t.name, *size});
  }
  std::sort(inputs.begin(), inputs.end(),
            [](const shard_input& a, const shard_input& b) { return a.name < b.name; });
  auto plan = plan_shards(inputs, max_shard_bytes);
  if (!plan)
    return std::move(plan).error();
  if (auto ok = check_replaceable(target, files); !ok)
    return ok;

  std::error_code ec;
  fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path{"."};
  fs::create_directories(parent, ec);
  if (ec)
    return make_error(errc::backend_failure,
                      "cannot create " + parent.string() + ": " + ec.message());
  fs::path temp = parent / ("." + base + ".tmp-" + temp_suffix());
  if (!fs::create_directory(temp, ec) || ec)
    return make_error(errc::backend_failure, "cannot create " + temp.string() + ": "
                                               + (ec ? ec.message() : std::string{"it exists"}));
  auto cleanup = [&](status outcome) {
    std::error_code ignored;
    fs::remove_all(temp, ignored);
    return outcome;
  };
  if (auto ok = write_files(temp, tensors, fill, *plan, sync, files, reuse); !ok)
    return cleanup(std::move(ok));
  if (sync)
    if (auto ok = fsync_directory(temp); !ok)
      return cleanup(std::move(ok));

  if (!exists_no_follow(target)) {
    if (::rename(temp.c_str(), target.c_str()) != 0)
      return cleanup(make_error(errc::backend_failure, "cannot rename " + temp.string() + " to "
                                                         + target.string() + ": "
                                                         + errno_text(errno)));
  } else if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    // `temp` now holds the replaced export.
  } else {
    // Filesystems without RENAME_EXCHANGE: move the old one aside first.
    fs::path old = parent / ("." + base + ".old-" + temp_suffix());
    if (::rename(target.c_str(), old.c_str()) != 0)
      return cleanup(make_error(errc::backend_failure,
                                "cannot move " + target.string() + " aside: " + errno_text(errno)));
    if (::rename(temp.c_str(), target.c_str()) != 0) {
      int err = errno;
      (void) ::rename(old.c_str(), target.c_str());
      return cleanup(make_error(errc::backend_failure, "cannot rename " + temp.string() + " to "
                                                         + target.string() + ": "
                                                         + errno_text(err)));
    }
    fs::remove_all(old, ec);
  }
  if (!sync)
    return cleanup({});
  auto synced = fsync_directory(parent);
  return cleanup(std::move(synced));
}

} // namespace stitch::pipeline
