#include "runtime/store/version_layout.hpp"

#include <msgpack.hpp>

#include <algorithm>
#include <set>

#include "runtime/core/checksum.hpp"
#include "runtime/core/safetensors.hpp"

namespace stitch::store {

namespace {

stitch::error fail(errc code, std::string message) {
  return make_error(code, std::move(message));
}

/// Reads exactly `out.size()` bytes unless the source ends first.
result<size_t> read_full(byte_source& src, std::span<std::byte> out) {
  size_t got = 0;
  while (got < out.size()) {
    auto n = src.read(out.subspan(got));
    if (!n)
      return std::move(n).error();
    if (*n == 0)
      break;
    got += *n;
  }
  return got;
}

/// Verifies tensor checksums while a shard's data section streams past.
class checksum_stream {
public:
  checksum_stream(const manifest& m, const safetensors::file_view& view) : m_(m), view_(view) {}

  /// `bytes` are the data section's bytes at `data_offset`.
  status feed(uint64_t data_offset, std::span<const std::byte> bytes) {
    while (!bytes.empty() && index_ < view_.tensors.size()) {
      const auto& t = view_.tensors[index_];
      uint64_t end = t.data_end;
      uint64_t take = std::min<uint64_t>(bytes.size(), end - data_offset);
      hasher_.update(bytes.first(take));
      bytes = bytes.subspan(take);
      data_offset += take;
      if (data_offset == end) {
        if (auto ok = finish_tensor(t); !ok)
          return ok;
      }
    }
    return {};
  }

  /// Empty tensors at the end never see a byte.
  status drain() {
    while (index_ < view_.tensors.size() && view_.tensors[index_].byte_size() == 0)
      if (auto ok = finish_tensor(view_.tensors[index_]); !ok)
        return ok;
    return {};
  }

private:
  status finish_tensor(const safetensors::tensor_info& t) {
    auto expected = m_.checksums.find(t.name);
    uint64_t got = hasher_.digest();
    hasher_.reset();
    ++index_;
    if (expected == m_.checksums.end())
      return fail(errc::invalid_manifest, "no checksum for tensor '" + t.name + "'");
    if (expected->second != got)
      return fail(errc::checksum_mismatch, "tensor '" + t.name + "' of " + to_string(m_.ref)
                                             + " has checksum " + checksum::to_hex(got)
                                             + " but the manifest says "
                                             + checksum::to_hex(expected->second));
    // Empty tensors right after this one finish without bytes.
    return drain();
  }

