#include "runtime/store/version_layout.hpp"

#include <msgpack.hpp>

#include <algorithm>
#include <set>

#include "runtime/core/checksum.hpp"
#include "runtime/core/safetensors.hpp"

namespace stitch::store {

namespace {} // namespace

struct shard_stream_check::impl {
  struct shard {
    std::string name;
    uint64_t size = 0;
    std::vector<safetensors::tensor_info> tensors;
    uint64_t data_start = 0;
  };

  std::vector<shard> shards;
  std::map<std::string, uint64_t> checksums;
  /// The current shard: bytes seen, its header while it accumulates.
  bool open = false;
  uint64_t position = 0;
  std::vector<std::byte> head;
  bool header_done = false;
  size_t tensor = 0;
  checksum::tree_hasher hasher;

  shard& current() { return shards.back(); }

  std::string where() { return "shard '" + current().name + "'"; }

  /// Every empty tensor at the cursor finishes without bytes.
  void finish_empty() {
    auto& ts = current().tensors;
    while (tensor < ts.size() && ts[tensor].byte_size() == 0) {
      checksums[ts[tensor].name] = checksum::tree_hasher{}.digest();
      ++tensor;
    }
  }

  status parse_head() {
    auto view = safetensors::parse_header(head, current().size);
    if (!view)
      return make_error(errc::invalid_format, where() + ": " + view.error().message);
    for (const auto& t : view->tensors) {
      if (auto ok = validate_tensor_name(t.name); !ok)
        return make_error(errc::invalid_format, where() + ": " + ok.error().message);
      if (checksums.contains(t.name))
        return make_error(errc::invalid_format, where() + " holds tensor '" + t.name
                                                  + "', which an earlier shard holds too");
    }
    current().tensors = std::move(view->tensors);
    current().data_start = view->data_start;
    header_done = true;
    head.clear();
    head.shrink_to_fit();
    finish_empty();
    return {};
  }

  status feed(std::span<const std::byte> bytes) {
    if (!open)
      return make_error(errc::invalid_argument, "shard bytes arrived before a shard was begun");
    if (bytes.size() > current().size - position)
      return make_error(errc::invalid_format, where() + " is longer than its declared "
                                                + std::to_string(current().size) + " bytes");
    while (!header_done) {
      // The 8-byte size first, then the JSON it announces.
      uint64_t want = 8;
      if (head.size() >= 8) {
        auto header_size = safetensors::read_header_size(std::span{head}.first(8));
        if (!header_size)
          return make_error(errc::invalid_format, where() + ": " + header_size.error().message);
        if (8 + *header_size > current().size)
          return make_error(errc::invalid_format, where() + " is " + std::to_string(current().size)
                                                    + " bytes, shorter than its header");
        want = 8 + *header_size;
        if (head.size() == want) {
          if (auto ok = parse_head(); !ok)
            return ok;
          continue;
        }
      }
      if (bytes.empty())
        break;
      const size_t take = std::min<uint64_t>(want - head.size(), bytes.size());
      head.insert(head.end(), bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(take));
      bytes = bytes.subspan(take);
      position += take;
    }
    auto& ts = current().tensors;
    while (!bytes.empty() && tensor < ts.size()) {
      const auto& t = ts[tensor];
      const uint64_t end = current().data_start + t.data_end;
      const uint64_t take = std::min<uint64_t>(bytes.size(), end - position);
      hasher.update(bytes.first(take));
      bytes = bytes.subspan(take);
      position += take;
      if (position == end) {
        checksums[t.name] = hasher.digest();
        hasher.reset();
        ++tensor;
        finish_empty();
      }
    }
    if (!bytes.empty())
      return make_error(errc::invalid_format, where() + " has bytes beyond its tensors");
    return {};
  }

