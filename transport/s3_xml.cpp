#include "transport/s3_xml.hpp"

#include <expat.h>

#include <algorithm>
#include <charconv>
#include <functional>
#include <span>

#include "runtime/core/error.hpp"

namespace stitch::transport {

namespace {

// ---------------------------------------------------------------------------
// S3's XML responses, read with expat as a stream of element events.
// DOCTYPEs (and so entity definitions) are refused outright; depth, text
// and document sizes are bounded.

constexpr size_t max_xml_depth = 16;
constexpr size_t max_xml_text = 64 << 10;

struct xml_event {
  bool open = false;
  /// The element names from the root down to this element.
  std::span<const std::string> path;
  /// For a close: the element's own text, decoded.
  std::string_view text;
};

using xml_handler = std::function<status(const xml_event&)>;

stitch::error xml_error(std::string why) {
  return make_error(errc::backend_failure, "malformed XML from S3: " + std::move(why));
}

/// Element names without a namespace prefix (`s3:Key` is `Key`).
std::string local_name(std::string_view name) {
  auto colon = name.find(':');
  return std::string{colon == name.npos ? name : name.substr(colon + 1)};
}

/// One expat parse: its handlers feed `on` and stop at the first problem.
class xml_scan {
public:
  explicit xml_scan(const xml_handler& on) : on_(on), parser_(XML_ParserCreate("UTF-8")) {}
  ~xml_scan() {
    if (parser_)
      XML_ParserFree(parser_);
  }
  xml_scan(const xml_scan&) = delete;
  xml_scan& operator=(const xml_scan&) = delete;

  status run(std::string_view xml) {
    if (!parser_)
      return xml_error("cannot create an XML parser");
    XML_SetUserData(parser_, this);
    XML_SetElementHandler(parser_, &xml_scan::start, &xml_scan::end);
    XML_SetCharacterDataHandler(parser_, &xml_scan::chars);
    XML_SetStartDoctypeDeclHandler(parser_, &xml_scan::doctype);
    XML_SetEntityDeclHandler(parser_, &xml_scan::entity);
    auto done = XML_Parse(parser_, xml.data(), static_cast<int>(xml.size()), XML_TRUE);
    if (failed_)
      return *failed_;
    if (done != XML_STATUS_OK)
      return xml_error(std::string{XML_ErrorString(XML_GetErrorCode(parser_))} + " at line "
                       + std::to_string(XML_GetCurrentLineNumber(parser_)));
    return {};
  }

private:
  static xml_scan& of(void* data) { return *static_cast<xml_scan*>(data); }

  void fail(stitch::error e) {
    if (!failed_)
      failed_ = std::move(e);
    XML_StopParser(parser_, XML_FALSE);
  }

  static void XMLCALL start(void* data, const XML_Char* name, const XML_Char**) {
    auto& x = of(data);
    if (x.failed_)
      return;
    if (x.stack_.size() >= max_xml_depth)
      return x.fail(xml_error("nesting deeper than " + std::to_string(max_xml_depth)));
    x.stack_.push_back(local_name(name));
    x.texts_.emplace_back();
    if (auto ok = x.on_(xml_event{true, x.stack_, {}}); !ok)
      x.fail(ok.error());
  }

  static void XMLCALL end(void* data, const XML_Char*) {
    auto& x = of(data);
    if (x.failed_ || x.stack_.empty())
      return;
    if (auto ok = x.on_(xml_event{false, x.stack_, x.texts_.back()}); !ok)
      return x.fail(ok.error());
    x.stack_.pop_back();
    x.texts_.pop_back();
  }

  static void XMLCALL chars(void* data, const XML_Char* text, int len) {
    auto& x = of(data);
    if (x.failed_ || x.texts_.empty())
      return;
    x.texts_.back().append(text, static_cast<size_t>(len));
    if (x.texts_.back().size() > max_xml_text)
      x.fail(xml_error("an element's text is over " + std::to_string(max_xml_text) + " bytes"));
  }

  static void XMLCALL doctype(void* data, const XML_Char*, const XML_Char*, const XML_Char*, int) {
    of(data).fail(xml_error("DOCTYPE and other declarations are refused"));
  }

  static void XMLCALL entity(void* data, const XML_Char*, int, const XML_Char*, int,
                             const XML_Char*, const XML_Char*, const XML_Char*, const XML_Char*) {
    of(data).fail(xml_error("DOCTYPE and other declarations are refused"));
  }

