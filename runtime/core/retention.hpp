#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

namespace stitch {

/// One stored version of a run, as retention sees it.
struct stored_version {
  uint64_t version = 0;
  bool is_full = false;
};

/// Chooses which versions of one run to delete when keeping the newest
/// `keep_last` (at least 1): never the boot checkpoint, never a version a kept
/// delta needs to be rebuilt (everything back to its nearest anchor), never
/// `pinned` versions (the pointer). `versions` may come in any order.
std::set<uint64_t> select_deletions(const std::vector<stored_version>& versions,
                                    uint64_t boot_version, size_t keep_last,
                                    const std::set<uint64_t>& pinned = {});

} // namespace stitch
