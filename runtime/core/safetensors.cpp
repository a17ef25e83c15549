#include "runtime/core/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <tuple>
#include <unordered_set>
#include <utility>

#include <nlohmann/json.hpp>

namespace stitch::safetensors {

namespace {

error format_error(std::string message) {
  return make_error(errc::invalid_format, std::move(message));
}

/// Quotes text from the input for an error message: printable ASCII as is,
/// everything else as \xNN, cut after 80 bytes so hostile names stay short.
std::string quote(std::string_view text) {
  constexpr size_t max_shown = 80;
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < max_shown; ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 0xf];
    }
  }
  if (text.size() > max_shown)
    out += "...";
  out += "'";
  return out;
}

/// The same rules as `stitch::validate_tensor_name` (manifest.hpp), kept
/// local so the format codec stands alone.
status check_tensor_name(std::string_view name) {
  constexpr size_t max_name_length = 1024;
  if (name.empty())
    return format_error("tensor name is empty");
  if (name.size() > max_name_length)
    return format_error("tensor name " + quote(name) + " is longer than 1024 bytes");
  for (char ch : name) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f)
      return format_error("tensor name " + quote(name) + " contains a control byte");
    if (c == '\\')
      return format_error("tensor name " + quote(name) + " contains a backslash");
  }
  if (name.front() == '/')
    return format_error("tensor name " + quote(name) + " is an absolute path");
  size_t pos = 0;
  while (pos <= name.size()) {
    auto slash = name.find('/', pos);
    if (slash == std::string_view::npos)
      slash = name.size();
    if (name.substr(pos, slash - pos) == "..")
      return format_error("tensor name " + quote(name) + " has a '..' component");
    pos = slash + 1;
  }
  return {};
}

std::string shape_string(std::span<const uint64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0)
      out += ",";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

/// Builds the header straight from parser events, so duplicate keys (which
/// nlohmann's DOM would silently collapse) are seen, nothing deeper than the
/// format needs is ever stored, and parsing stops at the first problem.
class header_handler {
public:
  using number_integer_t = int64_t;
  using number_unsigned_t = uint64_t;
  using number_float_t = double;
  using string_t = std::string;
  using binary_t = nlohmann::json::binary_t;

  std::vector<tensor_info> tensors;
  metadata_map metadata;
  error err;

  bool null() { return wrong_value("null"); }
  bool boolean(bool) { return wrong_value("a boolean"); }
  bool number_float(double, const std::string&) { return wrong_value("a non-integer number"); }
  bool binary(binary_t&) { return wrong_value("binary"); }

  bool number_integer(int64_t value) {
    if (value >= 0)
      return number_unsigned(static_cast<uint64_t>(value));
    return wrong_value("a negative number");
  }

  bool number_unsigned(uint64_t value) {
    if (state_ == state::shape) {
      if (current_.shape.size() == max_rank)
        return fail("shape of " + quote(current_.name) + " has more than "
                    + std::to_string(max_rank) + " dimensions");
      current_.shape.push_back(value);
      return true;
    }
    if (state_ == state::offsets) {
      if (offsets_seen_ == 2)
        return fail("data_offsets of " + quote(current_.name) + " has more than 2 entries");
      (offsets_seen_++ == 0 ? current_.data_begin : current_.data_end) = value;
      return true;
    }
    return wrong_value("a number");
  }

  bool string(std::string& value) {
    if (state_ == state::metadata_value) {
      metadata[key_] = std::move(value);
      state_ = state::metadata;
      return true;
    }
    if (state_ == state::tensor_value && field_ == field::dtype) {
      auto parsed = parse_dtype(value);
      if (!parsed)
        return fail("tensor " + quote(current_.name) + " has unknown dtype " + quote(value));
      current_.type = *parsed;
      state_ = state::tensor;
      return true;
    }
    return wrong_value("a string");
  }

  bool start_object(size_t) {
    switch (state_) {
      case state::top_begin: state_ = state::top; return true;
      case state::top_value:
        if (key_ == metadata_key) {
          state_ = state::metadata;
        } else {
          current_ = tensor_info{};
          current_.name = std::move(key_);
          fields_seen_ = 0;
          offsets_seen_ = 0;
          state_ = state::tensor;
        }
        return true;
      default: return wrong_value("an object");
    }
  }

