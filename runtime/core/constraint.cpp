#include "runtime/core/constraint.hpp"
#include "runtime/core/json_depth.hpp"

#include <charconv>
#include <cstdio>
#include <exception>
#include <limits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace stitch {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr std::string_view weight_version_key = "weight_version";
constexpr std::string_view body_min_field = "weight_version.min_version";
constexpr std::string_view body_exact_field = "weight_version.exact_version";
constexpr std::string_view utf8_bom = "\xEF\xBB\xBF";

error bad_request(std::string message) {
  return make_error(errc::invalid_argument, std::move(message));
}

/// Checks JSON syntax without building a DOM, keeping nlohmann's message.
class syntax_checker {
public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(number_integer_t) { return true; }
  bool number_unsigned(number_unsigned_t) { return true; }
  bool number_float(number_float_t, const string_t&) { return true; }
  bool string(string_t&) { return true; }
  bool binary(binary_t&) { return true; }
  bool start_object(size_t) { return true; }
  bool key(string_t&) { return true; }
  bool end_object() { return true; }
  bool start_array(size_t) { return true; }
  bool end_array() { return true; }

  template <class Exception>
  bool parse_error(size_t, const std::string&, const Exception& ex) {
    message = ex.what();
    return false;
  }

  std::string message;
};

// The scanners below run only on text nlohmann accepted, so they can skip
// values by their first byte and bracket depth without re-checking syntax.

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

size_t skip_ws(std::string_view t, size_t i) {
  while (i < t.size() && is_ws(t[i]))
    ++i;
  return i;
}

size_t skip_string(std::string_view t, size_t i) {
  for (++i; i < t.size(); ++i) {
    if (t[i] == '\\')
      ++i;
    else if (t[i] == '"')
      return i + 1;
  }
  return t.size();
}

size_t skip_value(std::string_view t, size_t i) {
  if (i >= t.size())
    return i;
  if (t[i] == '"')
    return skip_string(t, i);
  if (t[i] == '{' || t[i] == '[') {
    size_t depth = 0;
    while (i < t.size()) {
      char c = t[i];
      if (c == '"') {
        i = skip_string(t, i);
        continue;
      }
      if (c == '{' || c == '[')
        ++depth;
      else if ((c == '}' || c == ']') && --depth == 0)
        return i + 1;
      ++i;
    }
    return i;
  }
  while (i < t.size() && !is_ws(t[i]) && t[i] != ',' && t[i] != '}' && t[i] != ']')
    ++i;
  return i;
}

/// The text of a JSON string token (with its quotes) as a std::string.
std::string decode_string(std::string_view token) {
  std::string_view inner = token.substr(1, token.size() - 2);
  if (inner.find('\\') == std::string_view::npos)
    return std::string(inner);
  json v = json::parse(token, nullptr, false);
  return v.is_string() ? v.get<std::string>() : std::string(inner);
}

/// One `"key": value` of an object: byte offsets into the scanned text.
struct member_span {
  size_t begin = 0;
  std::string_view key_token;
  size_t value_begin = 0;
  size_t value_end = 0;
};

/// The members of the (valid) object starting at `t[open] == '{'`.
std::vector<member_span> scan_members(std::string_view t, size_t open) {
  std::vector<member_span> out;
  size_t i = skip_ws(t, open + 1);
  while (i < t.size() && t[i] == '"') {
    member_span m;
    m.begin = i;
    size_t key_end = skip_string(t, i);
    m.key_token = t.substr(i, key_end - i);
    i = skip_ws(t, key_end) + 1; // past ':'
    m.value_begin = skip_ws(t, i);
    m.value_end = skip_value(t, m.value_begin);
    out.push_back(m);
    i = skip_ws(t, m.value_end);
    if (i < t.size() && t[i] == ',')
      i = skip_ws(t, i + 1);
  }
  return out;
}

/// Rules shared by body values and headers: digits only (no sign, no
/// spaces), fitting in int64.
result<uint64_t> parse_decimal(std::string_view text, std::string_view field,
                               std::string_view what) {
  if (text.empty())
    return bad_request(std::string(field) + ": " + std::string(what)
                       + " is empty; expected a decimal integer");
  for (char c : text)
    if (c < '0' || c > '9')
      return bad_request(std::string(field) + ": " + std::string(what) + " " + quote_untrusted(text)
                         + " is not a decimal integer (digits only, no sign or spaces)");
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || ptr != text.data() + text.size())
    return bad_request(std::string(field) + ": " + std::string(what) + " " + quote_untrusted(text)
                       + " is larger than " + std::to_string(std::numeric_limits<int64_t>::max()));
  return static_cast<uint64_t>(value);
}

