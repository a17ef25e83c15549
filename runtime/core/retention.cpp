#include "runtime/core/retention.hpp"

#include <algorithm>
#include <map>

namespace stitch {

std::string to_string(keep_reason why) {
  switch (why) {
    case keep_reason::none: return "deleted";
    case keep_reason::boot: return "boot";
    case keep_reason::pinned: return "pinned";
    case keep_reason::newest: return "newest";
    case keep_reason::chain: return "chain";
  }
  return "?";
}

std::vector<retention_verdict> plan_retention(const std::vector<stored_version>& versions,
                                              uint64_t boot_version, size_t keep_last,
                                              const std::set<uint64_t>& pinned) {
  std::map<uint64_t, bool> by_version; // version -> is_full
  for (const auto& v : versions)
    by_version[v.version] = v.is_full;
  std::map<uint64_t, retention_verdict> verdicts;
  for (const auto& [v, full] : by_version)
    verdicts[v] = {v, keep_reason::none, 0};
  auto mark = [&](uint64_t v, keep_reason why, uint64_t needed_by = 0) {
    auto it = verdicts.find(v);
    if (it != verdicts.end() && !it->second.kept())
      it->second = {v, why, needed_by};
  };
  mark(boot_version, keep_reason::boot);
  for (auto v : pinned)
    mark(v, keep_reason::pinned);
  size_t newest = 0;
  for (auto it = by_version.rbegin();
       it != by_version.rend() && newest < std::max<size_t>(keep_last, 1); ++it, ++newest)
    mark(it->first, keep_reason::newest);
  // Each kept version needs its chain back to the nearest anchor.
  std::vector<uint64_t> kept;
  for (const auto& [v, verdict] : verdicts)
    if (verdict.kept())
      kept.push_back(v);
  for (auto v : kept) {
    auto it = by_version.find(v);
    while (it != by_version.end() && !it->second && it != by_version.begin()) {
      const uint64_t base = it->first - 1;
      --it;
      if (it->first != base)
        break; // a hole: nothing further back can complete this chain
      mark(it->first, keep_reason::chain, v);
    }
  }
  std::vector<retention_verdict> out;
  out.reserve(verdicts.size());
  for (const auto& [v, verdict] : verdicts)
    out.push_back(verdict);
  return out;
}

std::set<uint64_t> select_deletions(const std::vector<stored_version>& versions,
                                    uint64_t boot_version, size_t keep_last,
                                    const std::set<uint64_t>& pinned) {
  std::set<uint64_t> deletions;
  for (const auto& v : plan_retention(versions, boot_version, keep_last, pinned))
    if (!v.kept())
      deletions.insert(v.version);
  return deletions;
}

std::set<version_ref> versions_in_use(const std::vector<replica_holdings>& replicas,
                                      uint64_t max_span) {
  std::set<version_ref> out;
  for (const auto& r : replicas) {
    if (r.applied)
      out.insert(*r.applied);
    if (!r.target)
      continue;
    out.insert(*r.target);
    if (!r.applied || r.applied->run_id != r.target->run_id
        || r.applied->version >= r.target->version)
      continue;
    uint64_t from = r.applied->version + 1;
    if (r.target->version - from > max_span)
      from = r.target->version - max_span;
    for (uint64_t v = from; v < r.target->version; ++v)
      out.insert(version_ref{r.target->run_id, v});
  }
  return out;
}

} // namespace stitch
