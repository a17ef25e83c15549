#include "transport/s3_client.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <mutex>
#include <thread>

namespace stitch::transport {

namespace {

char lower_ascii(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

std::string lower(std::string_view text) {
  std::string out{text};
  std::transform(out.begin(), out.end(), out.begin(), lower_ascii);
  return out;
}

std::string to_hex(const unsigned char* data, size_t size) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out.push_back(digits[data[i] >> 4]);
    out.push_back(digits[data[i] & 0xf]);
  }
  return out;
}

std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &size);
  return std::string{reinterpret_cast<const char*>(out), size};
}

/// Trims and collapses runs of spaces, as SigV4's canonical headers require.
std::string canonical_header_value(std::string_view value) {
  std::string out;
  bool space = false;
  for (char c : value) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space)
      out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

std::string canonical_query(std::vector<std::pair<std::string, std::string>> query) {
  for (auto& [name, value] : query) {
    name = uri_encode(name, false);
    value = uri_encode(value, false);
  }
  std::sort(query.begin(), query.end());
  std::string out;
  for (const auto& [name, value] : query) {
    if (!out.empty())
      out.push_back('&');
    out += name + "=" + value;
  }
  return out;
}

bool is_bucket_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
}

result<uint64_t> parse_u64(std::string_view text) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size())
    return make_error(errc::invalid_argument, "not a number");
  return value;
}

std::string header_or_empty(const http_response& r, std::string_view name) {
  const std::string* v = find_header(r.headers, name);
  return v ? *v : std::string{};
}

} // namespace

// ---------------------------------------------------------------------------

s3_config s3_config::from_environment() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? std::string{v} : std::string{};
  };
  s3_config c;
  c.credentials.access_key_id = env("AWS_ACCESS_KEY_ID");
  c.credentials.secret_access_key = env("AWS_SECRET_ACCESS_KEY");
  c.credentials.session_token = env("AWS_SESSION_TOKEN");
  c.region = env("AWS_REGION");
  if (c.region.empty())
    c.region = env("AWS_DEFAULT_REGION");
  if (c.region.empty())
    c.region = "us-east-1";
  c.endpoint = env("AWS_ENDPOINT_URL");
  return c;
}

result<s3_location> parse_s3_uri(std::string_view uri) {
  auto bad = [&](std::string why) {
    return make_error(errc::invalid_argument, "S3 URI " + quote_untrusted(uri) + " " + why);
  };
  if (!uri.starts_with("s3://"))
    return bad("must start with s3://");
  auto rest = uri.substr(5);
  auto slash = rest.find('/');
  s3_location out;
  out.bucket = std::string{rest.substr(0, slash)};
  if (out.bucket.size() < 3 || out.bucket.size() > 63
      || !std::all_of(out.bucket.begin(), out.bucket.end(), is_bucket_char)
      || !std::isalnum(static_cast<unsigned char>(out.bucket.front()))
      || !std::isalnum(static_cast<unsigned char>(out.bucket.back()))
      || out.bucket.find("..") != std::string::npos)
    return bad("has an invalid bucket name (3-63 of a-z 0-9 . -, starting and ending "
               "with a letter or digit)");
  if (slash == rest.npos)
    return out;
  auto prefix = rest.substr(slash + 1);
  while (prefix.ends_with('/'))
    prefix.remove_suffix(1);
  if (prefix.size() > 512)
    return bad("has a prefix over 512 bytes");
  size_t pos = 0;
  while (!prefix.empty() && pos <= prefix.size()) {
    auto next = prefix.find('/', pos);
    auto part = prefix.substr(pos, next == prefix.npos ? prefix.npos : next - pos);
    if (part.empty() || part == "." || part == "..")
      return bad("has an empty, '.' or '..' component in its prefix");
    for (char c : part) {
      auto u = static_cast<unsigned char>(c);
      if (u < 0x20 || u == 0x7f || c == '\\')
        return bad("has a control byte or backslash in its prefix");
    }
    if (next == prefix.npos)
      break;
    pos = next + 1;
  }
  out.prefix = std::string{prefix};
  return out;
}

std::string uri_encode(std::string_view text, bool keep_slash) {
  static constexpr char digits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'
        || c == '.' || c == '_' || c == '~' || (c == '/' && keep_slash)) {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(digits[u >> 4]);
      out.push_back(digits[u & 0xf]);
    }
  }
  return out;
}

