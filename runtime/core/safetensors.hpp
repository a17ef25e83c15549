#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/error.hpp"

/// The safetensors file format: an 8-byte little-endian header size N, N bytes
/// of JSON header (`{"name": {"dtype", "shape", "data_offsets"}, ...,
/// "__metadata__": {string: string}}`), then the data section. Parsing never
/// throws and never trusts a size read from the input before checking it.
namespace stitch::safetensors {

/// Every dtype of the current safetensors spec.
enum class dtype : uint8_t {
  bool_,
  u8,
  i8,
  f8_e5m2,
  f8_e4m3,
  f8_e8m0,
  i16,
  u16,
  f16,
  bf16,
  i32,
  u32,
  f32,
  c64,
  f64,
  i64,
  u64,
  f4,
  f6_e2m3,
  f6_e3m2,
};

inline constexpr std::array all_dtypes{
  dtype::bool_, dtype::u8,  dtype::i8,   dtype::f8_e5m2, dtype::f8_e4m3, dtype::f8_e8m0, dtype::i16,
  dtype::u16,   dtype::f16, dtype::bf16, dtype::i32,     dtype::u32,     dtype::f32,     dtype::c64,
  dtype::f64,   dtype::i64, dtype::u64,  dtype::f4,      dtype::f6_e2m3, dtype::f6_e3m2,
};

/// The spec's name, e.g. "BF16", "F8_E4M3", "BOOL".
std::string_view to_string(dtype type) noexcept;

/// Parses a spec name (case-sensitive); an unknown name is `invalid_format`.
result<dtype> parse_dtype(std::string_view name);

/// Bits per element: 4 for F4, 6 for the F6 types, 8 for BOOL, 64 for C64.
unsigned bits_per_element(dtype type) noexcept;

/// Bytes of a tensor: numel × element size, or ceil(numel × bits / 8) for the
/// sub-byte dtypes (packed). Overflow of numel or bytes is `invalid_format`.
result<uint64_t> byte_length(dtype type, std::span<const uint64_t> shape);

/// Largest header the spec allows (and the only bound we need to allocate it).
inline constexpr uint64_t max_header_size = 100'000'000;

/// Largest shape rank accepted; bounds the memory a hostile header can claim.
inline constexpr size_t max_rank = 64;

/// The header key holding the free-form string metadata.
inline constexpr std::string_view metadata_key = "__metadata__";

using metadata_map = std::map<std::string, std::string>;

/// One tensor of a file: `data_begin`/`data_end` are the header's
/// `data_offsets`, relative to the start of the data section.
struct tensor_info {
  std::string name;
  dtype type = dtype::u8;
  std::vector<uint64_t> shape;
  uint64_t data_begin = 0;
  uint64_t data_end = 0;

  uint64_t byte_size() const noexcept { return data_end - data_begin; }

  friend bool operator==(const tensor_info&, const tensor_info&) = default;
};

/// A parsed file. `data` views the data section when the whole file was
/// given to `parse`; it is empty after `parse_header`.
struct file_view {
  /// Sorted by data offset (ties between empty tensors by name).
  std::vector<tensor_info> tensors;
  metadata_map metadata;
  /// N: the JSON header's length, padding included.
  uint64_t header_size = 0;
  /// 8 + N: where the data section starts in the file.
  uint64_t data_start = 0;
  /// Bytes of tensor data (the last tensor's end offset).
  uint64_t data_size = 0;
  std::span<const std::byte> data;

  /// The tensor named `name`, or nullptr.
  const tensor_info* find(std::string_view name) const noexcept;

  /// The bytes of `t` within `data` (empty after `parse_header`).
  std::span<const std::byte> bytes(const tensor_info& t) const noexcept;
};

/// Reads and bounds the 8-byte header size prefix: fewer than 8 bytes, or a
/// size above `max_header_size`, is `invalid_format`.
result<uint64_t> read_header_size(std::span<const std::byte> file_prefix);

/// Parses the header from a prefix of a file holding at least 8 + N bytes.
/// When `file_size` is known the tensors must end exactly at the file's end
/// (offsets out of range and trailing bytes are refused).
result<file_view> parse_header(std::span<const std::byte> file_prefix);
result<file_view> parse_header(std::span<const std::byte> file_prefix, uint64_t file_size);

/// Parses a whole file and sets `data` to its data section.
result<file_view> parse(std::span<const std::byte> whole_file);

/// A tensor's description for writing, without its bytes.
struct tensor_spec {
  std::string name;
  dtype type = dtype::u8;
  std::vector<uint64_t> shape;
};

/// A tensor with its bytes; `data.size()` must equal its `byte_length`.
struct tensor_to_write {
  std::string name;
  dtype type = dtype::u8;
  std::vector<uint64_t> shape;
  std::span<const std::byte> data;
};

/// Receives the file's bytes in order; an error stops the write.
using byte_sink = std::function<status(std::span<const std::byte>)>;

/// The header of a file to write: the 8-byte size prefix followed by the JSON
/// padded with spaces to a multiple of 8, and the layout it describes
/// (tensors contiguous from offset 0 in the order given).
struct header_bytes {
  std::vector<std::byte> bytes;
  std::vector<tensor_info> layout;
  uint64_t data_size = 0;
};

/// Builds a header; refuses invalid or duplicate names, overflowing shapes,
/// strings that are not UTF-8 and headers over `max_header_size`.
result<header_bytes> serialize_header(std::span<const tensor_spec> tensors,
                                      const metadata_map& metadata = {});

/// Serializes a whole file in memory.
result<std::vector<std::byte>> serialize(std::span<const tensor_to_write> tensors,
                                         const metadata_map& metadata = {});

/// Writes a file through a sink without holding its tensors in memory: the
/// header goes out on `start`, then the caller streams the data section in
/// pieces of any size (tensor after tensor, in the order given) and calls
/// `finish`, which checks that exactly the declared bytes arrived.
class stream_writer {
public:
  static result<stream_writer> start(std::span<const tensor_spec> tensors,
                                     const metadata_map& metadata, byte_sink sink);

  /// Forwards the next bytes of the data section; more than declared is an error.
  status write(std::span<const std::byte> bytes);

  /// Succeeds when the whole data section has been written.
  status finish() const;

  uint64_t remaining() const noexcept { return data_size_ - written_; }
  const std::vector<tensor_info>& layout() const noexcept { return layout_; }

private:
  stream_writer(std::vector<tensor_info> layout, uint64_t data_size, byte_sink sink)
      : layout_(std::move(layout)), data_size_(data_size), sink_(std::move(sink)) {}

  std::vector<tensor_info> layout_;
  uint64_t data_size_ = 0;
  uint64_t written_ = 0;
  byte_sink sink_;
};

} // namespace stitch::safetensors
