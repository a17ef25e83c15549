#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/core/error.hpp"
#include "runtime/core/version_ref.hpp"

namespace stitch {

/// The `latest` pointer of one pool: the newest published version and the boot
/// version of its run (the run's claim).
struct pointer_record {
  version_ref latest;
  uint64_t boot_version = 0;

  friend bool operator==(const pointer_record&, const pointer_record&) = default;
};

/// What a publisher proposes to make the pool's pointer.
struct pointer_proposal {
  version_ref target;
  /// The proposed version is a full anchor (a claim must be one).
  bool is_full_anchor = false;
  /// The boot version of `target.run_id` if that run was claimed before in this
  /// pool (its chain exists in the store); nullopt for a run never seen.
  std::optional<uint64_t> known_run_boot;
  /// When `target` is already stored: whether the stored content is identical.
  std::optional<bool> stored_content_identical;
};

/// How the pointer moves.
enum class pointer_move : uint8_t {
  /// First version of a run, or a move to another run: reset to its boot.
  claim,
  /// Same run, strictly forward.
  advance,
  /// Nothing changes (re-publish of the current version, re-claim of the boot).
  unchanged,
};

struct pointer_decision {
  pointer_move move = pointer_move::unchanged;
  /// The pointer after the move.
  pointer_record next;

  friend bool operator==(const pointer_decision&, const pointer_decision&) = default;
};

/// Applies DESIGN §1's pointer rules: within one run strictly forward (a lower
/// version is `rewind`); the current version again is idempotent when its
/// content is identical and `version_exists` otherwise; another run is allowed
/// at any version and means a reset to that run's boot (a run never claimed
/// must start with a full anchor, which becomes its boot — possibly above 0).
result<pointer_decision> decide_pointer_move(const std::optional<pointer_record>& current,
                                             const pointer_proposal& proposal);

/// `claim(pool, boot)`: claims `run` at `boot` (a full anchor). Re-claiming the
/// claimed boot is idempotent; claiming a run that is already claimed at a
/// different boot is `version_exists`.
result<pointer_decision> decide_claim(const std::optional<pointer_record>& current,
                                      const version_ref& boot, bool is_full_anchor,
                                      std::optional<uint64_t> known_run_boot);

/// The three pointers of a lost compare-and-swap.
struct cas_conflict {
  std::optional<version_ref> expected;
  std::optional<version_ref> actual;
  version_ref proposed;
};

/// Compare-and-swap precondition: the pointer must still be what the caller
/// read. Returns a `conflict` error naming expected, actual and proposed.
status check_compare_and_swap(const std::optional<version_ref>& expected,
                              const std::optional<version_ref>& actual,
                              const version_ref& proposed);

/// The conflict's message, "pointer moved: expected X, found Y, proposing Z".
std::string describe(const cas_conflict& conflict);

} // namespace stitch
