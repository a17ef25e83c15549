// Role (node) and experiment files in TOML, and a checkpoint's config.json:
// any text parses or fails with a message naming the problem, and what
// parses is valid by its own rules.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "config/experiment.hpp"
#include "config/node_config.hpp"
#include "runtime/engine/model_config.hpp"

// Input: a selector byte, then the text.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0: {
      auto c = stitch::config::parse_node_config(text, "fuzz.toml");
      if (!c && c.error().message.empty())
        std::abort();
      break;
    }
    case 1: {
      auto e = stitch::config::parse_experiment(text, "fuzz.toml");
      if (!e && e.error().message.empty())
        std::abort();
      break;
    }
    default: {
      auto m = stitch::engine::parse_model_config(text);
      if (!m) {
        if (m.error().message.empty())
          std::abort();
        break;
      }
      if (!stitch::engine::validate(*m))
        std::abort();
      // What it renders reads back the same.
      auto again = stitch::engine::parse_model_config(stitch::engine::render_model_config(*m));
      if (!again
          || stitch::engine::render_model_config(*again) != stitch::engine::render_model_config(*m))
        std::abort();
      break;
    }
  }
  return 0;
}
