#include "runtime/core/source_choice.hpp"

#include <algorithm>
#include <tuple>

namespace stitch {

std::vector<size_t> choose_sources(std::span<const source_candidate> candidates,
                                   const std::string& receiver_id, const std::string& receiver_node,
                                   size_t k) {
  std::vector<size_t> order;
  for (size_t i = 0; i < candidates.size(); ++i)
    if (candidates[i].replica_id != receiver_id)
      order.push_back(i);
  auto key = [&](size_t i) {
    const auto& c = candidates[i];
    return std::tuple{c.handed_out, c.node != receiver_node, c.replica_id};
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  if (order.size() > k)
    order.resize(k);
  return order;
}

} // namespace stitch
