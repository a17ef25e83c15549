#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "runtime/core/constraint.hpp"

namespace stitch {

/// Monotonic time as the caller's clock reports it (the core never reads a clock).
using clock_time = std::chrono::nanoseconds;
using request_id = uint64_t;

enum class commit_mode : uint8_t {
  /// Close admission, drain every in-flight request, activate, reopen.
  quiesce,
  /// Close admission, drain only exact pins, activate; others continue.
  in_place,
};

std::string_view to_string(commit_mode mode) noexcept;
/// "quiesce" or "in_place"; anything else is an error naming the text.
result<commit_mode> parse_commit_mode(std::string_view text);

/// The version interval a response reports.
struct stamps {
  uint64_t start = 0;
  uint64_t end = 0;
  friend bool operator==(const stamps&, const stamps&) = default;
};

/// The answer to `admit`.
struct admitted {
  uint64_t start_version;
};
/// Not satisfiable now: answer 409 with these fields.
struct rejected {
  rejection body;
};
/// The replica cannot serve at all: answer 503 with the reason.
struct unavailable {
  std::string reason;
};
/// Admission is closed for a commit: the request is queued and decided when
/// the gate reopens (an effect then carries the decision).
struct queued {};
using admission = std::variant<admitted, rejected, unavailable, queued>;

/// Effects the gate asks its host to carry out.
namespace gate_effects {
/// A queued request is admitted now.
struct admit {
  request_id id;
  uint64_t start_version;
};
/// A queued request is answered 409.
struct reject {
  request_id id;
  rejection body;
};
/// A queued request is answered 503.
struct refuse {
  request_id id;
  std::string reason;
};
/// An in-flight request held the commit past the drain deadline: abort it and
/// answer 503 `DrainTimeout` (retryable).
struct abort_request {
  request_id id;
};
/// Every request the commit waits for has finished: activate now.
struct commit_may_proceed {
  clock_time drain;
};
} // namespace gate_effects

using gate_effect = std::variant<gate_effects::admit, gate_effects::reject, gate_effects::refuse,
                                 gate_effects::abort_request, gate_effects::commit_may_proceed>;

/// Gate counters and timings; drain time and pause time are kept apart.
struct gate_metrics {
  uint64_t admitted_total = 0;
  uint64_t rejected_total = 0;
  uint64_t commits_total = 0;
  uint64_t drain_timeouts_total = 0;
  clock_time last_drain{0};
  clock_time last_pause{0};
  clock_time max_pause{0};
};

/// The admission gate of one replica: decides which requests may start on the
/// served version, and closes admission around a commit so that no request
/// crosses an incompatible weight change. A pure state machine: it takes
/// events (with the caller's time) and returns effects.
class admission_gate {
public:
  struct options {
    clock_time drain_timeout = std::chrono::seconds{300};
    /// Requests queued behind a closed gate beyond this are refused.
    size_t max_queued = 4096;
  };

  admission_gate();
  explicit admission_gate(options opts);

  /// Serves `version` from now on (first activation or rebuild).
  void serve(uint64_t version);
  /// Stops admitting anything: every new request is answered 503 with `reason`
  /// (no run claimed, terminal engine error, rebuilding).
  void stop_serving(std::string reason);

  /// Out of rotation by an operator (`stitch profile --take-out`): every new
  /// request is answered 503 with `reason`, queued ones included, whatever
  /// activations happen meanwhile (they still record the served version),
  /// until `put_back`.
  void take_out(std::string reason);
  void put_back() noexcept { taken_out_.reset(); }
  bool taken_out() const noexcept { return taken_out_.has_value(); }

  /// A request arrives with its constraint.
  admission admit(request_id id, const constraint& c, clock_time now);
  /// A request completed (or was cancelled). Returns its stamps — nullopt for
  /// a request the gate does not hold (already aborted, or never admitted) —
  /// and the effects its departure unblocks.
  std::pair<std::optional<stamps>, std::vector<gate_effect>>
  finish(request_id id, clock_time now, std::optional<uint64_t> last_token_version = {});

  /// Closes admission and starts draining. `drain_all` forces a full drain
  /// (a run switch); otherwise `mode` decides who is waited for.
  std::vector<gate_effect> begin_commit(commit_mode mode, bool drain_all, clock_time now);
  /// Advances time: past the drain deadline the holders are aborted.
  std::vector<gate_effect> tick(clock_time now);
  /// The activation finished: flip the served version and reopen.
  std::vector<gate_effect> end_commit(uint64_t new_version, clock_time now);
  /// The activation did not happen (or failed): reopen on the old version, or
  /// stay closed to new work if `stop_serving` was called meanwhile.
  std::vector<gate_effect> abort_commit(clock_time now);
  /// Flips the served version without a commit (an all-empty tail). Refused
  /// while a commit is in progress.
  status advance(uint64_t new_version);

  bool open() const noexcept { return phase_ == phase::open; }
  bool committing() const noexcept { return phase_ != phase::open; }
  std::optional<uint64_t> served_version() const noexcept { return served_; }
  size_t active_requests() const noexcept { return active_.size(); }
  size_t exact_pins() const noexcept { return exact_pins_; }
  size_t queued_requests() const noexcept { return queue_.size(); }
  /// Requests the current drain still waits for.
  size_t holders() const noexcept;
  const gate_metrics& metrics() const noexcept { return metrics_; }
  /// When the current drain gives up (only while draining).
  std::optional<clock_time> drain_deadline() const noexcept;

private:
  enum class phase : uint8_t { open, draining, activating };

  struct in_flight {
    uint64_t start_version;
    bool exact;
  };
  struct waiting {
    request_id id;
    constraint c;
  };

  admission decide(const constraint& c);
  bool holds_commit(const in_flight& r) const noexcept;
  std::vector<gate_effect> maybe_proceed(clock_time now);
  std::vector<gate_effect> reopen(clock_time now);

  options opts_;
  phase phase_ = phase::open;
  std::optional<uint64_t> served_;
  std::string unavailable_reason_ = "not ready";
  std::optional<std::string> taken_out_;
  std::unordered_map<request_id, in_flight> active_;
  size_t exact_pins_ = 0;
  std::deque<waiting> queue_;
  commit_mode commit_mode_ = commit_mode::in_place;
  bool drain_all_ = false;
  clock_time commit_began_{0};
  clock_time proceed_at_{0};
  gate_metrics metrics_;
};

} // namespace stitch