  bool start_array(size_t) {
    if (state_ == state::tensor_value && field_ == field::shape) {
      state_ = state::shape;
      return true;
    }
    if (state_ == state::tensor_value && field_ == field::data_offsets) {
      state_ = state::offsets;
      return true;
    }
    return wrong_value("an array");
  }

  bool key(std::string& name) {
    switch (state_) {
      case state::top:
        if (name != metadata_key) {
          if (auto ok = check_tensor_name(name); !ok)
            return fail(ok.error().message);
        }
        if (!top_keys_.insert(name).second)
          return fail(name == metadata_key ? "duplicate __metadata__ key"
                                           : "duplicate tensor name " + quote(name));
        key_ = std::move(name);
        state_ = state::top_value;
        return true;
      case state::metadata:
        if (metadata.contains(name))
          return fail("duplicate __metadata__ key " + quote(name));
        key_ = std::move(name);
        state_ = state::metadata_value;
        return true;
      case state::tensor: {
        if (name == "dtype")
          field_ = field::dtype;
        else if (name == "shape")
          field_ = field::shape;
        else if (name == "data_offsets")
          field_ = field::data_offsets;
        else
          return fail("tensor " + quote(current_.name) + " has unknown key " + quote(name));
        auto bit = 1u << static_cast<unsigned>(field_);
        if (fields_seen_ & bit)
          return fail("tensor " + quote(current_.name) + " has duplicate key " + quote(name));
        fields_seen_ |= bit;
        state_ = state::tensor_value;
        return true;
      }
      default: return fail("unexpected key " + quote(name));
    }
  }

  bool end_object() {
    switch (state_) {
      case state::top: state_ = state::done; return true;
      case state::metadata: state_ = state::top; return true;
      case state::tensor:
        if (!(fields_seen_ & (1u << static_cast<unsigned>(field::dtype))))
          return fail("tensor " + quote(current_.name) + " has no dtype");
        if (!(fields_seen_ & (1u << static_cast<unsigned>(field::shape))))
          return fail("tensor " + quote(current_.name) + " has no shape");
        if (!(fields_seen_ & (1u << static_cast<unsigned>(field::data_offsets))))
          return fail("tensor " + quote(current_.name) + " has no data_offsets");
        tensors.push_back(std::move(current_));
        state_ = state::top;
        return true;
      default: return fail("unexpected end of object");
    }
  }

  bool end_array() {
    if (state_ == state::shape) {
      state_ = state::tensor;
      return true;
    }
    if (state_ == state::offsets) {
      if (offsets_seen_ != 2)
        return fail("data_offsets of " + quote(current_.name) + " must have 2 entries");
      state_ = state::tensor;
      return true;
    }
    return fail("unexpected end of array");
  }

  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& ex) {
    std::string what = ex.what();
    constexpr size_t max_shown = 200;
    if (what.size() > max_shown)
      what = what.substr(0, max_shown) + "...";
    return fail("header is not valid JSON: " + what);
  }

private:
  enum class state {
    top_begin,
    top,
    top_value,
    metadata,
    metadata_value,
    tensor,
    tensor_value,
    shape,
    offsets,
    done,
  };
  enum class field : unsigned { dtype, shape, data_offsets };

  bool fail(std::string message) {
    err = format_error(std::move(message));
    return false;
  }

  /// A value of the wrong JSON type for where the parser is.
  bool wrong_value(std::string_view got) {
    std::string is = " is " + std::string{got};
    switch (state_) {
      case state::top_begin: return fail("header is not a JSON object");
      case state::top_value:
        if (key_ == metadata_key)
          return fail("__metadata__" + is + ", not an object");
        return fail("tensor " + quote(key_) + is + ", not an object");
      case state::metadata_value:
        return fail("__metadata__ value of " + quote(key_) + is + ", not a string");
      case state::tensor_value:
        switch (field_) {
          case field::dtype:
            return fail("dtype of " + quote(current_.name) + is + ", not a string");
          case field::shape:
            return fail("shape of " + quote(current_.name) + is + ", not an array");
          case field::data_offsets:
            return fail("data_offsets of " + quote(current_.name) + is + ", not an array");
        }
        break;
      case state::shape:
        return fail("shape of " + quote(current_.name) + " has an entry that" + is
                    + ", not a non-negative integer");
      case state::offsets:
        return fail("data_offsets of " + quote(current_.name) + " has an entry that" + is
                    + ", not a non-negative integer");
      default: break;
    }
    return fail("unexpected value in header:" + is);
  }

  state state_ = state::top_begin;
  field field_ = field::dtype;
  unsigned fields_seen_ = 0;
  unsigned offsets_seen_ = 0;
  std::string key_;
  tensor_info current_;
  std::unordered_set<std::string> top_keys_;
};

