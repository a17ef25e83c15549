#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/version_ref.hpp"

namespace stitch {

/// One stored version of a run, as retention sees it.
struct stored_version {
  uint64_t version = 0;
  bool is_full = false;
};

/// Why retention keeps a version (the first reason that applies, in this order).
enum class keep_reason : uint8_t {
  /// Not kept: deleted.
  none,
  /// The run's boot checkpoint.
  boot,
  /// Named by a pin: the pool's pointer, or a version a replica stages or serves.
  pinned,
  /// Among the newest `keep_last`.
  newest,
  /// A kept delta's chain runs back through it to its anchor.
  chain,
};

/// "deleted", "boot", "pinned", "newest", "chain".
std::string to_string(keep_reason why);

/// Retention's verdict on one version.
struct retention_verdict {
  uint64_t version = 0;
  keep_reason why = keep_reason::none;
  /// For `chain`: the kept version that needs it.
  uint64_t needed_by = 0;

  bool kept() const noexcept { return why != keep_reason::none; }
  friend bool operator==(const retention_verdict&, const retention_verdict&) = default;
};

/// Decides, for every stored version of one run, whether retention keeps it
/// (and why) when keeping the newest `keep_last` (at least 1): never the boot
/// checkpoint, never a `pinned` version, never a version a kept delta needs to
/// be rebuilt (everything back to its nearest anchor). `versions` may come in
/// any order; the verdicts are in ascending version order.
std::vector<retention_verdict> plan_retention(const std::vector<stored_version>& versions,
                                              uint64_t boot_version, size_t keep_last,
                                              const std::set<uint64_t>& pinned = {});

/// The versions `plan_retention` deletes.
std::set<uint64_t> select_deletions(const std::vector<stored_version>& versions,
                                    uint64_t boot_version, size_t keep_last,
                                    const std::set<uint64_t>& pinned = {});

/// What one replica holds or fetches, as retention must respect it.
struct replica_holdings {
  /// The version it serves.
  std::optional<version_ref> applied;
  /// The version it is fetching, staging or activating (the pointer it read).
  std::optional<version_ref> target;
};

/// Every version replicas use: what each serves, what each is moving to,
/// and, for a move within one run, every version in between (its stage may
/// fold those deltas; at most `max_span` of them per replica, the newest).
std::set<version_ref> versions_in_use(const std::vector<replica_holdings>& replicas,
                                      uint64_t max_span = 4096);

} // namespace stitch