  const xml_handler& on_;
  XML_Parser parser_;
  std::vector<std::string> stack_;
  std::vector<std::string> texts_;
  std::optional<stitch::error> failed_;
};

status scan_xml(std::string_view xml, const xml_handler& on) {
  if (xml.size() > max_s3_xml_bytes)
    return xml_error("the document is over " + std::to_string(max_s3_xml_bytes) + " bytes");
  return xml_scan{on}.run(xml);
}

bool path_is(std::span<const std::string> path, std::initializer_list<std::string_view> want) {
  return path.size() == want.size() && std::equal(path.begin(), path.end(), want.begin());
}

result<uint64_t> parse_u64(std::string_view text, std::string_view what) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size())
    return xml_error(std::string{what} + " is not a number: " + quote_untrusted(text, 32));
  return value;
}

} // namespace

std::string xml_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::optional<std::string> find_xml_text(std::string_view xml,
                                         std::initializer_list<std::string_view> path) {
  std::optional<std::string> found;
  auto ok = scan_xml(xml, [&](const xml_event& e) -> status {
    if (!e.open && !found && path_is(e.path, path))
      found = std::string{e.text};
    return {};
  });
  if (!ok)
    return std::nullopt;
  return found;
}

result<s3_list_page> parse_list_objects_v2(std::string_view xml) {
  s3_list_page page;
  std::optional<s3_error_body> failure;
  bool is_list = false;
  size_t entries = 0;
  auto ok = scan_xml(xml, [&](const xml_event& e) -> status {
    const auto& p = e.path;
    if (e.open) {
      if (p.size() == 1) {
        if (p[0] == "Error")
          failure.emplace();
        else if (p[0] == "ListBucketResult")
          is_list = true;
        else
          return xml_error("unexpected root element <" + p[0] + ">");
      } else if (is_list
                 && (path_is(p, {"ListBucketResult", "Contents"})
                     || path_is(p, {"ListBucketResult", "CommonPrefixes"}))) {
        if (++entries > max_s3_list_entries)
          return xml_error("a list page with over " + std::to_string(max_s3_list_entries)
                           + " entries");
        if (p[1] == "Contents")
          page.objects.emplace_back();
        else
          page.common_prefixes.emplace_back();
      }
      return {};
    }
    if (failure) {
      if (path_is(p, {"Error", "Code"}))
        failure->code = e.text;
      else if (path_is(p, {"Error", "Message"}))
        failure->message = e.text;
      return {};
    }
    if (path_is(p, {"ListBucketResult", "Contents", "Key"})) {
      page.objects.back().key = e.text;
    } else if (path_is(p, {"ListBucketResult", "Contents", "Size"})) {
      auto size = parse_u64(e.text, "Size");
      if (!size)
        return std::move(size).error();
      page.objects.back().size = *size;
    } else if (path_is(p, {"ListBucketResult", "Contents", "ETag"})) {
      page.objects.back().etag = e.text;
    } else if (path_is(p, {"ListBucketResult", "CommonPrefixes", "Prefix"})) {
      page.common_prefixes.back() = e.text;
    } else if (path_is(p, {"ListBucketResult", "IsTruncated"})) {
      if (e.text != "true" && e.text != "false")
        return xml_error("IsTruncated is " + quote_untrusted(e.text, 16));
      page.truncated = e.text == "true";
    } else if (path_is(p, {"ListBucketResult", "NextContinuationToken"})) {
      page.next_continuation_token = e.text;
    } else if (path_is(p, {"ListBucketResult", "Contents"})) {
      if (page.objects.back().key.empty())
        return xml_error("a <Contents> entry without a <Key>");
    } else if (path_is(p, {"ListBucketResult", "CommonPrefixes"})) {
      if (page.common_prefixes.back().empty())
        return xml_error("a <CommonPrefixes> entry without a <Prefix>");
    }
    return {};
  });
  if (!ok)
    return std::move(ok).error();
  if (failure)
    return make_error(errc::backend_failure,
                      "ListObjectsV2 failed: " + failure->code + ": " + failure->message);
  if (page.truncated && page.next_continuation_token.empty())
    return xml_error("a truncated list page without a NextContinuationToken");
  return page;
}

s3_error_body parse_s3_error(std::string_view xml) {
  s3_error_body out;
  if (xml.empty() || xml.size() > max_s3_xml_bytes)
    return out;
  (void) scan_xml(xml, [&](const xml_event& e) -> status {
    if (e.open)
      return {};
    if (path_is(e.path, {"Error", "Code"}))
      out.code = e.text;
    else if (path_is(e.path, {"Error", "Message"}))
      out.message = e.text;
    return {};
  });
  return out;
}

} // namespace stitch::transport
