// The msgpack records the store persists (a version's layout, a pool's
// pointer) and the coordinator's experiments: garbage decodes to an error, never a crash or a huge
// allocation, and what decodes encodes back to a record that decodes the
// same.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "runtime/store/experiment_file.hpp"
#include "runtime/store/version_layout.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  using namespace stitch::store;
  if (auto layout = decode_layout(bytes)) {
    auto again = decode_layout(encode_layout(*layout));
    if (!again || !(*again == *layout))
      std::abort();
  } else if (layout.error().message.empty()) {
    std::abort();
  }
  if (auto pointer = decode_pointer(bytes)) {
    auto again = decode_pointer(encode_pointer(*pointer));
    if (!again || !(*again == *pointer))
      std::abort();
  } else if (pointer.error().message.empty()) {
    std::abort();
  }
  if (auto runs = decode_experiments(bytes)) {
    auto once = encode_experiments(*runs);
    auto again = decode_experiments(once);
    if (!again || encode_experiments(*again) != once)
      std::abort();
  } else if (runs.error().message.empty()) {
    std::abort();
  }
  return 0;
}
