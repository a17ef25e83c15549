// parse_manifest and parse_hf_index never crash; an accepted manifest
// renders to JSON that parses back to the same manifest and renders the same.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "runtime/core/manifest.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto m = stitch::parse_manifest(text)) {
    if (!stitch::validate(*m))
      std::abort();
    std::string rendered = stitch::to_json(*m);
    auto again = stitch::parse_manifest(rendered);
    if (!again || *again != *m || stitch::to_json(*again) != rendered)
      std::abort();
    auto index = stitch::parse_hf_index(rendered);
    if (!index || index->weight_map != m->weight_map || index->total_size != m->total_size)
      std::abort();
  } else if (m.error().message.empty()) {
    std::abort();
  }
  if (auto index = stitch::parse_hf_index(text)) {
    for (const auto& [name, shard] : index->weight_map)
      if (!stitch::validate_tensor_name(name) || !stitch::validate_shard_name(shard))
        std::abort();
    size_t used = 0;
    for (const auto& shard : index->shards)
      for (const auto& [name, s] : index->weight_map)
        if (s == shard) {
          ++used;
          break;
        }
    if (used != index->shards.size())
      std::abort();
  }
  return 0;
}
