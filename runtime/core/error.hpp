#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace stitch {

/// The project's one error enum. Registered with CAF as category "stitch" in
/// `node`; the core only uses it as a value.
enum class errc : uint8_t {
  none = 0,
  /// Input that does not parse or validate (a 400-class problem).
  invalid_argument,
  /// A malformed or inconsistent manifest.
  invalid_manifest,
  /// A malformed safetensors file or index.
  invalid_format,
  /// A request constraint that cannot be satisfied right now (409).
  version_not_ready,
  /// A pointer move to a lower version of the same run.
  rewind,
  /// The version exists already with different content.
  version_exists,
  /// Compare-and-swap of the pointer lost against a concurrent change.
  conflict,
  /// A version, tensor or record that does not exist.
  not_found,
  /// A version chain with a hole in it.
  missing_link,
  /// Bytes whose checksum does not match the manifest.
  checksum_mismatch,
  /// A drain outlived its deadline and the holders were aborted.
  drain_timeout,
  /// The engine cannot serve (not ready, rebuilding, no run claimed).
  engine_unavailable,
  /// No run has been claimed in this pool.
  no_run_claimed,
  /// A route that belongs to the engine's control plane.
  route_blocked,
  /// The storage backend failed (I/O, RocksDB, S3).
  backend_failure,
  /// Stored data that fails validation (a corrupt record).
  corrupt_data,
  /// An activation or reset failed; the engine must be rebuilt.
  activation_failed,
  /// Decompression or delta decoding failed.
  decode_failure,
  /// A size or count over a configured limit.
  limit_exceeded,
  /// A mutating command without the admin token.
  unauthorized,
  /// A bounded queue or a limited resource is taken for now (a store lane,
  /// the publisher's sessions); nothing was started, so asking again after a
  /// moment is safe (HTTP 503 with `Retry-After`). Unlike `limit_exceeded`,
  /// which the same request meets again.
  busy,
};

/// The short name of an error code, e.g. "version_exists".
std::string_view to_string(errc code) noexcept;

/// An error code with a human-readable message naming the problem.
struct error {
  errc code = errc::none;
  std::string message;

  friend bool operator==(const error&, const error&) = default;
};

/// Renders "code: message".
std::string to_string(const error& err);

/// Untrusted text for an error message: single-quoted, at most `limit` bytes
/// (then "..."), control bytes escaped as \xNN.
std::string quote_untrusted(std::string_view text, size_t limit = 80);

/// Text for an error message (a path, a tensor or file name): single-quoted
/// in full, control bytes escaped as \xNN.
inline std::string in_quotes(std::string_view text) {
  return quote_untrusted(text, std::string_view::npos);
}

/// What an `errno` value means ("No such file or directory").
std::string errno_text(int err);

inline error make_error(errc code, std::string message) {
  return error{code, std::move(message)};
}

/// A value or an error, in the spirit of `std::expected` (C++23).
template <class T>
class [[nodiscard]] result {
public:
  result(T value) : data_(std::in_place_index<0>, std::move(value)) {}
  result(stitch::error err) : data_(std::in_place_index<1>, std::move(err)) {}

  bool has_value() const noexcept { return data_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  T& value() & { return std::get<0>(data_); }
  const T& value() const& { return std::get<0>(data_); }
  T&& value() && { return std::get<0>(std::move(data_)); }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const stitch::error& error() const& { return std::get<1>(data_); }
  stitch::error&& error() && { return std::get<1>(std::move(data_)); }

private:
  std::variant<T, stitch::error> data_;
};

/// Success or an error.
template <>
class [[nodiscard]] result<void> {
public:
  result() = default;
  result(stitch::error err) : err_(std::move(err)), failed_(true) {}

  bool has_value() const noexcept { return !failed_; }
  explicit operator bool() const noexcept { return !failed_; }
  const stitch::error& error() const& { return err_; }
  stitch::error&& error() && { return std::move(err_); }

private:
  stitch::error err_;
  bool failed_ = false;
};

using status = result<void>;

} // namespace stitch
