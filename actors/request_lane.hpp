#pragma once

// The request lane of one replica: its request lifecycle behind a lock, so
// that the replica's own HTTP surface admits, runs and answers a request on
// the threads that carry its bytes (the HTTP thread hands it to a generation
// worker, which calls the engine and writes the answer), with no actor on
// the way. The replica actor drives the same lifecycle through `with` for
// everything else (requests from the gateway, commits, drains, retiring),
// and carries out the effects that are not the lane's own (a commit that
// may proceed, a reconcile after a 409, a gateway request unblocked).
//
// No CAF here: the actor hears of effects left for it through `notify`.

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/workers.hpp"
#include "runtime/core/engine_port.hpp"
#include "runtime/core/request_lifecycle.hpp"

namespace stitch {

namespace transport {
class http_responder;
}

struct replica_options;

/// The admission gate's options of a replica (`replica.drain_timeout`,
/// `replica.max_queued`).
admission_gate::options gate_options_of(const replica_options& o);

class request_lane : public std::enable_shared_from_this<request_lane> {
public:
  explicit request_lane(admission_gate::options opts);
  request_lane(const request_lane&) = delete;
  request_lane& operator=(const request_lane&) = delete;

  // --- the replica actor's side ---

  /// Runs `f(lifecycle)` under the lane's lock; `f` must not call back into
  /// the lane.
  template <class F>
  auto with(F&& f) {
    std::lock_guard lock{mutex_};
    return f(life_);
  }
  template <class F>
  auto with(F&& f) const {
    std::lock_guard lock{mutex_};
    return f(std::as_const(life_));
  }
  /// The lifecycle's events, each under the lock (see `request_lifecycle`).
  std::vector<request_effect> arrive(request_id id, request_kind kind, const constraint& c,
                                     clock_time now) {
    return with([&](request_lifecycle& l) { return l.arrive(id, kind, c, now); });
  }
  std::vector<request_effect> engine_done(request_id id, const engine_outcome& outcome,
                                          clock_time now) {
    return with([&](request_lifecycle& l) { return l.engine_done(id, outcome, now); });
  }
  std::vector<request_effect> cancel(request_id id, clock_time now) {
    return with([&](request_lifecycle& l) { return l.cancel(id, now); });
  }
  std::vector<request_effect> begin_commit(commit_mode mode, bool drain_all, clock_time now) {
    return with([&](request_lifecycle& l) { return l.begin_commit(mode, drain_all, now); });
  }
  std::vector<request_effect> tick(clock_time now) {
    return with([&](request_lifecycle& l) { return l.tick(now); });
  }
  std::vector<request_effect> end_commit(uint64_t version, clock_time now) {
    return with([&](request_lifecycle& l) { return l.end_commit(version, now); });
  }
  std::vector<request_effect> activation_failed(clock_time now) {
    return with([&](request_lifecycle& l) { return l.activation_failed(now); });
  }
  void retire() {
    with([](request_lifecycle& l) { l.retire(); });
  }
  bool retiring() const {
    return with([](const request_lifecycle& l) { return l.retiring(); });
  }
  /// Serves `version` unless a commit is under way.
  void serve_if_open(uint64_t version) {
    with([&](request_lifecycle& l) {
      if (l.gate().open())
        l.serve(version);
    });
  }
  void stop_serving(std::string reason) {
    with([&](request_lifecycle& l) { l.stop_serving(std::move(reason)); });
  }
  void take_out(std::string reason) {
    with([&](request_lifecycle& l) { l.take_out(std::move(reason)); });
  }
  void put_back() {
    with([](request_lifecycle& l) { l.put_back(); });
  }
  status advance(uint64_t version) {
    return with([&](request_lifecycle& l) { return l.advance(version); });
  }
  /// What `server_info` shows of the gate, read at once.
  struct gate_view {
    std::optional<uint64_t> served;
    bool taken_out = false;
    bool retiring = false;
    size_t active = 0;
    size_t queued = 0;
    gate_metrics metrics;
    std::optional<clock_time> drain_deadline;
  };
  gate_view view() const {
    return with([](const request_lifecycle& l) {
      const auto& g = l.gate();
      return gate_view{g.served_version(),  g.taken_out(), l.retiring(),      g.active_requests(),
                       g.queued_requests(), g.metrics(),   g.drain_deadline()};
    });
  }

  /// A fresh request id (shared by the actor's requests and the lane's).
  request_id next_id() noexcept { return next_id_.fetch_add(1, std::memory_order_relaxed); }

  /// What requests run on: the engine serving now (swapped by a rebuild),
  /// the applied run (stamps name it), and who this replica is.
  void set_engine(std::shared_ptr<engine_port> engine);
  void set_run(std::string run_id);
  void set_identity(std::string replica_id, std::shared_ptr<executor> workers);
  /// Called (from any thread) when effects wait in `take_left`, or the lane
  /// fell idle while `watch_idle` was set.
  void set_notify(std::function<void()> notify);
  /// The actor waits for the lane to fall idle (retiring, a profile).
  void watch_idle(bool on) noexcept { watch_idle_.store(on, std::memory_order_relaxed); }

  /// Effects the lane left for the actor, in order.
  std::vector<request_effect> take_left();
  /// Carries out the effects that name the lane's requests; the rest are
  /// left for the actor (and `notify` called) unless `others` takes them.
  void carry(std::vector<request_effect> effects, std::vector<request_effect>* others = nullptr);
  /// Whether request `id` is the lane's.
  bool owns(request_id id) const;
  /// The lane's requests not answered yet.
  size_t unanswered() const;
  /// Versioned answers the lane stamped.
  uint64_t completed_total() const noexcept { return completed_.load(std::memory_order_relaxed); }
  /// The replica is going away: every running request of the lane stops at
  /// its engine's next step, and effects left for the actor are dropped
  /// from now on (nobody would take them).
  void detach();

  // --- the HTTP side ---

  /// Whether the replica has an engine (before, requests go to the actor).
  bool ready() const;
  /// One request from the replica's own HTTP surface (when `ready`):
  /// admitted (or refused) now, run on a generation worker, answered through
  /// `out`. A client that goes away cancels it.
  void submit(request_kind kind, const constraint& c, std::string method, std::string route,
              std::string body, std::shared_ptr<transport::http_responder> out);

private:
  struct request {
    std::string method;
    std::string route;
    std::string body;
    std::shared_ptr<transport::http_responder> out;
    std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
    /// Events already went out (a stream began).
    std::shared_ptr<std::atomic<bool>> streaming = std::make_shared<std::atomic<bool>>(false);
    /// The engine's answer, kept until the lifecycle decides the final one.
    std::optional<engine_reply> reply;
    /// Set when a generation worker took it.
    bool started = false;
  };

  void start(request_id id, std::optional<uint64_t> served);
  void finished(request_id id, result<engine_reply> out);
  /// Answers and forgets lane request `id`, with the engine's answer
  /// (stamped) or `failure`.
  void answer(request_id id, std::optional<stamps> stamped, const http_error* failure);
  /// Leaves `left` for the actor and wakes it.
  void tell_actor(std::vector<request_effect> left);

  mutable std::mutex mutex_;
  request_lifecycle life_;
  std::unordered_map<request_id, request> requests_;
  std::vector<request_effect> left_;
  std::shared_ptr<engine_port> engine_;
  std::string run_id_;
  std::string replica_id_;
  std::shared_ptr<executor> workers_;
  std::function<void()> notify_;
  std::atomic<request_id> next_id_{1};
  std::atomic<uint64_t> completed_{0};
  std::atomic<bool> watch_idle_{false};
};

} // namespace stitch
