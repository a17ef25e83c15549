// The manifest as JSON: a strict reader (duplicate keys, depth, element
// counts and UTF-8 refused, every field checked) and the writer.

#include <algorithm>
#include <array>
#include <cstdio>
#include <exception>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "runtime/core/manifest.hpp"
#include "runtime/core/manifest_detail.hpp"
#include "runtime/core/safetensors.hpp"

namespace stitch {

using namespace manifest_detail;

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

/// A manifest is three levels deep; the bound only keeps hostile input cheap.
constexpr size_t max_json_depth = 32;
/// Keys plus values: a manifest naming `max_manifest_tensors` tensors needs
/// about five per tensor (weight_map and checksums entries, touched).
constexpr size_t max_json_elements = 5 * max_manifest_tensors + 1000;

/// A short rendering of a JSON value for error messages (never a whole
/// container, which could be megabytes).
std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string:
      return "the string " + quote_untrusted(v.get_ref<const std::string&>());
    case json::value_t::discarded: return "nothing";
    default: return v.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

/// Builds the same DOM as `json::parse`, but refuses duplicate keys (nlohmann
/// keeps the last one silently, so two readers could disagree about which
/// shard holds a tensor), deep nesting and too many elements. Also records
/// the root `weight_map`'s values in document order, which the DOM loses.
class strict_dom_builder {
public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  bool null() { return add(json(nullptr)); }
  bool boolean(bool v) { return add(json(v)); }
  bool number_integer(number_integer_t v) { return add(json(v)); }
  bool number_unsigned(number_unsigned_t v) { return add(json(v)); }
  bool number_float(number_float_t v, const string_t&) { return add(json(v)); }
  bool binary(binary_t& v) { return add(json::binary(std::move(v))); }

  bool string(string_t& v) {
    if (in_root_weight_map() && seen_shards_.insert(v).second)
      shards_in_order_.push_back(v);
    return add(json(std::move(v)));
  }

  bool start_object(size_t) { return enter(json::object()); }
  bool start_array(size_t) { return enter(json::array()); }

  bool end_object() {
    frames_.pop_back();
    return true;
  }
  bool end_array() {
    frames_.pop_back();
    return true;
  }

  bool key(string_t& k) {
    if (!count())
      return false;
    frame& top = frames_.back();
    if (top.value->contains(k))
      return fail(manifest_error("duplicate key " + quote_untrusted(k) + " in " + path()));
    top.last_key = k;
    pending_ = &(*top.value)[k];
    return true;
  }

  template <class Exception>
  bool parse_error(size_t, const std::string&, const Exception& ex) {
    return fail(manifest_error(std::string("not valid JSON: ") + ex.what()));
  }

  json& root() { return root_; }
  std::vector<std::string>& shards_in_order() { return shards_in_order_; }
  const std::optional<error>& failure() const { return failure_; }

private:
  struct frame {
    json* value;
    std::string name;
    std::string last_key;
  };

  bool fail(error err) {
    if (!failure_)
      failure_ = std::move(err);
    return false;
  }

  bool count() {
    if (++elements_ > max_json_elements)
      return fail(limit_error("the JSON has more than " + std::to_string(max_json_elements)
                              + " keys and values"));
    return true;
  }

  std::string path() const {
    std::string out;
    for (size_t i = 1; i < frames_.size(); ++i) {
      if (!out.empty() && frames_[i].name != "[]")
        out += '.';
      out += frames_[i].name;
    }
    return out.empty() ? "the top-level object" : out;
  }

  bool in_root_weight_map() const {
    return frames_.size() == 2 && frames_[0].value->is_object() && frames_[1].name == "weight_map"
           && frames_[1].value->is_object();
  }

