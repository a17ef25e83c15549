#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/core/error.hpp"
#include "transport/http_client.hpp"
#include "transport/s3_xml.hpp"

namespace stitch::transport {

/// AWS credentials. `session_token` is empty for long-term keys.
struct s3_credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;
};

/// How to reach S3 or an S3-compatible server.
struct s3_config {
  /// `http://127.0.0.1:9000`; empty means `https://s3.<region>.amazonaws.com`.
  std::string endpoint;
  std::string region = "us-east-1";
  s3_credentials credentials;
  http_client_options http;
  /// Connections kept open for reuse; concurrent requests beyond it open more.
  size_t max_idle_connections = 8;
  /// Attempts for a request the server answered 500/502/503/504 (or `SlowDown`).
  unsigned max_attempts = 3;

  /// Reads `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
  /// `AWS_REGION` (else `AWS_DEFAULT_REGION`, else us-east-1) and
  /// `AWS_ENDPOINT_URL`.
  static s3_config from_environment();
};

/// `s3://bucket/prefix` split into its parts; `prefix` has no leading or
/// trailing '/' and may be empty.
struct s3_location {
  std::string bucket;
  std::string prefix;

  friend bool operator==(const s3_location&, const s3_location&) = default;
};

/// Parses `s3://bucket[/prefix...]`. The bucket must be a valid S3 bucket name
/// (3–63 of `[a-z0-9.-]`, starting and ending with a letter or digit); the
/// prefix may not hold empty, `.` or `..` components, control bytes or
/// backslashes. Errors are `invalid_argument` quoting the URI.
result<s3_location> parse_s3_uri(std::string_view uri);

/// AWS's URI encoding: every byte but `A-Za-z0-9-._~` becomes `%XX`
/// (upper-case hex); '/' is kept when `keep_slash` (paths) and encoded
/// otherwise (query names and values).
std::string uri_encode(std::string_view text, bool keep_slash);

/// Lower-case hex SHA-256 of `bytes`.
std::string sha256_hex(std::span<const std::byte> bytes);
std::string sha256_hex(std::string_view text);

/// SHA-256 of the empty string, the payload hash of a request without body.
inline constexpr std::string_view empty_payload_sha256 =
  "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// What SigV4 signs of one request.
struct sigv4_request {
  std::string_view method;
  /// The path, not yet encoded (`/bucket/key with spaces`); the signer
  /// encodes it as S3 does (each byte once, '/' kept).
  std::string_view path;
  /// Query parameters, not yet encoded; a bare `?uploads` is `{"uploads", ""}`.
  std::vector<std::pair<std::string, std::string>> query;
  /// Every header to sign, `host`, `x-amz-date` and `x-amz-content-sha256`
  /// included (names in any case; values are trimmed as SigV4 requires).
  http_headers headers;
  /// Hex SHA-256 of the body, or `UNSIGNED-PAYLOAD`.
  std::string_view payload_sha256;
  /// `20130524T000000Z`.
  std::string_view amz_date;
  std::string_view region;
  std::string_view service = "s3";
};

/// The intermediate results of signing, so each step can be checked against
/// AWS's published examples.
struct sigv4_signature {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signed_headers;
  /// Lower-case hex.
  std::string signature;
  /// The `Authorization` header value.
  std::string authorization;
};

/// AWS Signature Version 4 (header form), a pure function of its inputs.
sigv4_signature sigv4_sign(const sigv4_request& request, const s3_credentials& credentials);

/// The current time as SigV4's `YYYYMMDDTHHMMSSZ`.
std::string amz_date_now();

/// An object's identity as HEAD or a write reports it.
struct s3_object_info {
  /// The ETag as the server sent it (quotes included), for `If-Match`.
  std::string etag;
  uint64_t size = 0;
};

struct s3_object {
  std::string body;
  std::string etag;
};

