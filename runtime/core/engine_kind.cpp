#include "runtime/core/engine_kind.hpp"

#include <string>

namespace stitch {

std::string_view to_string(engine_kind k) noexcept {
  switch (k) {
    case engine_kind::builtin: return "builtin";
    case engine_kind::sglang: return "sglang";
    case engine_kind::vllm: return "vllm";
  }
  return "builtin";
}

result<engine_kind> parse_engine_kind(std::string_view text) {
  for (auto k : {engine_kind::builtin, engine_kind::sglang, engine_kind::vllm})
    if (text == to_string(k))
      return k;
  return make_error(errc::invalid_argument,
                    "engine kind " + quote_untrusted(text) + " is not builtin, sglang or vllm");
}

std::string_view to_string(engine_device d) noexcept {
  return d == engine_device::cuda ? "cuda" : "cpu";
}

result<engine_device> parse_engine_device(std::string_view text) {
  if (text == "cpu")
    return engine_device::cpu;
  if (text == "cuda")
    return engine_device::cuda;
  return make_error(errc::invalid_argument,
                    "engine device " + quote_untrusted(text) + " is not cpu or cuda");
}

} // namespace stitch