  /// Stores `v` where the parser is and returns its address.
  json* place(json v) {
    if (frames_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *frames_.back().value;
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    *pending_ = std::move(v);
    return pending_;
  }

  bool add(json v) {
    if (!count())
      return false;
    place(std::move(v));
    return true;
  }

  bool enter(json container) {
    if (!count())
      return false;
    if (frames_.size() >= max_json_depth)
      return fail(manifest_error("JSON nested deeper than " + std::to_string(max_json_depth)
                                 + " levels in " + path()));
    std::string name;
    if (!frames_.empty())
      name = frames_.back().value->is_array() ? "[]" : frames_.back().last_key;
    // Safe to keep: the parent gains no element while this child is open.
    json* slot = place(std::move(container));
    frames_.push_back(frame{slot, std::move(name), {}});
    return true;
  }

  json root_;
  json* pending_ = nullptr;
  std::vector<frame> frames_;
  size_t elements_ = 0;
  std::set<std::string> seen_shards_;
  std::vector<std::string> shards_in_order_;
  std::optional<error> failure_;
};

struct parsed_document {
  json root;
  std::vector<std::string> weight_map_shards;
};

result<parsed_document> parse_document(std::string_view text) {
  if (text.size() > max_manifest_bytes)
    return limit_error("index JSON is " + std::to_string(text.size()) + " bytes, more than "
                       + std::to_string(max_manifest_bytes));
  try {
    strict_dom_builder builder;
    bool ok = json::sax_parse(text.begin(), text.end(), &builder);
    if (!ok || builder.failure()) {
      if (builder.failure())
        return *builder.failure();
      return manifest_error("not valid JSON");
    }
    if (!builder.root().is_object())
      return manifest_error("index JSON must be an object, got " + describe(builder.root()));
    return parsed_document{std::move(builder.root()), std::move(builder.shards_in_order())};
  } catch (const std::exception& ex) {
    return manifest_error(std::string("cannot parse index JSON: ") + ex.what());
  }
}

const json* member(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

/// A member that may be absent or null (both mean "not given").
const json* optional_member(const json& obj, const char* key) {
  const json* v = member(obj, key);
  return v == nullptr || v->is_null() ? nullptr : v;
}

result<const json*> required_object(const json& obj, const char* key, const std::string& field) {
  const json* v = member(obj, key);
  if (v == nullptr)
    return manifest_error(field + " is missing");
  if (!v->is_object())
    return manifest_error(field + " must be an object, got " + describe(*v));
  return v;
}

result<uint64_t> as_uint(const json& v, const std::string& field) {
  if (v.is_number_unsigned())
    return v.get<uint64_t>();
  return manifest_error(field + " must be a non-negative integer, got " + describe(v));
}

result<uint64_t> required_uint(const json& obj, const char* key, const std::string& field) {
  const json* v = member(obj, key);
  if (v == nullptr)
    return manifest_error(field + " is missing");
  return as_uint(*v, field);
}

result<std::string> as_string(const json& v, const std::string& field) {
  if (!v.is_string())
    return manifest_error(field + " must be a string, got " + describe(v));
  return v.get<std::string>();
}

result<std::string> required_string(const json& obj, const char* key, const std::string& field) {
  const json* v = member(obj, key);
  if (v == nullptr)
    return manifest_error(field + " is missing");
  return as_string(*v, field);
}

result<std::vector<std::string>> string_array(const json& obj, const char* key,
                                              const std::string& field) {
  const json* v = member(obj, key);
  if (v == nullptr)
    return manifest_error(field + " is missing");
  if (!v->is_array())
    return manifest_error(field + " must be an array of strings, got " + describe(*v));
  std::vector<std::string> out;
  out.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    const json& item = (*v)[i];
    if (!item.is_string())
      return manifest_error(field + "[" + std::to_string(i) + "] must be a string, got "
                            + describe(item));
    out.push_back(item.get<std::string>());
  }
  return out;
}

/// Reads `weight_map`: an object of tensor name -> shard file name strings.
result<std::map<std::string, std::string>> read_weight_map(const json& root) {
  auto wm = required_object(root, "weight_map", "weight_map");
  if (!wm)
    return std::move(wm).error();
  if ((*wm)->size() > max_manifest_tensors)
    return limit_error("weight_map names " + std::to_string((*wm)->size()) + " tensors, more than "
                       + std::to_string(max_manifest_tensors));
  std::map<std::string, std::string> out;
  for (const auto& [name, shard] : (*wm)->items()) {
    if (!shard.is_string())
      return manifest_error("weight_map[" + quote_untrusted(name) + "] must be a string, got "
                            + describe(shard));
    out.emplace_hint(out.end(), name, shard.get<std::string>());
  }
  return out;
}

/// An optional enum-valued string member; absent or null is `fallback`.
template <class Enum, size_t N>
result<Enum> enum_member(const json& obj, const char* key, const std::string& field,
                         const std::array<Enum, N>& values, Enum fallback) {
  const json* v = optional_member(obj, key);
  if (v == nullptr)
    return fallback;
  auto text = as_string(*v, field);
  if (!text)
    return std::move(text).error();
  std::string expected;
  for (Enum e : values) {
    if (to_string(e) == *text)
      return e;
    expected += (expected.empty() ? "" : ", ") + std::string(to_string(e));
  }
  return manifest_error(field + ": unknown value " + quote_untrusted(*text) + " (expected one of "
                        + expected + ")");
}

std::optional<uint64_t> parse_hex64(std::string_view text) {
  if (text.size() != 16)
    return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    uint64_t digit = 0;
    if (c >= '0' && c <= '9')
      digit = static_cast<uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f')
      digit = static_cast<uint64_t>(c - 'a' + 10);
    else
      return std::nullopt;
    value = (value << 4) | digit;
  }
  return value;
}

std::string hex64(uint64_t value) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(value));
  return buf;
}

