#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "runtime/core/chain_planner.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/core/pointer_rules.hpp"

namespace stitch {

/// DESIGN §5's `sync_state`.
enum class sync_state : uint8_t { idle, fetching, staging, committing, error };

/// "IDLE", "FETCHING", "STAGING", "COMMITTING", "ERROR".
std::string_view to_string(sync_state state) noexcept;

/// What starts a reconcile pass.
enum class trigger : uint8_t { startup, wake, backstop, rejected_request, rebuilt };

/// Effects the reconciler asks its host (the replica actor) to carry out. Each
/// effect that completes asynchronously carries an `op` id; the completion
/// event must echo it, and completions of superseded ops are ignored.
namespace reconcile_effects {
/// Read the pool's pointer from the store; answer with `pointer_read`.
struct read_pointer {
  uint64_t op;
};
/// Read one manifest; answer with `manifest_read`.
struct read_manifest {
  uint64_t op;
  version_ref ref;
};
/// Build `plan` into the shadow copy while serving; answer with `staged`.
/// `onto_shadow`: continue from the shadow staged earlier in this pass.
struct stage {
  uint64_t op;
  chain_plan plan;
  bool onto_shadow;
};
/// Activate the shadow under the admission gate (drain everything first when
/// `drain_all`; flush caches when `flush_cache`), flip the served version to
/// `target`; answer with `committed`.
struct commit {
  uint64_t op;
  version_ref target;
  bool drain_all;
  bool flush_cache;
};
/// The tail changes no weights: flip the served version with no activation.
struct advance {
  version_ref target;
};
/// Drop a staged shadow that will not be committed.
struct discard_shadow {};
/// The engine's state is uncertain: rebuild it from `last_good` (or from the
/// pointer's anchor when there is none); answer with `rebuilt`.
struct rebuild_engine {
  uint64_t op;
  std::optional<version_ref> last_good;
};
/// Stop admitting requests (answer 503 with `reason`).
struct leave_rotation {
  std::string reason;
};
/// Caught up: admit requests on `version`.
struct enter_rotation {
  version_ref version;
};
} // namespace reconcile_effects

using reconcile_effect =
  std::variant<reconcile_effects::read_pointer, reconcile_effects::read_manifest,
               reconcile_effects::stage, reconcile_effects::commit, reconcile_effects::advance,
               reconcile_effects::discard_shadow, reconcile_effects::rebuild_engine,
               reconcile_effects::leave_rotation, reconcile_effects::enter_rotation>;

struct reconcile_metrics {
  uint64_t passes_total = 0;
  uint64_t stages_total = 0;
  uint64_t commits_total = 0;
  uint64_t folded_versions_total = 0;
  uint64_t skipped_activations_total = 0;
  uint64_t stage_failures_total = 0;
  uint64_t activation_failures_total = 0;
  std::chrono::nanoseconds last_stage{0};
  std::chrono::nanoseconds last_commit{0};
  /// Versions folded by the last activation (or skipped advance).
  uint64_t last_folded = 0;
};

/// A snapshot for `server_info`.
struct reconcile_status {
  bool ready = false;
  std::optional<version_ref> applied;
  std::optional<version_ref> pointer;
  sync_state state = sync_state::idle;
  std::string reason;
  std::string terminal_error;
  reconcile_metrics metrics;
};

/// One replica's convergence to the pool pointer (DESIGN §1 Reconcile), as a
/// pure state machine over the store and engine ports: every method takes an
/// event and returns the effects to carry out, in order.
class reconciler {
public:
  reconciler() = default;

  /// Startup, wake, backstop tick, a 409 just returned. A trigger during a
  /// pass schedules exactly one more pass (triggers coalesce).
  std::vector<reconcile_effect> on_trigger(trigger why);

  std::vector<reconcile_effect> on_pointer_read(uint64_t op,
                                                result<std::optional<pointer_record>> pointer);
  /// A manifest, or an error (`not_found` = the store lacks the version).
  std::vector<reconcile_effect> on_manifest_read(uint64_t op, const version_ref& ref,
                                                 result<manifest> m);
  std::vector<reconcile_effect> on_staged(uint64_t op, status outcome,
                                          std::chrono::nanoseconds took);
  /// The activation (or reset) result. A failure is terminal for the engine.
  std::vector<reconcile_effect> on_committed(uint64_t op, status outcome,
                                             std::chrono::nanoseconds took);
  /// The engine was rebuilt and now serves `version` (verified).
  std::vector<reconcile_effect> on_rebuilt(uint64_t op, result<version_ref> version);

  /// The host follows another pool's pointer from now on (`stitch profile`
  /// moves a replica to a scratch pool and back): the pointer as last read
  /// is forgotten and the replica is not ready until a pass catches up with
  /// the new pool. `forget_applied`: plan the next pass as a cold start
  /// (from an anchor, as if nothing were served). Refused during a pass.
  status retarget(bool forget_applied);

  bool ready() const noexcept { return ready_; }
  bool busy() const noexcept { return phase_ != phase::idle; }
  bool terminal() const noexcept { return !terminal_error_.empty(); }
  sync_state state() const noexcept { return state_; }
  const std::optional<version_ref>& applied() const noexcept { return applied_; }
  const reconcile_metrics& metrics() const noexcept { return metrics_; }
  reconcile_status snapshot() const;

private:
  enum class phase : uint8_t {
    idle,
    reading_pointer,
    planning,
    staging,
    rechecking,
    restaging_plan,
    restaging,
    committing,
    rebuilding,
  };

  using effects = std::vector<reconcile_effect>;

  void begin_pass(effects& out);
  void end_pass(effects& out);
  void fail_pass(std::string reason, effects& out);
  /// Plans from `from` (the applied state, or the staged shadow) and emits the
  /// next step: a manifest read, a stage, an advance, or the end of the pass.
  void plan_next(effects& out);
  void start_commit(effects& out);
  void mark_caught_up(effects& out);
  void leave(std::string reason, effects& out);
  manifest_lookup_result lookup(const version_ref& ref) const;
  uint64_t next_op() { return ++last_op_; }

  phase phase_ = phase::idle;
  sync_state state_ = sync_state::idle;
  bool pending_ = false;
  bool ready_ = false;
  bool in_rotation_ = false;
  std::string rotation_reason_;
  std::string reason_;
  std::string terminal_error_;
  uint64_t last_op_ = 0;
  uint64_t awaited_op_ = 0;

  std::optional<version_ref> applied_;
  std::optional<pointer_record> pointer_;
  /// Manifests read in the current pass, and versions the store lacks.
  std::map<version_ref, manifest> manifests_;
  std::set<version_ref> missing_;
  /// The plan staged into the shadow so far (first stage and restage folded).
  std::optional<chain_plan> staged_;
  bool shadow_dirty_ = false;
  std::chrono::nanoseconds stage_time_{0};
  reconcile_metrics metrics_;
};

} // namespace stitch