std::string describe_token(std::string_view token) {
  if (token.empty())
    return "nothing";
  switch (token.front()) {
    case '{': return "an object";
    case '[': return "an array";
    case '"': return "the string " + quote_untrusted(decode_string(token));
    default: return std::string(token.substr(0, 80));
  }
}

/// A `weight_version` member's value: a JSON integer, a decimal string, or null.
result<std::optional<uint64_t>> parse_version_token(std::string_view token,
                                                    std::string_view field) {
  if (token == "null")
    return std::optional<uint64_t>{};
  const std::string expected = " must be a non-negative integer or a decimal-integer string, got ";
  char first = token.empty() ? '\0' : token.front();
  if (first == '"') {
    auto value = parse_decimal(decode_string(token), field, "the string");
    if (!value)
      return std::move(value).error();
    return std::optional<uint64_t>{*value};
  }
  if (first == '-' || (first >= '0' && first <= '9')) {
    if (token.find_first_of(".eE") != std::string_view::npos)
      return bad_request(std::string(field) + " must be an integer, got " + describe_token(token));
    if (first == '-')
      return bad_request(std::string(field) + " must be non-negative, got "
                         + describe_token(token));
    auto value = parse_decimal(token, field, "the number");
    if (!value)
      return std::move(value).error();
    return std::optional<uint64_t>{*value};
  }
  return bad_request(std::string(field) + expected + describe_token(token));
}

status check_order(const constraint& c, std::string_view min_field, std::string_view exact_field) {
  if (c.min_version && c.exact_version && *c.exact_version < *c.min_version)
    return bad_request(std::string(exact_field) + " " + std::to_string(*c.exact_version)
                       + " is below " + std::string(min_field) + " "
                       + std::to_string(*c.min_version));
  return {};
}

/// The `weight_version` object's text -> constraint.
result<constraint> interpret(std::string_view t, size_t value_begin, size_t value_end) {
  std::string_view token = t.substr(value_begin, value_end - value_begin);
  constraint c;
  if (token == "null")
    return c;
  if (token.empty() || token.front() != '{')
    return bad_request("weight_version must be a JSON object, got " + describe_token(token));
  bool seen_min = false;
  bool seen_exact = false;
  for (const auto& m : scan_members(t, value_begin)) {
    std::string key = decode_string(m.key_token);
    std::string_view value = t.substr(m.value_begin, m.value_end - m.value_begin);
    bool is_min = key == "min_version";
    if (!is_min && key != "exact_version")
      return bad_request("weight_version: unknown key " + quote_untrusted(key)
                         + " (expected min_version or exact_version)");
    bool& seen = is_min ? seen_min : seen_exact;
    if (seen)
      return bad_request("weight_version." + key + " is given twice");
    seen = true;
    auto parsed = parse_version_token(value, is_min ? body_min_field : body_exact_field);
    if (!parsed)
      return std::move(parsed).error();
    (is_min ? c.min_version : c.exact_version) = *parsed;
  }
  if (auto ok = check_order(c, body_min_field, body_exact_field); !ok)
    return std::move(ok).error();
  return c;
}

struct located {
  constraint c;
  /// Bytes to cut out of the body to remove `weight_version`, if present.
  std::optional<std::pair<size_t, size_t>> cut;
};

result<located> locate(std::string_view body) {
  if (!json_nesting_within(body))
    return bad_request("request body nests JSON deeper than " + std::to_string(max_json_depth)
                       + " levels");
  try {
    syntax_checker checker;
    if (!json::sax_parse(body.begin(), body.end(), &checker))
      return bad_request(
        "request body must be a JSON object (it is not valid JSON: " + checker.message + ")");
  } catch (const std::exception& ex) {
    return bad_request(std::string("request body must be a JSON object (") + ex.what() + ")");
  }
  // nlohmann skips a leading byte-order mark; so must the scanner.
  size_t open = skip_ws(body, body.starts_with(utf8_bom) ? utf8_bom.size() : 0);
  if (open >= body.size() || body[open] != '{')
    return bad_request("request body must be a JSON object");
  auto members = scan_members(body, open);
  located out;
  std::optional<size_t> found;
  for (size_t k = 0; k < members.size(); ++k) {
    if (decode_string(members[k].key_token) != weight_version_key)
      continue;
    if (found)
      return bad_request("weight_version is given twice in the request body");
    found = k;
  }
  if (!found)
    return out;
  const auto& m = members[*found];
  auto c = interpret(body, m.value_begin, m.value_end);
  if (!c)
    return std::move(c).error();
  out.c = *c;
  // Take the comma before the member, or after it when it comes first.
  if (*found > 0)
    out.cut = {members[*found - 1].value_end, m.value_end};
  else if (members.size() > 1)
    out.cut = {m.begin, members[1].begin};
  else
    out.cut = {m.begin, m.value_end};
  return out;
}

} // namespace