uint64_t load_le64(const std::byte* p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i)
    value = (value << 8) | std::to_integer<uint64_t>(p[i]);
  return value;
}

void store_le64(std::byte* p, uint64_t value) {
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<std::byte>(value >> (8 * i));
}

/// Orders the tensors by offset and checks they tile [0, data_size) exactly,
/// each with the bytes its dtype and shape need.
result<uint64_t> check_layout(std::vector<tensor_info>& tensors) {
  std::sort(tensors.begin(), tensors.end(), [](const tensor_info& a, const tensor_info& b) {
    return std::tie(a.data_begin, a.data_end, a.name) < std::tie(b.data_begin, b.data_end, b.name);
  });
  uint64_t expected = 0;
  for (const auto& t : tensors) {
    if (t.data_end < t.data_begin)
      return format_error("data_offsets of " + quote(t.name) + " end before they begin");
    if (t.data_begin > expected)
      return format_error("gap in data section: tensor " + quote(t.name) + " begins at "
                          + std::to_string(t.data_begin) + " but the previous tensor ends at "
                          + std::to_string(expected));
    if (t.data_begin < expected)
      return format_error("tensor " + quote(t.name) + " overlaps the previous tensor (begins at "
                          + std::to_string(t.data_begin) + ", previous ends at "
                          + std::to_string(expected) + ")");
    auto needed = byte_length(t.type, t.shape);
    if (!needed)
      return format_error("tensor " + quote(t.name) + ": " + needed.error().message);
    if (*needed != t.byte_size())
      return format_error("tensor " + quote(t.name) + " has " + std::to_string(t.byte_size())
                          + " bytes but dtype " + std::string{to_string(t.type)} + " shape "
                          + shape_string(t.shape) + " needs " + std::to_string(*needed));
    expected = t.data_end;
  }
  return expected;
}

result<file_view> parse_header_impl(std::span<const std::byte> prefix, const uint64_t* file_size) {
  auto size = read_header_size(prefix);
  if (!size)
    return std::move(size).error();
  uint64_t n = *size;
  if (n > prefix.size() - 8)
    return format_error("header size " + std::to_string(n) + " exceeds the "
                        + std::to_string(prefix.size() - 8) + " bytes available");
  const char* first = reinterpret_cast<const char*>(prefix.data() + 8);
  const char* last = first + n;
  if (n == 0 || *first != '{')
    return format_error("header is not a JSON object");
  header_handler handler;
  bool parsed = false;
  try {
    parsed = nlohmann::json::sax_parse(first, last, &handler, nlohmann::json::input_format_t::json,
                                       true, false);
  } catch (const std::exception& ex) {
    return format_error(std::string{"header could not be parsed: "} + ex.what());
  }
  if (!parsed) {
    if (handler.err.code == errc::none)
      return format_error("header could not be parsed");
    return std::move(handler.err);
  }
  auto data_size = check_layout(handler.tensors);
  if (!data_size)
    return std::move(data_size).error();
  file_view view;
  view.tensors = std::move(handler.tensors);
  view.metadata = std::move(handler.metadata);
  view.header_size = n;
  view.data_start = 8 + n;
  view.data_size = *data_size;
  if (file_size) {
    uint64_t available = *file_size - view.data_start;
    if (view.data_size > available)
      return format_error("tensor data ends at offset " + std::to_string(view.data_size)
                          + " beyond the data section's " + std::to_string(available)
                          + " bytes (truncated file or offsets out of range)");
    if (view.data_size < available)
      return format_error("data section has " + std::to_string(available - view.data_size)
                          + " trailing bytes after the last tensor");
  }
  return view;
}