/// `metadata.<key>`: an object of `{"size": N, "checksum": "<hex>"}` entries
/// (the version's files, a delta's frames), when present.
status read_sized_entries(const json& meta, const char* key,
                          std::map<std::string, file_entry>& out) {
  const json* entries = optional_member(meta, key);
  if (!entries)
    return {};
  const std::string where = std::string{"metadata."} + key;
  if (!entries->is_object())
    return manifest_error(where + " must be an object, got " + describe(*entries));
  for (const auto& [name, entry] : entries->items()) {
    const std::string field = where + "[" + quote_untrusted(name) + "]";
    if (!entry.is_object())
      return manifest_error(field + " must be an object, got " + describe(entry));
    auto size = required_uint(entry, "size", field + ".size");
    if (!size)
      return std::move(size).error();
    auto sum = required_string(entry, "checksum", field + ".checksum");
    if (!sum)
      return std::move(sum).error();
    auto value = parse_hex64(*sum);
    if (!value)
      return manifest_error(field + ".checksum: " + quote_untrusted(*sum)
                            + " is not 16 lowercase hex digits");
    out.emplace_hint(out.end(), name, file_entry{*size, *value});
  }
  return {};
}

} // namespace

result<manifest> parse_manifest(std::string_view text) {
  auto doc = parse_document(text);
  if (!doc)
    return std::move(doc).error();
  const json& root = doc->root;
  auto meta_ptr = required_object(root, "metadata", "metadata");
  if (!meta_ptr)
    return std::move(meta_ptr).error();
  const json& meta = **meta_ptr;
  manifest m;

  auto version = required_uint(meta, "version", "metadata.version");
  if (!version)
    return std::move(version).error();
  m.ref.version = *version;

  auto run_id = required_string(meta, "run_id", "metadata.run_id");
  if (!run_id)
    return std::move(run_id).error();
  if (auto ok = validate_run_id(*run_id); !ok)
    return with_field("metadata.run_id", ok.error());
  m.ref.run_id = std::move(*run_id);

  auto kind = required_string(meta, "kind", "metadata.kind");
  if (!kind)
    return std::move(kind).error();
  if (*kind == "full")
    m.kind = version_kind::full;
  else if (*kind == "delta")
    m.kind = version_kind::delta;
  else
    return manifest_error("metadata.kind: unknown kind " + quote_untrusted(*kind)
                          + " (expected full or delta)");

  if (const json* base = optional_member(meta, "base_version")) {
    auto value = as_uint(*base, "metadata.base_version");
    if (!value)
      return std::move(value).error();
    m.base_version = *value;
  }

  auto encoding = enum_member(meta, "delta_encoding", "metadata.delta_encoding",
                              std::array{delta_encoding::none, delta_encoding::xor_bytes,
                                         delta_encoding::overwrite, delta_encoding::xor_sparse},
                              delta_encoding::none);
  if (!encoding)
    return std::move(encoding).error();
  m.encoding = *encoding;

  auto comp = enum_member(meta, "compression", "metadata.compression",
                          std::array{compression::none, compression::zstd}, compression::none);
  if (!comp)
    return std::move(comp).error();
  m.comp = *comp;

  auto algorithm = required_string(meta, "checksum", "metadata.checksum");
  if (!algorithm)
    return std::move(algorithm).error();
  if (*algorithm != checksum_algorithm_name)
    return manifest_error("metadata.checksum: unknown checksum algorithm "
                          + quote_untrusted(*algorithm) + " (expected "
                          + std::string(checksum_algorithm_name) + ")");
  m.checksum_algorithm = std::move(*algorithm);

  auto total = required_uint(meta, "total_size", "metadata.total_size");
  if (!total)
    return std::move(total).error();
  m.total_size = *total;

  auto touched = string_array(meta, "touched", "metadata.touched");
  if (!touched)
    return std::move(touched).error();
  m.touched = std::move(*touched);
  std::sort(m.touched.begin(), m.touched.end());
  if (auto dup = std::adjacent_find(m.touched.begin(), m.touched.end()); dup != m.touched.end())
    return manifest_error("metadata.touched names " + quote_untrusted(*dup) + " twice");

  auto shards = string_array(meta, "shards", "metadata.shards");
  if (!shards)
    return std::move(shards).error();
  m.shards = std::move(*shards);

  auto sums = required_object(meta, "checksums", "metadata.checksums");
  if (!sums)
    return std::move(sums).error();
  for (const auto& [name, sum] : (*sums)->items()) {
    const std::string field = "metadata.checksums[" + quote_untrusted(name) + "]";
    if (!sum.is_string())
      return manifest_error(field + " must be a string of 16 lowercase hex digits, got "
                            + describe(sum));
    auto value = parse_hex64(sum.get_ref<const std::string&>());
    if (!value)
      return manifest_error(field + ": " + describe(sum) + " is not 16 lowercase hex digits");
    m.checksums.emplace_hint(m.checksums.end(), name, *value);
  }

  if (const json* specs = optional_member(meta, "tensor_specs")) {
    if (!specs->is_object())
      return manifest_error("metadata.tensor_specs must be an object, got " + describe(*specs));
    for (const auto& [name, spec] : specs->items()) {
      const std::string field = "metadata.tensor_specs[" + quote_untrusted(name) + "]";
      if (!spec.is_object())
        return manifest_error(field + " must be an object, got " + describe(spec));
      auto dtype = required_string(spec, "dtype", field + ".dtype");
      if (!dtype)
        return std::move(dtype).error();
      const json* shape = optional_member(spec, "shape");
      if (!shape || !shape->is_array() || shape->size() > safetensors::max_rank)
        return manifest_error(field + ".shape must be an array of at most "
                              + std::to_string(safetensors::max_rank) + " dimensions");
      tensor_spec_entry entry{std::move(*dtype), {}};
      for (const auto& dim : *shape) {
        auto value = as_uint(dim, field + ".shape");
        if (!value)
          return std::move(value).error();
        entry.shape.push_back(*value);
      }
      m.tensor_specs.emplace_hint(m.tensor_specs.end(), name, std::move(entry));
    }
  }

  for (auto [key, into] : {std::pair{"files", &m.files}, std::pair{"frames", &m.frames}})
    if (auto ok = read_sized_entries(meta, key, *into); !ok)
      return std::move(ok).error();

  auto weight_map = read_weight_map(root);
  if (!weight_map)
    return std::move(weight_map).error();
  m.weight_map = std::move(*weight_map);

  if (auto ok = validate(m); !ok)
    return std::move(ok).error();
  return m;
}

