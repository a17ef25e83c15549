#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "runtime/core/admission_gate.hpp"
#include "runtime/core/constraint.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/http_errors.hpp"

namespace stitch {

/// What a replica request is.
enum class request_kind : uint8_t {
  /// A versioned route: admitted under its constraint, stamped.
  versioned,
  /// A route passed through to the engine as is.
  passthrough,
};

/// How the engine finished a request, as far as its answer is concerned.
struct engine_outcome {
  /// The engine answered 200 (a versioned answer gets its stamps).
  bool ok = false;
  /// The engine call itself failed: answered as this error.
  std::optional<error> failed;
  /// The version that made the last token, when the engine says
  /// (`engine_reply::last_token_version`).
  std::optional<uint64_t> last_token_version = std::nullopt;
};

/// Effects a request lifecycle asks its host (the replica actor) to carry
/// out, in order.
namespace request_effects {
/// Hand the request to the engine; a versioned one runs on `served`, the
/// version it was admitted on (its caches are namespaced by it).
struct start {
  request_id id;
  std::optional<uint64_t> served;
  friend bool operator==(const start&, const start&) = default;
};
/// Ask the engine to stop the request; it reports `engine_done` when it has.
struct stop {
  request_id id;
  friend bool operator==(const stop&, const stop&) = default;
};
/// The request's final answer is the engine's own, with these stamps (for a
/// versioned 200 answer; none for anything passed through).
struct deliver {
  request_id id;
  std::optional<stamps> stamped;
  friend bool operator==(const deliver&, const deliver&) = default;
};
/// The request's final answer is this error.
struct fail {
  request_id id;
  http_error error;
  friend bool operator==(const fail&, const fail&) = default;
};
/// A 409 went out: reconcile now (DESIGN §1's trigger).
struct reconcile_now {
  friend bool operator==(const reconcile_now&, const reconcile_now&) = default;
};
/// Every request the commit waits for has finished: activate now.
struct commit_may_proceed {
  clock_time drain;
  friend bool operator==(const commit_may_proceed&, const commit_may_proceed&) = default;
};
} // namespace request_effects

using request_effect =
  std::variant<request_effects::start, request_effects::stop, request_effects::deliver,
               request_effects::fail, request_effects::reconcile_now,
               request_effects::commit_may_proceed>;

/// The request an effect names (start, stop, deliver, fail), if any.
inline std::optional<request_id> request_of(const request_effect& e) {
  return std::visit(
    [](const auto& x) -> std::optional<request_id> {
      if constexpr (requires { x.id; })
        return x.id;
      else
        return std::nullopt;
    },
    e);
}

/// Every request of one replica from its arrival to its one final answer: a
/// pure state machine over the admission gate (DESIGN §1 admission, commits,
/// drains and their deadline, stamps), like the reconciler next to it. It
/// takes events — a request arrives, the engine finished one, a client went
/// away, a commit begins, ends or fails, time passes — and returns the
/// effects to carry out. Each request gets exactly one `deliver` or `fail`.
class request_lifecycle {
public:
  request_lifecycle();
  explicit request_lifecycle(admission_gate::options opts);

  /// A request arrives, its route and constraint already parsed.
  std::vector<request_effect> arrive(request_id id, request_kind kind, const constraint& c,
                                     clock_time now);
  /// The engine is done with request `id` (finished, failed, or stopped).
  std::vector<request_effect> engine_done(request_id id, const engine_outcome& outcome,
                                          clock_time now);
  /// The client of request `id` went away.
  std::vector<request_effect> cancel(request_id id, clock_time now);

  /// A weight update: admission closes, the drain begins (see the gate).
  std::vector<request_effect> begin_commit(commit_mode mode, bool drain_all, clock_time now);
  /// Time passes: past the drain deadline the holders are stopped, and
  /// answered `DrainTimeout` when the engine reports them.
  std::vector<request_effect> tick(clock_time now);
  /// The activation succeeded: serve `version`, admit what queued.
  std::vector<request_effect> end_commit(uint64_t version, clock_time now);
  /// The activation failed: the engine's state is uncertain, so every
  /// request running on it is stopped and answered 503 when it reports; the
  /// gate reopens on the old version (or stays closed to new work).
  std::vector<request_effect> activation_failed(clock_time now);
  /// The commit was called off before activating: admission reopens.
  std::vector<request_effect> commit_cancelled(clock_time now);

  /// Leaving: from now on every new request is refused (503, retryable).
  void retire() noexcept { retiring_ = true; }
  bool retiring() const noexcept { return retiring_; }

  void serve(uint64_t version) { gate_.serve(version); }
  void stop_serving(std::string reason) { gate_.stop_serving(std::move(reason)); }
  /// Out of rotation until `put_back` (see the gate).
  void take_out(std::string reason) { gate_.take_out(std::move(reason)); }
  void put_back() noexcept { gate_.put_back(); }
  status advance(uint64_t version) { return gate_.advance(version); }

  const admission_gate& gate() const noexcept { return gate_; }
  /// Requests not answered yet.
  size_t unanswered() const noexcept { return requests_.size(); }
  bool running(request_id id) const;

private:
  struct state {
    request_kind kind = request_kind::versioned;
    bool running = false;
    bool cancelled_by_client = false;
    bool aborted_for_drain = false;
    bool engine_failed = false;
  };

  void apply_gate(std::vector<gate_effect> effects, std::vector<request_effect>& out);

  admission_gate gate_;
  std::unordered_map<request_id, state> requests_;
  bool retiring_ = false;
};

} // namespace stitch
