#include "runtime/pipeline/publish_encoding.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "runtime/core/checksum.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/publisher.hpp"

namespace stitch::pipeline {

std::vector<std::byte> encode_delta_frame(std::span<const std::byte> payload) {
  std::vector<std::byte> frame(delta_frame_prefix + payload.size());
  uint64_t length = payload.size();
  for (size_t i = 0; i < delta_frame_prefix; ++i)
    frame[i] = static_cast<std::byte>((length >> (8 * i)) & 0xff);
  if (!payload.empty())
    std::memcpy(frame.data() + delta_frame_prefix, payload.data(), payload.size());
  return frame;
}

namespace detail {

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

} // namespace detail

} // namespace stitch::pipeline