std::string sha256_hex(std::span<const std::byte> bytes) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(bytes.data(), bytes.size(), out, &size, EVP_sha256(), nullptr);
  return to_hex(out, size);
}

std::string sha256_hex(std::string_view text) {
  return sha256_hex(std::as_bytes(std::span{text.data(), text.size()}));
}

sigv4_signature sigv4_sign(const sigv4_request& request, const s3_credentials& credentials) {
  sigv4_signature out;
  // Canonical headers: lower-case names, sorted, repeated names joined by ','.
  std::vector<std::pair<std::string, std::string>> headers;
  for (const auto& h : request.headers)
    headers.emplace_back(lower(h.name), canonical_header_value(h.value));
  std::stable_sort(headers.begin(), headers.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string canonical_headers;
  for (size_t i = 0; i < headers.size(); ++i) {
    if (i > 0 && headers[i].first == headers[i - 1].first) {
      canonical_headers.pop_back();
      canonical_headers += "," + headers[i].second + "\n";
      continue;
    }
    if (!out.signed_headers.empty())
      out.signed_headers.push_back(';');
    out.signed_headers += headers[i].first;
    canonical_headers += headers[i].first + ":" + headers[i].second + "\n";
  }
  const std::string path = request.path.empty() ? std::string{"/"} : uri_encode(request.path, true);
  out.canonical_request = std::string{request.method} + "\n" + path + "\n"
                          + canonical_query(request.query) + "\n" + canonical_headers + "\n"
                          + out.signed_headers + "\n" + std::string{request.payload_sha256};

  const std::string_view date = request.amz_date.substr(0, 8);
  const std::string scope = std::string{date} + "/" + std::string{request.region} + "/"
                            + std::string{request.service} + "/aws4_request";
  out.string_to_sign = "AWS4-HMAC-SHA256\n" + std::string{request.amz_date} + "\n" + scope + "\n"
                       + sha256_hex(out.canonical_request);
  std::string key = hmac_sha256("AWS4" + credentials.secret_access_key, date);
  key = hmac_sha256(key, request.region);
  key = hmac_sha256(key, request.service);
  key = hmac_sha256(key, "aws4_request");
  const std::string mac = hmac_sha256(key, out.string_to_sign);
  out.signature = to_hex(reinterpret_cast<const unsigned char*>(mac.data()), mac.size());
  out.authorization = "AWS4-HMAC-SHA256 Credential=" + credentials.access_key_id + "/" + scope
                      + ",SignedHeaders=" + out.signed_headers + ",Signature=" + out.signature;
  return out;
}

std::string amz_date_now() {
  std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%dT%H%M%SZ", &utc);
  return text;
}

stitch::error s3_error_to_error(unsigned status, std::string_view body, std::string_view what) {
  auto parsed = parse_s3_error(body);
  std::string detail = "HTTP " + std::to_string(status);
  if (!parsed.code.empty())
    detail += " " + parsed.code;
  if (!parsed.message.empty())
    detail += ": " + parsed.message.substr(0, 500);
  errc code = errc::backend_failure;
  if (parsed.code == "NoSuchKey" || (status == 404 && parsed.code.empty()))
    code = errc::not_found;
  else if (parsed.code == "PreconditionFailed" || status == 412
           || parsed.code == "ConditionalRequestConflict")
    code = errc::conflict;
  return make_error(code, std::string{what} + ": " + detail);
}

// ---------------------------------------------------------------------------

struct s3_client::impl {
  s3_config cfg;
  http_endpoint ep;
  std::mutex mutex;
  std::vector<std::unique_ptr<http_client>> idle;

  /// One S3 request before signing.
  struct call {
    std::string_view method;
    std::string_view bucket;
    std::string_view key;
    std::vector<std::pair<std::string, std::string>> query;
    http_headers headers;
    std::span<const std::byte> body;
    size_t body_limit = 0;
  };

  std::unique_ptr<http_client> borrow() {
    {
      std::lock_guard lock{mutex};
      if (!idle.empty()) {
        auto c = std::move(idle.back());
        idle.pop_back();
        return c;
      }
    }
    return std::make_unique<http_client>(ep, cfg.http);
  }

  void give_back(std::unique_ptr<http_client> c) {
    std::lock_guard lock{mutex};
    if (idle.size() < cfg.max_idle_connections)
      idle.push_back(std::move(c));
  }

  result<http_response> perform(const call& c) {
    std::string path = "/" + std::string{c.bucket};
    if (!c.key.empty())
      path += "/" + std::string{c.key};
    const std::string payload = sha256_hex(c.body);
    http_request req;
    req.method = std::string{c.method};
    req.target = uri_encode(path, true);
    std::string query;
    for (const auto& [name, value] : c.query) {
      query += query.empty() ? "?" : "&";
      query += uri_encode(name, false);
      if (!value.empty())
        query += "=" + uri_encode(value, false);
    }
    req.target += query;
    req.body = std::string_view{reinterpret_cast<const char*>(c.body.data()), c.body.size()};
    req.body_limit = c.body_limit;
    const bool conditional = std::any_of(c.headers.begin(), c.headers.end(), [](const auto& h) {
      return lower(h.name) == "if-match" || lower(h.name) == "if-none-match";
    });

    result<http_response> out = make_error(errc::backend_failure, "no attempt made");
    for (unsigned attempt = 0; attempt < std::max(1u, cfg.max_attempts); ++attempt) {
      if (attempt > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds{100} * (1u << (2 * attempt - 2)));
      const std::string date = amz_date_now();
      req.headers = c.headers;
      req.headers.push_back({"x-amz-date", date});
      req.headers.push_back({"x-amz-content-sha256", payload});
      if (!cfg.credentials.session_token.empty())
        req.headers.push_back({"x-amz-security-token", cfg.credentials.session_token});
      http_headers signed_headers = req.headers;
      signed_headers.push_back({"host", ep.host_header()});
      auto sig = sigv4_sign(
        sigv4_request{c.method, path, c.query, signed_headers, payload, date, cfg.region, "s3"},
        cfg.credentials);
      req.headers.push_back({"Authorization", sig.authorization});

      auto client = borrow();
      out = client->send(req);
      give_back(std::move(client));
      if (out) {
        const unsigned s = out->status;
        const bool transient = s == 500 || s == 502 || s == 503 || s == 504;
        if (!transient)
          return out;
      } else if (out.error().code != errc::backend_failure || conditional) {
        // A conditional write whose answer was lost may have been applied;
        // repeating it would report a false conflict.
        return out;
      }
    }
    return out;
  }
};

s3_client::s3_client(std::unique_ptr<impl> state) : impl_(std::move(state)) {}
s3_client::~s3_client() = default;

result<std::unique_ptr<s3_client>> s3_client::open(s3_config config) {
  if (config.region.empty())
    return make_error(errc::invalid_argument, "S3 region is empty");
  for (char c : config.region)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-'))
      return make_error(errc::invalid_argument,
                        "S3 region " + quote_untrusted(config.region) + " is invalid");
  if (config.credentials.access_key_id.empty() || config.credentials.secret_access_key.empty())
    return make_error(errc::invalid_argument,
                      "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
  if (config.endpoint.empty())
    config.endpoint = "https://s3." + config.region + ".amazonaws.com";
  auto ep = parse_endpoint(config.endpoint);
  if (!ep)
    return std::move(ep).error();
  auto state = std::make_unique<impl>();
  state->cfg = std::move(config);
  state->ep = std::move(*ep);
  return std::unique_ptr<s3_client>{new s3_client{std::move(state)}};
}

const s3_config& s3_client::config() const noexcept {
  return impl_->cfg;
}

namespace {

std::string describe_key(std::string_view op, std::string_view bucket, std::string_view key) {
  return std::string{op} + " s3://" + std::string{bucket} + "/" + std::string{key};
}

} // namespace

status s3_client::create_bucket(std::string_view bucket) {
  impl::call c{"PUT", bucket, {}, {}, {}, {}, 0};
  std::string body;
  if (impl_->cfg.region != "us-east-1")
    body = "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
           "<LocationConstraint>"
           + impl_->cfg.region + "</LocationConstraint></CreateBucketConfiguration>";
  c.body = std::as_bytes(std::span{body.data(), body.size()});
  auto r = impl_->perform(c);
  if (!r)
    return std::move(r).error();
  if (r->status == 200)
    return {};
  const auto code = parse_s3_error(r->body).code;
  if (code == "BucketAlreadyOwnedByYou")
    return {};
  // Some servers (s3rver) say BucketAlreadyExists for one's own bucket too.
  if (code == "BucketAlreadyExists" && head_bucket(bucket))
    return {};
  return s3_error_to_error(r->status, r->body, "CreateBucket " + std::string{bucket});
}

status s3_client::head_bucket(std::string_view bucket) {
  auto r = impl_->perform(impl::call{"HEAD", bucket, {}, {}, {}, {}, 0});
  if (!r)
    return std::move(r).error();
  if (r->status == 200)
    return {};
  if (r->status == 404)
    return make_error(errc::not_found, "bucket '" + std::string{bucket} + "' does not exist at "
                                         + impl_->ep.to_string());
  return s3_error_to_error(r->status, r->body, "HeadBucket " + std::string{bucket});
}

result<s3_object_info> s3_client::put_object(std::string_view bucket, std::string_view key,
                                             std::span<const std::byte> body,
                                             const s3_write_condition& condition) {
  impl::call c{"PUT", bucket, key, {}, {}, body, 0};
  if (condition.when == s3_write_condition::kind::if_absent)
    c.headers.push_back({"If-None-Match", "*"});
  else if (condition.when == s3_write_condition::kind::if_match)
    c.headers.push_back({"If-Match", condition.etag});
  c.headers.push_back({"Content-Type", "application/octet-stream"});
  auto r = impl_->perform(c);
  if (!r)
    return std::move(r).error();
  if (r->status != 200)
    return s3_error_to_error(r->status, r->body, describe_key("PutObject", bucket, key));
  return s3_object_info{header_or_empty(*r, "ETag"), body.size()};
}

result<s3_object_info> s3_client::put_object(std::string_view bucket, std::string_view key,
                                             std::string_view body,
                                             const s3_write_condition& condition) {
  return put_object(bucket, key, std::as_bytes(std::span{body.data(), body.size()}), condition);
}

result<s3_object> s3_client::get_object(std::string_view bucket, std::string_view key,
                                        size_t limit) {
  auto r = impl_->perform(impl::call{"GET", bucket, key, {}, {}, {}, limit});
  if (!r)
    return std::move(r).error();
  if (r->status != 200)
    return s3_error_to_error(r->status, r->body, describe_key("GetObject", bucket, key));
  return s3_object{std::move(r->body), header_or_empty(*r, "ETag")};
}

result<std::string> s3_client::get_object_range(std::string_view bucket, std::string_view key,
                                                uint64_t offset, uint64_t length) {
  if (length == 0)
    return std::string{};
  if (offset + length < offset)
    return make_error(errc::invalid_argument, "range overflows");
  impl::call c{"GET", bucket, key, {}, {}, {}, static_cast<size_t>(length)};
  c.headers.push_back(
    {"Range", "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + length - 1)});
  auto r = impl_->perform(c);
  if (!r)
    return std::move(r).error();
  if (r->status != 206 && !(r->status == 200 && offset == 0))
    return s3_error_to_error(r->status, r->body, describe_key("GetObject (range)", bucket, key));
  if (r->body.size() != length)
    return make_error(errc::backend_failure, describe_key("GetObject (range)", bucket, key)
                                               + ": asked for " + std::to_string(length)
                                               + " bytes at " + std::to_string(offset) + ", got "
                                               + std::to_string(r->body.size()));
  return std::move(r->body);
}

result<s3_object_info> s3_client::head_object(std::string_view bucket, std::string_view key) {
  auto r = impl_->perform(impl::call{"HEAD", bucket, key, {}, {}, {}, 0});
  if (!r)
    return std::move(r).error();
  if (r->status != 200)
    return s3_error_to_error(r->status, r->body, describe_key("HeadObject", bucket, key));
  s3_object_info info{header_or_empty(*r, "ETag"), 0};
  auto length = header_or_empty(*r, "Content-Length");
  auto size = parse_u64(length);
  if (!size)
    return make_error(errc::backend_failure, describe_key("HeadObject", bucket, key)
                                               + ": bad Content-Length "
                                               + quote_untrusted(length, 32));
  info.size = *size;
  return info;
}

status s3_client::delete_object(std::string_view bucket, std::string_view key) {
  auto r = impl_->perform(impl::call{"DELETE", bucket, key, {}, {}, {}, 0});
  if (!r)
    return std::move(r).error();
  if (r->status == 204 || r->status == 200)
    return {};
  auto err = s3_error_to_error(r->status, r->body, describe_key("DeleteObject", bucket, key));
  if (err.code == errc::not_found)
    return {};
  return err;
}

result<std::string> s3_client::create_multipart_upload(std::string_view bucket,
                                                       std::string_view key) {
  impl::call c{"POST", bucket, key, {{"uploads", ""}}, {}, {}, 0};
  c.headers.push_back({"Content-Type", "application/octet-stream"});
  auto r = impl_->perform(c);
  if (!r)
    return std::move(r).error();
  if (r->status != 200)
    return s3_error_to_error(r->status, r->body,
                             describe_key("CreateMultipartUpload", bucket, key));
  auto id = find_xml_text(r->body, {"InitiateMultipartUploadResult", "UploadId"});
  if (!id || id->empty())
    return make_error(errc::backend_failure, describe_key("CreateMultipartUpload", bucket, key)
                                               + ": the response has no UploadId");
  return *id;
}

result<std::string> s3_client::upload_part(std::string_view bucket, std::string_view key,
                                           std::string_view upload_id, uint32_t number,
                                           std::span<const std::byte> body) {
  if (number < 1 || number > 10000)
    return make_error(errc::limit_exceeded,
                      "part number " + std::to_string(number) + " is outside 1..10000");
  impl::call c{
    "PUT", bucket,
    key,   {{"partNumber", std::to_string(number)}, {"uploadId", std::string{upload_id}}},
    {},    body,
    0};
  auto r = impl_->perform(c);
  if (!r)
    return std::move(r).error();
  if (r->status != 200)
    return s3_error_to_error(r->status, r->body,
                             describe_key("UploadPart " + std::to_string(number), bucket, key));
  auto etag = header_or_empty(*r, "ETag");
  if (etag.empty())
    return make_error(errc::backend_failure,
                      describe_key("UploadPart", bucket, key) + ": the response has no ETag");
  return etag;
}

result<s3_object_info>
s3_client::complete_multipart_upload(std::string_view bucket, std::string_view key,
                                     std::string_view upload_id,
                                     std::span<const s3_completed_part> parts) {
  std::string body = "<CompleteMultipartUpload>";
  for (const auto& p : parts)
    body += "<Part><PartNumber>" + std::to_string(p.number) + "</PartNumber><ETag>"
            + xml_escape(p.etag) + "</ETag></Part>";
  body += "</CompleteMultipartUpload>";
  impl::call c{"POST",
               bucket,
               key,
               {{"uploadId", std::string{upload_id}}},
               {{"Content-Type", "application/xml"}},
               std::as_bytes(std::span{body.data(), body.size()}),
               0};
  auto r = impl_->perform(c);
  if (!r)
    return std::move(r).error();
  const std::string what = describe_key("CompleteMultipartUpload", bucket, key);
  if (r->status != 200)
    return s3_error_to_error(r->status, r->body, what);
  // S3 may answer 200 and report the failure in the body.
  if (auto failure = parse_s3_error(r->body); !failure.code.empty())
    return make_error(errc::backend_failure, what + ": " + failure.code + ": " + failure.message);
  auto etag = find_xml_text(r->body, {"CompleteMultipartUploadResult", "ETag"});
  if (!etag)
    return make_error(errc::backend_failure, what + ": the response has no ETag");
  return s3_object_info{*etag, 0};
}

status s3_client::abort_multipart_upload(std::string_view bucket, std::string_view key,
                                         std::string_view upload_id) {
  auto r = impl_->perform(
    impl::call{"DELETE", bucket, key, {{"uploadId", std::string{upload_id}}}, {}, {}, 0});
  if (!r)
    return std::move(r).error();
  if (r->status == 204 || r->status == 200 || r->status == 404)
    return {};
  return s3_error_to_error(r->status, r->body, describe_key("AbortMultipartUpload", bucket, key));
}

result<s3_list_page> s3_client::list_objects_v2(std::string_view bucket, std::string_view prefix,
                                                std::string_view delimiter,
                                                std::string_view continuation_token,
                                                size_t max_keys) {
  impl::call c{"GET", bucket, {}, {{"list-type", "2"}}, {}, {}, max_s3_xml_bytes};
  if (!prefix.empty())
    c.query.emplace_back("prefix", std::string{prefix});
  if (!delimiter.empty())
    c.query.emplace_back("delimiter", std::string{delimiter});
  if (!continuation_token.empty())
    c.query.emplace_back("continuation-token", std::string{continuation_token});
  c.query.emplace_back("max-keys", std::to_string(std::clamp<size_t>(max_keys, 1, 1000)));
  auto r = impl_->perform(c);
  if (!r)
    return std::move(r).error();
  if (r->status != 200)
    return s3_error_to_error(
      r->status, r->body, "ListObjectsV2 s3://" + std::string{bucket} + "/" + std::string{prefix});
  return parse_list_objects_v2(r->body);
}

} // namespace stitch::transport
