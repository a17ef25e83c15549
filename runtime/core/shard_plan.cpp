#include "runtime/core/shard_plan.hpp"

#include <cstdio>

namespace stitch {

std::string shard_name(size_t index, size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buf;
}

result<shard_plan> plan_shards(std::span<const shard_input> tensors, uint64_t max_shard_bytes) {
  if (max_shard_bytes == 0)
    return make_error(errc::invalid_argument, "max shard size must be positive");
  shard_plan plan;
  std::map<std::string, size_t> shard_of;
  bool open = false;
  for (const auto& t : tensors) {
    if (t.name.empty())
      return make_error(errc::invalid_argument, "tensor name is empty");
    if (!shard_of.emplace(t.name, 0).second)
      return make_error(errc::invalid_argument, "duplicate tensor name '" + t.name + "'");
    if (__builtin_add_overflow(plan.total_size, t.byte_size, &plan.total_size))
      return make_error(errc::invalid_argument, "total tensor size overflows");
    bool fits = open && t.byte_size <= max_shard_bytes - plan.shard_bytes.back();
    if (!fits) {
      if (plan.shard_bytes.size() == max_shard_count)
        return make_error(errc::invalid_argument,
                          "more than " + std::to_string(max_shard_count) + " shards needed");
      plan.shard_tensors.emplace_back();
      plan.shard_bytes.push_back(0);
    }
    plan.shard_tensors.back().push_back(t.name);
    plan.shard_bytes.back() += t.byte_size;
    shard_of[t.name] = plan.shard_bytes.size() - 1;
    // An oversized tensor fills its shard: the next tensor starts a new one.
    open = t.byte_size <= max_shard_bytes;
  }
  size_t count = plan.shard_bytes.size();
  for (size_t i = 0; i < count; ++i)
    plan.shards.push_back(shard_name(i, count));
  for (const auto& [name, index] : shard_of)
    plan.weight_map.emplace(name, plan.shards[index]);
  return plan;
}

} // namespace stitch