/// A conditional write: `If-None-Match: *` (create only) or `If-Match: <etag>`.
struct s3_write_condition {
  enum class kind : uint8_t { none, if_absent, if_match };
  kind when = kind::none;
  std::string etag;

  static s3_write_condition absent() { return {kind::if_absent, {}}; }
  static s3_write_condition matching(std::string etag) { return {kind::if_match, std::move(etag)}; }
};

/// Maps an S3 error response to an error naming `what` (the operation and
/// key): `NoSuchKey` (or a 404 without body) → `not_found`,
/// `PreconditionFailed` / 412 → `conflict`, anything else →
/// `backend_failure` with the status, code and message.
stitch::error s3_error_to_error(unsigned status, std::string_view body, std::string_view what);

/// A part of a multipart upload, as UploadPart reported it.
struct s3_completed_part {
  uint32_t number = 0;
  std::string etag;
};

/// A small S3 client: path-style requests (`<endpoint>/<bucket>/<key>`)
/// signed with SigV4. Thread-safe: each request borrows a connection from an
/// internal pool, so concurrent callers run in parallel.
class s3_client {
public:
  /// Fails on an unparsable endpoint or missing credentials.
  static result<std::unique_ptr<s3_client>> open(s3_config config);
  ~s3_client();
  s3_client(const s3_client&) = delete;
  s3_client& operator=(const s3_client&) = delete;

  const s3_config& config() const noexcept;

  /// CreateBucket; an existing bucket this account can use is success.
  status create_bucket(std::string_view bucket);
  /// HeadBucket; `not_found` when it does not exist.
  status head_bucket(std::string_view bucket);

  /// PutObject. A failed condition is `conflict`.
  result<s3_object_info> put_object(std::string_view bucket, std::string_view key,
                                    std::span<const std::byte> body,
                                    const s3_write_condition& condition = {});
  result<s3_object_info> put_object(std::string_view bucket, std::string_view key,
                                    std::string_view body,
                                    const s3_write_condition& condition = {});
  /// GetObject of the whole object; a body over `limit` bytes (0 = the HTTP
  /// client's limit) is `limit_exceeded`.
  result<s3_object> get_object(std::string_view bucket, std::string_view key, size_t limit = 0);
  /// GetObject of `length` bytes at `offset` (`Range`); a response of another
  /// length is `backend_failure`.
  result<std::string> get_object_range(std::string_view bucket, std::string_view key,
                                       uint64_t offset, uint64_t length);
  /// HeadObject; `not_found` when missing.
  result<s3_object_info> head_object(std::string_view bucket, std::string_view key);
  /// DeleteObject; deleting a missing key is success (as in S3).
  status delete_object(std::string_view bucket, std::string_view key);

  /// CreateMultipartUpload; returns the upload id.
  result<std::string> create_multipart_upload(std::string_view bucket, std::string_view key);
  /// UploadPart (`number` from 1 to 10000); returns the part's ETag.
  result<std::string> upload_part(std::string_view bucket, std::string_view key,
                                  std::string_view upload_id, uint32_t number,
                                  std::span<const std::byte> body);
  /// CompleteMultipartUpload; an error inside a 200 response is reported too.
  result<s3_object_info> complete_multipart_upload(std::string_view bucket, std::string_view key,
                                                   std::string_view upload_id,
                                                   std::span<const s3_completed_part> parts);
  status abort_multipart_upload(std::string_view bucket, std::string_view key,
                                std::string_view upload_id);

  /// One page of ListObjectsV2 under `prefix`, grouped by `delimiter` when
  /// not empty, continuing at `continuation_token` when not empty.
  result<s3_list_page> list_objects_v2(std::string_view bucket, std::string_view prefix,
                                       std::string_view delimiter = {},
                                       std::string_view continuation_token = {},
                                       size_t max_keys = 1000);

private:
  struct impl;
  explicit s3_client(std::unique_ptr<impl> state);
  std::unique_ptr<impl> impl_;
};

} // namespace stitch::transport
