#include "runtime/core/retention.hpp"

#include <algorithm>
#include <map>

namespace stitch {

std::set<uint64_t> select_deletions(const std::vector<stored_version>& versions,
                                    uint64_t boot_version, size_t keep_last,
                                    const std::set<uint64_t>& pinned) {
  std::map<uint64_t, bool> by_version; // version -> is_full
  for (const auto& v : versions)
    by_version[v.version] = v.is_full;
  std::set<uint64_t> keep{boot_version};
  keep.insert(pinned.begin(), pinned.end());
  size_t newest = 0;
  for (auto it = by_version.rbegin();
       it != by_version.rend() && newest < std::max<size_t>(keep_last, 1); ++it, ++newest)
    keep.insert(it->first);
  // Each kept version needs its chain back to the nearest anchor.
  std::set<uint64_t> needed;
  for (auto v : keep) {
    auto it = by_version.find(v);
    while (it != by_version.end() && !it->second && it != by_version.begin()) {
      const uint64_t base = it->first - 1;
      --it;
      if (it->first != base)
        break; // a hole: nothing further back can complete this chain
      needed.insert(it->first);
    }
  }
  keep.insert(needed.begin(), needed.end());
  std::set<uint64_t> deletions;
  for (const auto& [v, full] : by_version)
    if (!keep.contains(v))
      deletions.insert(v);
  return deletions;
}

} // namespace stitch