  status close() {
    if (!open)
      return {};
    if (position != current().size)
      return make_error(errc::invalid_format, where() + " is truncated: " + std::to_string(position)
                                                + " of " + std::to_string(current().size)
                                                + " bytes arrived");
    open = false;
    return {};
  }
};

shard_stream_check::shard_stream_check() : impl_(std::make_unique<impl>()) {}
shard_stream_check::~shard_stream_check() = default;
shard_stream_check::shard_stream_check(shard_stream_check&&) noexcept = default;
shard_stream_check& shard_stream_check::operator=(shard_stream_check&&) noexcept = default;

status shard_stream_check::begin_shard(std::string_view name, uint64_t size) {
  auto& s = *impl_;
  if (auto ok = s.close(); !ok)
    return ok;
  if (auto ok = validate_shard_name(name); !ok)
    return ok;
  for (const auto& done : s.shards)
    if (done.name == name)
      return make_error(errc::invalid_argument, "shard '" + std::string{name} + "' was sent twice");
  if (size < 8)
    return make_error(errc::invalid_format, "shard '" + std::string{name} + "' is "
                                              + std::to_string(size)
                                              + " bytes, too short for a safetensors header");
  s.shards.push_back({std::string{name}, size, {}, 0});
  s.open = true;
  s.position = 0;
  s.head.clear();
  s.header_done = false;
  s.tensor = 0;
  s.hasher.reset();
  return {};
}

status shard_stream_check::feed(std::span<const std::byte> bytes) {
  return impl_->feed(bytes);
}

uint64_t shard_stream_check::remaining() const noexcept {
  return impl_->open ? impl_->current().size - impl_->position : 0;
}

result<version_layout> shard_stream_check::finish(const manifest& m) {
  auto& s = *impl_;
  if (auto ok = s.close(); !ok)
    return std::move(ok).error();
  if (auto ok = validate(m); !ok)
    return std::move(ok).error();
  version_layout layout;
  uint64_t tensor_bytes = 0;
  std::set<std::string> listed{m.shards.begin(), m.shards.end()};
  for (const auto& sh : s.shards) {
    if (!listed.erase(sh.name))
      return make_error(errc::invalid_argument, "shard '" + sh.name
                                                  + "' is not listed in the manifest of "
                                                  + to_string(m.ref));
    const auto where = "shard '" + sh.name + "' of " + to_string(m.ref);
    std::set<std::string> expected;
    for (const auto& [tensor, shard] : m.weight_map)
      if (shard == sh.name)
        expected.insert(tensor);
    const auto index = static_cast<uint32_t>(layout.shards.size());
    for (const auto& t : sh.tensors) {
      if (!expected.erase(t.name))
        return make_error(errc::invalid_manifest,
                          where + " holds tensor '" + t.name
                            + "' that the weight_map does not assign to it");
      layout.tensors[t.name] = tensor_location{index, sh.data_start + t.data_begin, t.byte_size()};
      tensor_bytes += t.byte_size();
      if (m.is_full()) {
        auto want = m.checksums.find(t.name);
        if (want == m.checksums.end())
          return make_error(errc::invalid_manifest, "no checksum for tensor '" + t.name + "'");
        const uint64_t got = s.checksums.at(t.name);
        if (want->second != got)
          return make_error(errc::checksum_mismatch,
                            "tensor '" + t.name + "' of " + to_string(m.ref) + " has checksum "
                              + checksum::to_hex(got) + " but the manifest says "
                              + checksum::to_hex(want->second));
      }
    }
    if (!expected.empty())
      return make_error(errc::invalid_manifest, where + " lacks tensor '" + *expected.begin()
                                                  + "' named in the weight_map");
    layout.shards.push_back(sh.name);
    layout.shard_sizes.push_back(sh.size);
  }
  if (!listed.empty())
    return make_error(errc::invalid_argument, "shard '" + *listed.begin() + "' of "
                                                + to_string(m.ref) + " was not uploaded");
  if (tensor_bytes != m.total_size)
    return make_error(errc::invalid_manifest,
                      "total_size of " + to_string(m.ref) + " is " + std::to_string(m.total_size)
                        + " but the shards hold " + std::to_string(tensor_bytes) + " tensor bytes");
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
  std::string location;
  MSGPACK_DEFINE(shards, shard_sizes, names, shard_of, offsets, sizes, location)
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
    // Every element takes at least a byte, so no container or string in
    // `bytes` is longer than `bytes`: a forged length is refused before
    // msgpack allocates for it.
    const auto n = static_cast<std::size_t>(bytes.size());
    msgpack::unpack_limit limit(n, n, n, n, n, 8);
    auto handle = msgpack::unpack(bytes.data(), bytes.size(), nullptr, nullptr, limit);
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
  r.location = layout.location;
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
  out.location = std::move(r->location);
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
