#include "runtime/core/manifest.hpp"
#include "runtime/core/safetensors.hpp"

#include <algorithm>
#include <set>
#include <utility>

#include "runtime/core/manifest_detail.hpp"

namespace stitch {

namespace manifest_detail {

error manifest_error(std::string message) {
  return make_error(errc::invalid_manifest, std::move(message));
}

error limit_error(std::string message) {
  return make_error(errc::limit_exceeded, std::move(message));
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size())
      return false;
    for (size_t k = 1; k < len; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80)
        return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)
        || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += len;
  }
  return true;
}

error with_field(const std::string& field, const error& err, errc code) {
  return make_error(code, field + ": " + err.message);
}

status check_counts(const manifest& m) {
  auto over = [](const char* field, size_t n) {
    return limit_error(std::string(field) + " names " + std::to_string(n) + " tensors, more than "
                       + std::to_string(max_manifest_tensors));
  };
  if (m.weight_map.size() > max_manifest_tensors)
    return over("weight_map", m.weight_map.size());
  if (m.checksums.size() > max_manifest_tensors)
    return over("metadata.checksums", m.checksums.size());
  if (m.touched.size() > max_manifest_tensors)
    return over("metadata.touched", m.touched.size());
  if (m.shards.size() > max_manifest_tensors)
    return over("metadata.shards", m.shards.size());
  return {};
}

/// Checks names and that every `weight_map` value is one of `shards`.
status check_weight_map(const std::map<std::string, std::string>& weight_map,
                        const std::set<std::string_view>& shards) {
  for (const auto& [name, shard] : weight_map) {
    if (auto ok = validate_tensor_name(name); !ok)
      return with_field("weight_map", ok.error());
    if (auto ok = validate_shard_name(shard); !ok)
      return with_field("weight_map[" + quote_untrusted(name) + "]", ok.error());
    if (!shards.contains(shard))
      return manifest_error("weight_map[" + quote_untrusted(name) + "] names shard "
                            + quote_untrusted(shard) + ", which is not in metadata.shards");
  }
  return {};
}
} // namespace manifest_detail

using namespace manifest_detail;

std::string_view to_string(version_kind kind) noexcept {
  switch (kind) {
    case version_kind::full: return "full";
    case version_kind::delta: return "delta";
  }
  return "invalid";
}

std::string_view to_string(delta_encoding encoding) noexcept {
  switch (encoding) {
    case delta_encoding::none: return "none";
    case delta_encoding::xor_bytes: return "xor";
    case delta_encoding::overwrite: return "overwrite";
    case delta_encoding::xor_sparse: return "xor-sparse";
  }
  return "invalid";
}

std::string_view to_string(compression comp) noexcept {
  switch (comp) {
    case compression::none: return "none";
    case compression::zstd: return "zstd";
  }
  return "invalid";
}

status validate_tensor_name(std::string_view name) {
  auto bad = [&](const char* why) {
    return make_error(errc::invalid_argument, "tensor name " + quote_untrusted(name) + " " + why);
  };
  if (name.empty())
    return make_error(errc::invalid_argument, "tensor name is empty");
  if (name.size() > max_tensor_name_length)
    return bad("is longer than 1024 bytes");
  for (char c : name) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f)
      return bad("contains a NUL or control byte");
    if (c == '\\')
      return bad("contains a backslash");
  }
  if (!is_valid_utf8(name))
    return bad("is not valid UTF-8");
  if (name.front() == '/')
    return bad("is an absolute path");
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string_view::npos)
      end = name.size();
    std::string_view part = name.substr(start, end - start);
    if (part == "..")
      return bad("has a '..' path component");
    if (part == ".")
      return bad("has a '.' path component");
    if (part.empty())
      return bad("has an empty path component");
    start = end + 1;
  }
  return {};
}

namespace {

/// A plain file name of `[A-Za-z0-9._-]`, at most 255 bytes, not starting
/// with '.'; `what` names it in the error.
status check_plain_file_name(std::string_view what, std::string_view name) {
  auto bad = [&](const char* why) {
    return make_error(errc::invalid_argument,
                      std::string{what} + " " + quote_untrusted(name) + " " + why);
  };
  if (name.empty())
    return make_error(errc::invalid_argument, std::string{what} + " is empty");
  if (name.size() > max_shard_name_length)
    return bad("is longer than 255 bytes");
  for (char c : name) {
    bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
                 || c == '.' || c == '_' || c == '-';
    if (!plain)
      return bad("must be a plain file name of [A-Za-z0-9._-]");
  }
  if (name.front() == '.')
    return bad("must not start with '.'");
  return {};
}

} // namespace