/// The header JSON, unpadded. Throws nlohmann's type_error on invalid UTF-8.
std::string header_json(std::span<const tensor_info> layout, const metadata_map& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& meta = header[std::string{metadata_key}] = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata)
      meta[key] = value;
  }
  for (const auto& t : layout) {
    header[t.name] = {
      {"dtype", to_string(t.type)},
      {"shape", t.shape},
      {"data_offsets", {t.data_begin, t.data_end}},
    };
  }
  return header.dump();
}

} // namespace

std::string_view to_string(dtype type) noexcept {
  switch (type) {
    case dtype::bool_: return "BOOL";
    case dtype::u8: return "U8";
    case dtype::i8: return "I8";
    case dtype::f8_e5m2: return "F8_E5M2";
    case dtype::f8_e4m3: return "F8_E4M3";
    case dtype::f8_e8m0: return "F8_E8M0";
    case dtype::i16: return "I16";
    case dtype::u16: return "U16";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::i32: return "I32";
    case dtype::u32: return "U32";
    case dtype::f32: return "F32";
    case dtype::c64: return "C64";
    case dtype::f64: return "F64";
    case dtype::i64: return "I64";
    case dtype::u64: return "U64";
    case dtype::f4: return "F4";
    case dtype::f6_e2m3: return "F6_E2M3";
    case dtype::f6_e3m2: return "F6_E3M2";
  }
  return "unknown";
}

result<dtype> parse_dtype(std::string_view name) {
  for (auto type : all_dtypes) {
    if (to_string(type) == name)
      return type;
  }
  return format_error("unknown dtype " + quote(name));
}

unsigned bits_per_element(dtype type) noexcept {
  switch (type) {
    case dtype::f4: return 4;
    case dtype::f6_e2m3:
    case dtype::f6_e3m2: return 6;
    case dtype::bool_:
    case dtype::u8:
    case dtype::i8:
    case dtype::f8_e5m2:
    case dtype::f8_e4m3:
    case dtype::f8_e8m0: return 8;
    case dtype::i16:
    case dtype::u16:
    case dtype::f16:
    case dtype::bf16: return 16;
    case dtype::i32:
    case dtype::u32:
    case dtype::f32: return 32;
    case dtype::c64:
    case dtype::f64:
    case dtype::i64:
    case dtype::u64: return 64;
  }
  return 8;
}

result<uint64_t> byte_length(dtype type, std::span<const uint64_t> shape) {
  uint64_t numel = 1;
  for (auto dim : shape) {
    if (__builtin_mul_overflow(numel, dim, &numel))
      return format_error("element count of shape " + shape_string(shape) + " overflows");
  }
  uint64_t bits = 0;
  if (__builtin_mul_overflow(numel, uint64_t{bits_per_element(type)}, &bits))
    return format_error("byte length of shape " + shape_string(shape) + " overflows");
  return bits / 8 + (bits % 8 != 0 ? 1 : 0);
}

const tensor_info* file_view::find(std::string_view name) const noexcept {
  for (const auto& t : tensors) {
    if (t.name == name)
      return &t;
  }
  return nullptr;
}

std::span<const std::byte> file_view::bytes(const tensor_info& t) const noexcept {
  if (t.data_end > data.size() || t.data_begin > t.data_end)
    return {};
  return data.subspan(t.data_begin, t.byte_size());
}

result<uint64_t> read_header_size(std::span<const std::byte> file_prefix) {
  if (file_prefix.size() < 8)
    return format_error("file has " + std::to_string(file_prefix.size())
                        + " bytes, fewer than the 8-byte header size prefix");
  uint64_t n = load_le64(file_prefix.data());
  if (n > max_header_size)
    return format_error("header size " + std::to_string(n) + " exceeds the limit of "
                        + std::to_string(max_header_size) + " bytes");
  return n;
}

result<file_view> parse_header(std::span<const std::byte> file_prefix) {
  return parse_header_impl(file_prefix, nullptr);
}

result<file_view> parse_header(std::span<const std::byte> file_prefix, uint64_t file_size) {
  if (file_prefix.size() > file_size)
    return make_error(errc::invalid_argument, "prefix is longer than the file size");
  return parse_header_impl(file_prefix, &file_size);
}

