// The request-constraint parsers never crash, and what they accept is
// consistent: exact >= min, stripping is idempotent and agrees with
// constraint_from_body, satisfied_by matches its definition, and a
// rejection targets the right version.
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/core/constraint.hpp"

namespace {

void check(const stitch::constraint& c) {
  if (c.min_version && c.exact_version && *c.exact_version < *c.min_version)
    std::abort();
  uint64_t probes[] = {0,
                       1,
                       c.min_version.value_or(0),
                       c.min_version.value_or(1) - 1,
                       c.exact_version.value_or(0),
                       c.exact_version.value_or(0) + 1};
  for (uint64_t applied : probes) {
    bool expected = (!c.min_version || applied >= *c.min_version)
                    && (!c.exact_version || applied == *c.exact_version);
    if (c.satisfied_by(applied) != expected)
      std::abort();
    if (!c.any() && !expected)
      std::abort();
    if (!expected) {
      auto r = stitch::reject(c, applied);
      uint64_t target = c.exact_version ? *c.exact_version : *c.min_version;
      if (r.target_version != target || r.applied != applied || r.message.empty())
        std::abort();
      if (r.retryable != !(c.exact_version && applied > *c.exact_version))
        std::abort();
      if (stitch::rejection_json(r).find("\"WeightVersionNotReady\"") == std::string::npos)
        std::abort();
    }
  }
}

} // namespace

// Input: body, then optionally '\0' min header, then optionally '\0' exact header.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view body = input.substr(0, input.find('\0'));
  std::optional<std::string_view> min_header;
  std::optional<std::string_view> exact_header;
  if (body.size() < input.size()) {
    std::string_view rest = input.substr(body.size() + 1);
    min_header = rest.substr(0, rest.find('\0'));
    if (min_header->size() < rest.size())
      exact_header = rest.substr(min_header->size() + 1);
  }

  auto stripped = stitch::strip_constraint(body);
  auto from_body = stitch::constraint_from_body(body);
  if (stripped.has_value() != from_body.has_value())
    std::abort();
  if (stripped) {
    if (stripped->c != *from_body)
      std::abort();
    check(stripped->c);
    auto again = stitch::strip_constraint(stripped->body_without_constraint);
    if (!again || again->c.any()
        || again->body_without_constraint != stripped->body_without_constraint)
      std::abort();
    if (stripped->body_without_constraint.size() > body.size())
      std::abort();
  } else if (stripped.error().message.empty()) {
    std::abort();
  }

  auto headers = stitch::constraint_from_headers(min_header, exact_header);
  if (headers) {
    check(*headers);
    if (min_header.has_value() != headers->min_version.has_value()
        || exact_header.has_value() != headers->exact_version.has_value())
      std::abort();
    if (stripped) {
      if (auto merged = stitch::merge(stripped->c, *headers)) {
        check(*merged);
        if ((stripped->c.min_version && merged->min_version != stripped->c.min_version)
            || (headers->min_version && merged->min_version != headers->min_version))
          std::abort();
      }
    }
  }
  return 0;
}