status validate_shard_name(std::string_view name) {
  if (auto ok = check_plain_file_name("shard name", name); !ok)
    return ok;
  if (name.size() <= shard_suffix.size() || !name.ends_with(shard_suffix))
    return make_error(errc::invalid_argument, "shard name " + quote_untrusted(name)
                                                + " must be a file name ending in .safetensors");
  return {};
}

status validate_file_name(std::string_view name) {
  if (auto ok = check_plain_file_name("file name", name); !ok)
    return ok;
  if (name.ends_with(shard_suffix) || name == "model.safetensors.index.json")
    return make_error(errc::invalid_argument,
                      "file name " + quote_untrusted(name)
                        + " is a tensor shard or the index; only other files are kept as files");
  return {};
}

std::string file_location_key(std::string_view name) {
  return "/files/" + std::string{name};
}

namespace {

/// A delta's `frames` name touched tensors only, each at least its length
/// prefix, and add up to what the version stores.
status check_frames(const manifest& m) {
  if (m.frames.empty())
    return {};
  if (m.is_full())
    return manifest_error("metadata.frames belongs to deltas only");
  uint64_t bytes = 0;
  for (const auto& [name, frame] : m.frames) {
    const std::string field = "metadata.frames[" + quote_untrusted(name) + "]";
    if (!std::binary_search(m.touched.begin(), m.touched.end(), name))
      return manifest_error(field + " names a tensor the delta does not touch");
    if (frame.size < 8)
      return manifest_error(field + ".size " + std::to_string(frame.size)
                            + " is shorter than a frame's 8-byte length prefix");
    if (frame.size > m.total_size - bytes)
      return manifest_error(field + ".size: the frames describe more bytes than total_size");
    bytes += frame.size;
  }
  if (m.frames.size() != m.touched.size())
    return manifest_error("metadata.frames lists " + std::to_string(m.frames.size())
                          + " frames but the delta touches " + std::to_string(m.touched.size())
                          + " tensors");
  if (bytes != m.total_size)
    return manifest_error("metadata.frames describe " + std::to_string(bytes)
                          + " bytes but total_size is " + std::to_string(m.total_size));
  return {};
}

} // namespace