result<file_view> parse(std::span<const std::byte> whole_file) {
  uint64_t size = whole_file.size();
  auto view = parse_header_impl(whole_file, &size);
  if (view)
    view->data = whole_file.subspan(view->data_start, view->data_size);
  return view;
}

result<header_bytes> serialize_header(std::span<const tensor_spec> tensors,
                                      const metadata_map& metadata) {
  header_bytes out;
  out.layout.reserve(tensors.size());
  std::unordered_set<std::string_view> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (auto ok = check_tensor_name(t.name); !ok)
      return std::move(ok).error();
    if (t.name == metadata_key)
      return format_error("tensor name __metadata__ is reserved");
    if (!names.insert(t.name).second)
      return format_error("duplicate tensor name " + quote(t.name));
    if (t.shape.size() > max_rank)
      return format_error("shape of " + quote(t.name) + " has more than " + std::to_string(max_rank)
                          + " dimensions");
    auto size = byte_length(t.type, t.shape);
    if (!size)
      return format_error("tensor " + quote(t.name) + ": " + size.error().message);
    uint64_t end = 0;
    if (__builtin_add_overflow(offset, *size, &end))
      return format_error("data section size overflows");
    out.layout.push_back(tensor_info{t.name, t.type, t.shape, offset, end});
    offset = end;
  }
  out.data_size = offset;
  std::string json;
  try {
    json = header_json(out.layout, metadata);
  } catch (const std::exception& ex) {
    return format_error(std::string{"header cannot be encoded: "} + ex.what());
  }
  uint64_t padded = (json.size() + 7) / 8 * 8;
  if (padded > max_header_size)
    return format_error("header of " + std::to_string(padded) + " bytes exceeds the limit of "
                        + std::to_string(max_header_size) + " bytes");
  json.resize(padded, ' ');
  out.bytes.resize(8 + padded);
  store_le64(out.bytes.data(), padded);
  std::memcpy(out.bytes.data() + 8, json.data(), json.size());
  return out;
}

result<std::vector<std::byte>> serialize(std::span<const tensor_to_write> tensors,
                                         const metadata_map& metadata) {
  std::vector<tensor_spec> specs;
  specs.reserve(tensors.size());
  for (const auto& t : tensors)
    specs.push_back(tensor_spec{t.name, t.type, t.shape});
  auto header = serialize_header(specs, metadata);
  if (!header)
    return std::move(header).error();
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].data.size() != header->layout[i].byte_size())
      return make_error(errc::invalid_argument, "tensor " + quote(tensors[i].name) + " has "
                                                  + std::to_string(tensors[i].data.size())
                                                  + " bytes but its shape needs "
                                                  + std::to_string(header->layout[i].byte_size()));
  }
  std::vector<std::byte> out = std::move(header->bytes);
  out.reserve(out.size() + header->data_size);
  for (const auto& t : tensors)
    out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

result<stream_writer> stream_writer::start(std::span<const tensor_spec> tensors,
                                           const metadata_map& metadata, byte_sink sink) {
  if (!sink)
    return make_error(errc::invalid_argument, "stream_writer needs a sink");
  auto header = serialize_header(tensors, metadata);
  if (!header)
    return std::move(header).error();
  if (auto ok = sink(header->bytes); !ok)
    return std::move(ok).error();
  return stream_writer{std::move(header->layout), header->data_size, std::move(sink)};
}

status stream_writer::write(std::span<const std::byte> bytes) {
  if (bytes.size() > remaining())
    return make_error(errc::invalid_argument,
                      "write of " + std::to_string(bytes.size()) + " bytes exceeds the "
                        + std::to_string(remaining()) + " bytes left in the data section");
  if (bytes.empty())
    return {};
  if (auto ok = sink_(bytes); !ok)
    return ok;
  written_ += bytes.size();
  return {};
}

status stream_writer::finish() const {
  if (remaining() != 0)
    return make_error(errc::invalid_argument,
                      "data section incomplete: " + std::to_string(remaining())
                        + " bytes still expected");
  return {};
}

} // namespace stitch::safetensors