result<hf_index> parse_hf_index(std::string_view text) {
  auto doc = parse_document(text);
  if (!doc)
    return std::move(doc).error();
  const json& root = doc->root;
  auto meta = required_object(root, "metadata", "metadata");
  if (!meta)
    return std::move(meta).error();
  hf_index index;
  auto total = required_uint(**meta, "total_size", "metadata.total_size");
  if (!total)
    return std::move(total).error();
  index.total_size = *total;
  auto weight_map = read_weight_map(root);
  if (!weight_map)
    return std::move(weight_map).error();
  index.weight_map = std::move(*weight_map);
  index.shards = std::move(doc->weight_map_shards);
  std::set<std::string_view> shards(index.shards.begin(), index.shards.end());
  if (auto ok = check_weight_map(index.weight_map, shards); !ok)
    return std::move(ok).error();
  return index;
}

std::string to_json(const manifest& m) {
  std::map<std::string, std::string> sums;
  for (const auto& [name, sum] : m.checksums)
    sums.emplace_hint(sums.end(), name, hex64(sum));
  // Built from whole maps: ordered_json's operator[] searches linearly.
  ordered_json meta = ordered_json::object();
  meta["total_size"] = m.total_size;
  meta["version"] = m.ref.version;
  meta["run_id"] = m.ref.run_id;
  meta["kind"] = to_string(m.kind);
  if (m.base_version)
    meta["base_version"] = *m.base_version;
  meta["delta_encoding"] = to_string(m.encoding);
  meta["compression"] = to_string(m.comp);
  meta["checksum"] = m.checksum_algorithm;
  meta["touched"] = m.touched;
  meta["shards"] = m.shards;
  meta["checksums"] = sums;
  if (!m.tensor_specs.empty()) {
    ordered_json specs = ordered_json::object();
    for (const auto& [name, spec] : m.tensor_specs)
      specs.emplace(name, ordered_json{{"dtype", spec.dtype}, {"shape", spec.shape}});
    meta["tensor_specs"] = std::move(specs);
  }
  for (auto [key, from] : {std::pair{"files", &m.files}, std::pair{"frames", &m.frames}}) {
    if (from->empty())
      continue;
    ordered_json entries = ordered_json::object();
    for (const auto& [name, entry] : *from)
      entries.emplace(name,
                      ordered_json{{"size", entry.size}, {"checksum", hex64(entry.checksum)}});
    meta[key] = std::move(entries);
  }
  ordered_json root = ordered_json::object();
  root["metadata"] = std::move(meta);
  root["weight_map"] = m.weight_map;
  return root.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

} // namespace stitch