  const manifest& m_;
  const safetensors::file_view& view_;
  checksum::tree_hasher hasher_;
  size_t index_ = 0;
};

} // namespace

status validate_pool(std::string_view pool) {
  if (auto ok = validate_run_id(pool); !ok)
    return fail(errc::invalid_argument, "pool name: " + ok.error().message);
  return {};
}

result<version_layout> ingest_version(const manifest& m, std::span<const shard_upload> shards,
                                      const piece_writer& write) {
  if (auto ok = validate(m); !ok)
    return std::move(ok).error();
  std::map<std::string, const shard_upload*> by_name;
  for (const auto& s : shards) {
    if (!s.bytes)
      return fail(errc::invalid_argument, "shard '" + s.name + "' has no bytes");
    if (!by_name.emplace(s.name, &s).second)
      return fail(errc::invalid_argument, "shard '" + s.name + "' was given twice");
    if (std::find(m.shards.begin(), m.shards.end(), s.name) == m.shards.end())
      return fail(errc::invalid_argument,
                  "shard '" + s.name + "' is not listed in the manifest of " + to_string(m.ref));
  }
  version_layout layout;
  uint64_t tensor_bytes = 0;
  std::vector<std::byte> piece;
  for (uint32_t index = 0; index < m.shards.size(); ++index) {
    const auto& name = m.shards[index];
    auto found = by_name.find(name);
    if (found == by_name.end())
      return fail(errc::invalid_argument,
                  "shard '" + name + "' of " + to_string(m.ref) + " was not uploaded");
    byte_source& src = *found->second->bytes;
    const uint64_t file_size = src.size();
    auto where = [&] { return "shard '" + name + "' of " + to_string(m.ref); };

    // The header first: 8 bytes of size, then the JSON.
    std::vector<std::byte> head(8);
    auto got = read_full(src, head);
    if (!got)
      return std::move(got).error();
    auto header_size = safetensors::read_header_size(std::span{head}.first(*got));
    if (!header_size)
      return fail(errc::invalid_format, where() + ": " + header_size.error().message);
    if (8 + *header_size > file_size)
      return fail(errc::invalid_format,
                  where() + " is " + std::to_string(file_size) + " bytes, shorter than its header");
    head.resize(8 + *header_size);
    got = read_full(src, std::span{head}.subspan(8));
    if (!got)
      return std::move(got).error();
    if (*got != *header_size)
      return fail(errc::invalid_format, where() + " is truncated inside its header");
    auto view = safetensors::parse_header(head, file_size);
    if (!view)
      return fail(errc::invalid_format, where() + ": " + view.error().message);

    // Exactly the weight_map's tensors for this shard.
    std::set<std::string> expected;
    for (const auto& [tensor, shard] : m.weight_map)
      if (shard == name)
        expected.insert(tensor);
    for (const auto& t : view->tensors) {
      if (!expected.erase(t.name))
        return fail(errc::invalid_manifest, where() + " holds tensor '" + t.name
                                              + "' that the weight_map does not assign to it");
      layout.tensors[t.name] =
        tensor_location{index, view->data_start + t.data_begin, t.byte_size()};
      tensor_bytes += t.byte_size();
    }
    if (!expected.empty())
      return fail(errc::invalid_manifest,
                  where() + " lacks tensor '" + *expected.begin() + "' named in the weight_map");

    // Stream the file in pieces: the header bytes first, then the data section.
    checksum_stream sums{m, *view};
    uint64_t offset = 0;
    piece.resize(piece_size);
    size_t filled = std::min(head.size(), piece_size);
    // Headers over one piece are flushed piecewise.
    size_t head_pos = 0;
    while (head.size() - head_pos > piece_size) {
      if (auto ok = write(index, offset, std::span{head}.subspan(head_pos, piece_size)); !ok)
        return std::move(ok).error();
      head_pos += piece_size;
      offset += piece_size;
    }
    filled = head.size() - head_pos;
    std::copy(head.begin() + static_cast<ptrdiff_t>(head_pos), head.end(), piece.begin());
    uint64_t position = head.size();
    while (position < file_size) {
      auto room = std::span{piece}.subspan(
        filled, std::min<uint64_t>(piece_size - filled, file_size - position));
      auto n = read_full(src, room);
      if (!n)
        return std::move(n).error();
      if (*n != room.size())
        return fail(errc::invalid_format,
                    where() + " is truncated: " + std::to_string(position + *n) + " of "
                      + std::to_string(file_size) + " bytes arrived");
      if (m.is_full())
        if (auto ok = sums.feed(position - view->data_start, room); !ok)
          return std::move(ok).error();
      position += *n;
      filled += *n;
      if (filled == piece_size || position == file_size) {
        if (auto ok = write(index, offset, std::span{piece}.first(filled)); !ok)
          return std::move(ok).error();
        offset += filled;
        filled = 0;
      }
    }
    if (filled > 0) {
      if (auto ok = write(index, offset, std::span{piece}.first(filled)); !ok)
        return std::move(ok).error();
    }
    if (m.is_full())
      if (auto ok = sums.drain(); !ok)
        return std::move(ok).error();
    std::byte extra[1];
    auto more = src.read(extra);
    if (more && *more != 0)
      return fail(errc::invalid_format, where() + " has bytes beyond its declared size");
    layout.shards.push_back(name);
    layout.shard_sizes.push_back(file_size);
  }
  if (tensor_bytes != m.total_size)
    return fail(errc::invalid_manifest, "total_size of " + to_string(m.ref) + " is "
                                          + std::to_string(m.total_size) + " but the shards hold "
                                          + std::to_string(tensor_bytes) + " tensor bytes");
  return layout;
}

namespace {

struct layout_record {
  std::vector<std::string> shards;
  std::vector<uint64_t> shard_sizes;
  std::vector<std::string> names;
  std::vector<uint32_t> shard_of;
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> sizes;
  MSGPACK_DEFINE(shards, shard_sizes, names, shard_of, offsets, sizes)
};

struct pointer_msg {
  std::string run_id;
  uint64_t version = 0;
  uint64_t boot_version = 0;
  MSGPACK_DEFINE(run_id, version, boot_version)
};

template <class T>
result<T> unpack(std::string_view bytes, std::string_view what) {
  try {
    auto handle = msgpack::unpack(bytes.data(), bytes.size());
    T out;
    handle.get().convert(out);
    return out;
  } catch (const std::exception& e) {
    return make_error(errc::corrupt_data, std::string{what} + " record is corrupt: " + e.what());
  }
}

template <class T>
std::string pack(const T& value) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, value);
  return std::string{buf.data(), buf.size()};
}

} // namespace

std::string encode_layout(const version_layout& layout) {
  layout_record r;
  r.shards = layout.shards;
  r.shard_sizes = layout.shard_sizes;
  for (const auto& [name, loc] : layout.tensors) {
    r.names.push_back(name);
    r.shard_of.push_back(loc.shard);
    r.offsets.push_back(loc.offset);
    r.sizes.push_back(loc.size);
  }
  return pack(r);
}

result<version_layout> decode_layout(std::string_view bytes) {
  auto r = unpack<layout_record>(bytes, "layout");
  if (!r)
    return std::move(r).error();
  const size_t n = r->names.size();
  if (r->shard_of.size() != n || r->offsets.size() != n || r->sizes.size() != n
      || r->shard_sizes.size() != r->shards.size())
    return make_error(errc::corrupt_data, "layout record is corrupt: inconsistent lengths");
  version_layout out;
  out.shards = std::move(r->shards);
  out.shard_sizes = std::move(r->shard_sizes);
  for (size_t i = 0; i < n; ++i) {
    if (r->shard_of[i] >= out.shards.size()
        || r->offsets[i] + r->sizes[i] > out.shard_sizes[r->shard_of[i]]
        || r->offsets[i] + r->sizes[i] < r->offsets[i])
      return make_error(errc::corrupt_data,
                        "layout record is corrupt: tensor '" + r->names[i] + "' out of range");
    out.tensors[r->names[i]] = tensor_location{r->shard_of[i], r->offsets[i], r->sizes[i]};
  }
  return out;
}

std::string encode_pointer(const pointer_record& p) {
  return pack(pointer_msg{p.latest.run_id, p.latest.version, p.boot_version});
}

result<pointer_record> decode_pointer(std::string_view bytes) {
  auto r = unpack<pointer_msg>(bytes, "pointer");
  if (!r)
    return std::move(r).error();
  if (auto ok = validate_run_id(r->run_id); !ok)
    return make_error(errc::corrupt_data, "pointer record is corrupt: " + ok.error().message);
  if (r->boot_version > r->version)
    return make_error(errc::corrupt_data, "pointer record is corrupt: boot above latest");
  return pointer_record{{r->run_id, r->version}, r->boot_version};
}

} // namespace stitch::store
