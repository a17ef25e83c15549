// The HTTP router classifies any request without crashing, and what it
// decides is consistent: pools are valid names, a versioned route's
// constraint is coherent and its forwarded body carries no constraint of its
// own, refusals are 4xx with a JSON body, and /wake needs the admin token.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "runtime/core/constraint.hpp"
#include "transport/http_router.hpp"

namespace {

using namespace stitch::transport;

void check_pool(const std::string& pool) {
  if (!valid_pool_name(pool))
    std::abort();
}

} // namespace

// Input: a flags byte (surface, method, admin token), then the target line,
// header lines `name: value`, an empty line and the body.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  static const char* methods[] = {"GET",  "POST",    "PUT",   "DELETE",
                                  "HEAD", "OPTIONS", "PATCH", "Get"};
  uint8_t flags = data[0];
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  surface where = (flags & 1) ? surface::gateway : surface::replica;
  server_request req;
  req.method = methods[(flags >> 1) & 7];
  router_options options;
  if (flags & 16)
    options.admin_token = "secret";

  auto line = [&rest]() {
    auto nl = rest.find('\n');
    std::string_view l = rest.substr(0, nl);
    rest = nl == rest.npos ? std::string_view{} : rest.substr(nl + 1);
    return l;
  };
  req.target = std::string{line()};
  req.path = req.target.substr(0, req.target.find('?'));
  while (!rest.empty()) {
    auto l = line();
    if (l.empty())
      break;
    auto colon = l.find(':');
    if (colon == l.npos)
      continue;
    auto value = l.substr(colon + 1);
    while (!value.empty() && value.front() == ' ')
      value.remove_prefix(1);
    req.headers.push_back({std::string{l.substr(0, colon)}, std::string{value}});
  }
  req.body = std::string{rest};

  auto decision = route_request(where, req, options);
  if (auto* v = std::get_if<routed::versioned>(&decision)) {
    check_pool(v->pool);
    if (v->c.min_version && v->c.exact_version && *v->c.exact_version < *v->c.min_version)
      std::abort();
    auto again = stitch::strip_constraint(v->body);
    if (!again || again->c.any())
      std::abort();
  } else if (auto* p = std::get_if<routed::passthrough>(&decision)) {
    check_pool(p->pool);
  } else if (auto* h = std::get_if<routed::health>(&decision)) {
    check_pool(h->pool);
  } else if (auto* w = std::get_if<routed::wake>(&decision)) {
    check_pool(w->pool);
    if (!options.admin_token.empty()) {
      const std::string* auth = req.header("Authorization");
      if (!auth || *auth != "Bearer " + options.admin_token)
        std::abort();
    }
  } else if (auto* pv = std::get_if<routed::pool_view>(&decision)) {
    check_pool(pv->pool);
  } else if (auto* r = std::get_if<routed::refuse>(&decision)) {
    if (r->response.status < 400 || r->response.status > 499)
      std::abort();
    if (nlohmann::json::parse(r->response.body, nullptr, false).is_discarded())
      std::abort();
  }
  return 0;
}