status validate(const manifest& m) {
  if (auto ok = validate_run_id(m.ref.run_id); !ok)
    return with_field("metadata.run_id", ok.error());
  if (to_string(m.kind) == "invalid")
    return manifest_error("metadata.kind has an invalid value "
                          + std::to_string(static_cast<int>(m.kind)));
  if (to_string(m.encoding) == "invalid")
    return manifest_error("metadata.delta_encoding has an invalid value "
                          + std::to_string(static_cast<int>(m.encoding)));
  if (to_string(m.comp) == "invalid")
    return manifest_error("metadata.compression has an invalid value "
                          + std::to_string(static_cast<int>(m.comp)));
  const auto version = std::to_string(m.ref.version);
  if (m.is_full()) {
    if (m.base_version)
      return manifest_error("metadata.base_version must be absent for a full anchor, got "
                            + std::to_string(*m.base_version));
    if (m.encoding != delta_encoding::none)
      return manifest_error("metadata.delta_encoding must be none for a full anchor, got "
                            + std::string(to_string(m.encoding)));
  } else {
    if (m.ref.version == 0)
      return manifest_error("metadata.version: a delta cannot be version 0 (it has no base)");
    const auto expected = std::to_string(m.ref.version - 1);
    if (!m.base_version)
      return manifest_error("metadata.base_version is missing: delta version " + version
                            + " needs base_version " + expected);
    if (*m.base_version != m.ref.version - 1)
      return manifest_error("metadata.base_version " + std::to_string(*m.base_version)
                            + " must be version - 1 = " + expected + " for delta version "
                            + version);
    if (m.encoding == delta_encoding::none)
      return manifest_error(
        "metadata.delta_encoding must be xor, xor-sparse or overwrite for a delta, got none");
  }
  if (m.checksum_algorithm != checksum_algorithm_name)
    return manifest_error("metadata.checksum: unknown checksum algorithm "
                          + quote_untrusted(m.checksum_algorithm) + " (expected "
                          + std::string(checksum_algorithm_name) + ")");
  if (auto ok = check_counts(m); !ok)
    return ok;

  std::set<std::string_view> shards;
  for (const auto& shard : m.shards) {
    if (auto ok = validate_shard_name(shard); !ok)
      return with_field("metadata.shards", ok.error());
    if (!shards.insert(shard).second)
      return manifest_error("metadata.shards lists " + quote_untrusted(shard) + " twice");
  }
  if (auto ok = check_weight_map(m.weight_map, shards); !ok)
    return ok;

  for (size_t i = 0; i < m.touched.size(); ++i) {
    const auto& name = m.touched[i];
    if (auto ok = validate_tensor_name(name); !ok)
      return with_field("metadata.touched", ok.error());
    if (i > 0 && !(m.touched[i - 1] < name))
      return manifest_error("metadata.touched must be sorted and unique: " + quote_untrusted(name)
                            + " follows " + quote_untrusted(m.touched[i - 1]));
    if (!m.weight_map.contains(name))
      return manifest_error("metadata.touched names " + quote_untrusted(name)
                            + ", which is not in weight_map");
  }
  if (m.is_full() && m.touched.size() != m.weight_map.size()) {
    // touched is a sorted subset of the keys here, so the first difference is the missing one.
    auto it = m.weight_map.begin();
    for (size_t i = 0; i < m.touched.size() && it->first == m.touched[i]; ++i)
      ++it;
    return manifest_error("weight_map names " + quote_untrusted(it->first)
                          + ", which a full anchor must also list in metadata.touched");
  }

  for (const auto& [name, sum] : m.checksums) {
    if (auto ok = validate_tensor_name(name); !ok)
      return with_field("metadata.checksums", ok.error());
    if (m.is_full() && !m.weight_map.contains(name))
      return manifest_error("metadata.checksums names " + quote_untrusted(name)
                            + ", which is not a tensor of this full anchor");
  }
  for (const auto& [name, shard] : m.weight_map)
    if (!m.checksums.contains(name))
      return manifest_error("metadata.checksums has no checksum for tensor "
                            + quote_untrusted(name));

  if (!m.tensor_specs.empty()) {
    if (!m.is_full())
      return manifest_error("metadata.tensor_specs belongs to full anchors only");
    uint64_t bytes = 0;
    for (const auto& [name, spec] : m.tensor_specs) {
      const std::string field = "metadata.tensor_specs[" + quote_untrusted(name) + "]";
      if (!m.weight_map.contains(name))
        return manifest_error(field + " names a tensor the anchor does not store");
      auto type = safetensors::parse_dtype(spec.dtype);
      if (!type)
        return manifest_error(field + ".dtype: " + type.error().message);
      if (spec.shape.size() > safetensors::max_rank)
        return manifest_error(field + ".shape has more than "
                              + std::to_string(safetensors::max_rank) + " dimensions");
      auto size = safetensors::byte_length(*type, spec.shape);
      if (!size || *size > m.total_size - bytes)
        return manifest_error(field + ".shape describes more bytes than total_size");
      bytes += *size;
    }
    for (const auto& [name, shard] : m.weight_map)
      if (!m.tensor_specs.contains(name))
        return manifest_error("metadata.tensor_specs lacks tensor " + quote_untrusted(name));
    if (bytes != m.total_size)
      return manifest_error("metadata.tensor_specs describe " + std::to_string(bytes)
                            + " bytes but total_size is " + std::to_string(m.total_size));
  }
  if (auto ok = check_frames(m); !ok)
    return ok;
  return validate_files(m.files);
}

status validate_files(const std::map<std::string, file_entry>& files) {
  if (files.size() > max_version_files)
    return make_error(errc::limit_exceeded,
                      "metadata.files: " + std::to_string(files.size()) + " files, more than the "
                        + std::to_string(max_version_files) + " a version keeps");
  uint64_t total = 0;
  for (const auto& [name, entry] : files) {
    if (auto ok = validate_file_name(name); !ok)
      return with_field("metadata.files", ok.error());
    if (entry.size > max_version_file_bytes)
      return make_error(errc::limit_exceeded,
                        "metadata.files: " + quote_untrusted(name) + " has "
                          + std::to_string(entry.size) + " bytes, more than the "
                          + std::to_string(max_version_file_bytes) + " a kept file may have");
    total += entry.size;
  }
  if (total > max_version_files_total)
    return make_error(errc::limit_exceeded,
                      "metadata.files: " + std::to_string(total) + " bytes in all, more than the "
                        + std::to_string(max_version_files_total) + " a version keeps");
  return {};
}
} // namespace stitch
