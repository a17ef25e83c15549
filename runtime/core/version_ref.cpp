#include "runtime/core/version_ref.hpp"

#include <charconv>
#include <cstdio>

namespace stitch {

namespace {

constexpr std::string_view dir_prefix = "weight_v";

bool is_run_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.'
         || c == '_' || c == '-';
}

std::optional<uint64_t> parse_digits(std::string_view digits) {
  if (digits.empty())
    return std::nullopt;
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc{} || ptr != digits.data() + digits.size())
    return std::nullopt;
  return value;
}

std::string_view trim(std::string_view text) {
  while (!text.empty()
         && (text.front() == ' ' || text.front() == '\t' || text.front() == '\n'
             || text.front() == '\r'))
    text.remove_prefix(1);
  while (
    !text.empty()
    && (text.back() == ' ' || text.back() == '\t' || text.back() == '\n' || text.back() == '\r'))
    text.remove_suffix(1);
  return text;
}

} // namespace

status validate_run_id(std::string_view run_id) {
  if (run_id.empty())
    return make_error(errc::invalid_argument, "run id is empty");
  if (run_id.size() > max_run_id_length)
    return make_error(errc::invalid_argument,
                      "run id " + quote_untrusted(run_id) + " is longer than 64 characters");
  if (run_id == "." || run_id == "..")
    return make_error(errc::invalid_argument,
                      "run id " + quote_untrusted(run_id) + " is not allowed");
  for (char c : run_id)
    if (!is_run_char(c))
      return make_error(errc::invalid_argument,
                        "run id " + quote_untrusted(run_id) + " may only contain [A-Za-z0-9._-]");
  return {};
}

status validate_pool(std::string_view pool) {
  if (auto ok = validate_run_id(pool); !ok)
    return make_error(errc::invalid_argument, "pool name: " + ok.error().message);
  return {};
}

std::string version_dir_name(uint64_t version) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "weight_v%06llu", static_cast<unsigned long long>(version));
  return buf;
}

std::string to_string(const version_ref& ref) {
  if (ref.run_id.empty())
    return version_dir_name(ref.version);
  return ref.run_id + "/" + version_dir_name(ref.version);
}

result<std::optional<version_ref>> parse_version_ref(std::string_view text) {
  auto body = trim(text);
  if (body.empty())
    return std::optional<version_ref>{};
  auto fail = [&](std::string why) {
    return make_error(errc::invalid_argument,
                      "invalid version reference " + quote_untrusted(text) + ": " + std::move(why));
  };
  version_ref ref;
  std::string_view version_part = body;
  bool short_form_allowed = false;
  if (auto slash = body.find('/'); slash != std::string_view::npos) {
    auto run = body.substr(0, slash);
    if (auto ok = validate_run_id(run); !ok)
      return fail(ok.error().message);
    ref.run_id = std::string{run};
    version_part = body.substr(slash + 1);
    short_form_allowed = true;
  }
  std::optional<uint64_t> number;
  if (version_part.starts_with(dir_prefix))
    number = parse_digits(version_part.substr(dir_prefix.size()));
  else if (short_form_allowed)
    number = parse_digits(version_part);
  if (!number)
    return fail("expected '<run>/weight_v000007', 'weight_v000007' or '<run>/7'");
  ref.version = *number;
  return std::optional<version_ref>{std::move(ref)};
}

result<version_ref> parse_required_version_ref(std::string_view text) {
  auto parsed = parse_version_ref(text);
  if (!parsed)
    return std::move(parsed).error();
  if (!parsed->has_value())
    return make_error(errc::invalid_argument, "a version reference is required");
  return std::move(**parsed);
}

} // namespace stitch