result<constraint> constraint_from_body(std::string_view json_body) {
  auto found = locate(json_body);
  if (!found)
    return std::move(found).error();
  return found->c;
}

result<stripped_request> strip_constraint(std::string_view json_body) {
  auto found = locate(json_body);
  if (!found)
    return std::move(found).error();
  stripped_request out{found->c, std::string(json_body)};
  if (found->cut)
    out.body_without_constraint.erase(found->cut->first, found->cut->second - found->cut->first);
  return out;
}

result<constraint> constraint_from_headers(std::optional<std::string_view> min_header,
                                           std::optional<std::string_view> exact_header) {
  constraint c;
  if (min_header) {
    auto v = parse_decimal(*min_header, min_version_header, "the value");
    if (!v)
      return std::move(v).error();
    c.min_version = *v;
  }
  if (exact_header) {
    auto v = parse_decimal(*exact_header, exact_version_header, "the value");
    if (!v)
      return std::move(v).error();
    c.exact_version = *v;
  }
  if (auto ok = check_order(c, min_version_header, exact_version_header); !ok)
    return std::move(ok).error();
  return c;
}

result<constraint> merge(const constraint& body, const constraint& headers) {
  auto agree = [](const char* field, const std::optional<uint64_t>& b,
                  const std::optional<uint64_t>& h, std::string_view header) -> status {
    if (b && h && *b != *h)
      return bad_request(std::string(field) + ": body says " + std::to_string(*b) + " but header "
                         + std::string(header) + " says " + std::to_string(*h));
    return {};
  };
  if (auto ok = agree("min_version", body.min_version, headers.min_version, min_version_header);
      !ok)
    return std::move(ok).error();
  if (auto ok =
        agree("exact_version", body.exact_version, headers.exact_version, exact_version_header);
      !ok)
    return std::move(ok).error();
  constraint c;
  c.min_version = body.min_version ? body.min_version : headers.min_version;
  c.exact_version = body.exact_version ? body.exact_version : headers.exact_version;
  std::string min_field =
    body.min_version ? std::string(body_min_field) : "header " + std::string(min_version_header);
  std::string exact_field = body.exact_version ? std::string(body_exact_field)
                                               : "header " + std::string(exact_version_header);
  if (auto ok = check_order(c, min_field, exact_field); !ok)
    return std::move(ok).error();
  return c;
}

rejection reject(const constraint& c, std::optional<uint64_t> applied) {
  rejection r;
  r.applied = applied;
  std::string have = applied ? "this replica has applied version " + std::to_string(*applied)
                             : "this replica has no version applied yet";
  if (c.exact_version) {
    r.target_version = *c.exact_version;
    if (applied && *applied > *c.exact_version) {
      r.retryable = false;
      r.message = "exact_version " + std::to_string(*c.exact_version)
                  + " was requested but this replica serves version " + std::to_string(*applied)
                  + " and never goes back";
      return r;
    }
    r.message = "exact_version " + std::to_string(*c.exact_version) + " was requested but " + have
                + "; retry later";
    return r;
  }
  if (c.min_version) {
    r.target_version = *c.min_version;
    r.message = "min_version " + std::to_string(*c.min_version) + " was requested but " + have
                + "; retry later";
    return r;
  }
  r.message = "no weight version constraint was given";
  return r;
}

std::string rejection_json(const rejection& r) {
  ordered_json body = ordered_json::object();
  body["type"] = "WeightVersionNotReady";
  body["target_version"] = r.target_version;
  body["applied"] = r.applied ? ordered_json(*r.applied) : ordered_json(nullptr);
  body["message"] = r.message;
  body["retryable"] = r.retryable;
  ordered_json out = body;
  out["error"] = std::move(body);
  return out.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

bool is_versioned_route(std::string_view path) noexcept {
  return path == "/generate" || path == "/v1/completions" || path == "/v1/chat/completions";
}

std::string error_json(std::string_view type, std::string_view message, bool retryable) {
  ordered_json body = ordered_json::object();
  body["type"] = type;
  body["message"] = message;
  body["retryable"] = retryable;
  ordered_json out = body;
  out["error"] = std::move(body);
  return out.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

} // namespace stitch
