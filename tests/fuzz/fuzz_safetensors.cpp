// libFuzzer target: arbitrary bytes as a safetensors file. Whatever parses
// must survive serialize -> parse unchanged; any difference aborts.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/core/safetensors.hpp"

namespace st = stitch::safetensors;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_safetensors: %s\n", what);
  std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> input{reinterpret_cast<const std::byte*>(data), size};
  auto first = st::parse(input);
  if (!first) {
    if (first.error().message.empty())
      fail("error without a message");
    return 0;
  }
  std::vector<st::tensor_to_write> tensors;
  for (const auto& t : first->tensors)
    tensors.push_back({t.name, t.type, t.shape, first->bytes(t)});
  auto bytes = st::serialize(tensors, first->metadata);
  if (!bytes)
    fail(("re-serialize failed: " + bytes.error().message).c_str());
  auto second = st::parse(*bytes);
  if (!second)
    fail(("re-parse failed: " + second.error().message).c_str());
  if (second->tensors != first->tensors)
    fail("tensors differ after the round trip");
  if (second->metadata != first->metadata)
    fail("metadata differs after the round trip");
  if (second->data_size != first->data_size || second->header_size % 8 != 0)
    fail("layout differs after the round trip");
  if (!std::equal(second->data.begin(), second->data.end(), first->data.begin(), first->data.end()))
    fail("tensor bytes differ after the round trip");
  return 0;
}
