#pragma once

// S3's XML responses, read with expat (Debian's libexpat) as a stream of
// element events: no DOCTYPEs (so no entity definitions), bounded depth,
// text and document sizes. Apart from the client so the parsers are fuzzed
// alone (tests/fuzz/fuzz_s3_xml.cpp).

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/error.hpp"

namespace stitch::transport {

struct s3_list_entry {
  std::string key;
  uint64_t size = 0;
  std::string etag;

  friend bool operator==(const s3_list_entry&, const s3_list_entry&) = default;
};

/// One page of ListObjectsV2.
struct s3_list_page {
  std::vector<s3_list_entry> objects;
  /// With a delimiter: the "directories" below the prefix, each ending in it.
  std::vector<std::string> common_prefixes;
  bool truncated = false;
  std::string next_continuation_token;
};

/// Most bytes of XML the response parsers accept.
inline constexpr size_t max_s3_xml_bytes = size_t{16} << 20;
/// Most entries (objects plus common prefixes) one list page may hold.
inline constexpr size_t max_s3_list_entries = 100'000;

/// Parses a ListObjectsV2 response (`<ListBucketResult>`). Refuses DOCTYPEs,
/// input over `max_s3_xml_bytes`, nesting deeper than 16, more than
/// `max_s3_list_entries` entries, and malformed markup; a truncated page
/// without a continuation token is an error too. Errors are `backend_failure`.
result<s3_list_page> parse_list_objects_v2(std::string_view xml);

/// `<Error><Code>` and `<Message>` of an S3 error response; empty strings when
/// the body is not one.
struct s3_error_body {
  std::string code;
  std::string message;
};
s3_error_body parse_s3_error(std::string_view xml);

/// The text of the first element at `path` (root first), or nullopt (also
/// for bad XML).
std::optional<std::string> find_xml_text(std::string_view xml,
                                         std::initializer_list<std::string_view> path);

/// `text` with XML's five special characters escaped.
std::string xml_escape(std::string_view text);

} // namespace stitch::transport
