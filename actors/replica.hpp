#pragma once

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

#include "actors/replica_actor.hpp"
#include "actors/request_lane.hpp"
#include "actors/store_actor.hpp"
#include "actors/workers.hpp"
#include "runtime/core/engine_port.hpp"
#include "runtime/core/reconciler.hpp"
#include "runtime/core/request_lifecycle.hpp"
#include "runtime/pipeline/stage_meter.hpp"
#include "transport/ucx_peer.hpp"

namespace stitch {

struct replica_options {
  std::string replica_id = "replica-0";
  std::string pool = "default";
  /// `replica.commit_mode`.
  commit_mode mode = commit_mode::in_place;
  /// The backstop reconcile timer; zero disables it.
  std::chrono::milliseconds backstop{5000};
  /// `replica.drain_timeout`.
  std::chrono::milliseconds drain_timeout{300'000};
  /// Pointer and manifest reads that take longer fail the pass (retried on
  /// the next trigger).
  std::chrono::milliseconds store_timeout{30'000};
  /// Requests queued behind a commit beyond this are refused.
  size_t max_queued = 4096;
  /// A profile that no step touched for this long was abandoned (its CLI
  /// died): the replica goes back to its own pool.
  std::chrono::milliseconds profile_lease{30 * 60 * 1000};
  /// The member capability a retire and `stitch profile`'s messages must
  /// carry (empty: none).
  std::string member_token;
};

/// Makes a fresh engine instance: at startup and to rebuild after an
/// activation failure (a failed engine is never reused).
using engine_factory = std::function<result<std::shared_ptr<engine_port>>()>;

/// What a replica runs on. The workers report back by message, so the actor
/// never blocks: `reconcile_worker` runs staging, activation and rebuilds in
/// posting order (one thread); `request_workers` run generations.
struct replica_deps {
  store_actor store;
  engine_factory make_engine;
  /// Where tensor bytes come from (the store today; peers with the transport).
  std::shared_ptr<tensor_source> bytes;
  std::shared_ptr<executor> reconcile_worker;
  std::shared_ptr<executor> request_workers;
  /// Offers the served weights to peers (null: this replica serves none).
  std::shared_ptr<transport::ucx::holder> holder;
  /// Offers the stored frames of the delta it last fetched from peers
  /// (null: none).
  std::shared_ptr<transport::ucx::holder> frames_holder;
  /// How bytes move, for `server_info` ("ucx (tcp)", "store only: ...").
  std::string transport = "store only";
  /// The byte source of another pool (`stitch profile`'s scratch pool and
  /// back); null: this replica cannot be profiled.
  std::function<std::shared_ptr<tensor_source>(const std::string& pool)> source_for;
  /// The request lane the replica's own HTTP surface shares
  /// (`replica_http_options::lane`, made with `gate_options_of`); null: the
  /// replica makes one that only the actor uses.
  std::shared_ptr<request_lane> lane;
};

/// A `tensor_source` that counts the bytes read through it (from the store,
/// and from peers by holder) and reports progress every `progress_every`
/// bytes (the progress line of long transfers).
class counting_source final : public tensor_source, public transfer {
public:
  using progress = std::function<void(uint64_t total_bytes)>;

  /// Totals so far.
  struct counts {
    uint64_t from_store = 0;
    std::map<std::string, uint64_t> from_peers;
    /// Of those, bytes of delta frames and of whole tensors.
    uint64_t frames_from_peers = 0;
    uint64_t whole_from_peers = 0;
    /// Problems reported so far, and the most recent of them.
    uint64_t problems_seen = 0;
    std::deque<std::string> recent_problems;
  };
  static constexpr size_t kept_problems = 16;

  explicit counting_source(std::shared_ptr<tensor_source> inner, progress on_progress = {},
                           uint64_t progress_every = uint64_t{256} << 20)
      : inner_(std::move(inner)), on_progress_(std::move(on_progress)),
        every_(progress_every == 0 ? 1 : progress_every) {}
  result<manifest> manifest_of(const version_ref& ref) override {
    return inner()->manifest_of(ref);
  }
  status read(const version_ref& ref, std::string_view tensor, uint64_t offset,
              std::span<std::byte> out) override {
    pipeline::phase_scope fetching{pipeline::stage_phase::fetch};
    auto ok = inner()->read(ref, tensor, offset, out);
    if (ok) {
      store_bytes_.fetch_add(out.size(), std::memory_order_relaxed);
      count(out.size());
    }
    return ok;
  }
  transfer* peers() override { return inner()->peers() ? this : nullptr; }
  fetch_report fetch(const version_ref& ref, std::span<const fetch_target> targets,
                     const std::function<void(const transfer_progress&)>& on) override {
    return counted(ref, targets, on, false);
  }
  fetch_report fetch_frames(const version_ref& ref, std::span<const fetch_target> targets,
                            const std::function<void(const transfer_progress&)>& on) override {
    return counted(ref, targets, on, true);
  }
  /// Bytes read from the store and fetched from peers.
  uint64_t bytes() const noexcept { return bytes_.load(std::memory_order_relaxed); }
  /// Bytes read from the store.
  uint64_t store_bytes() const noexcept { return store_bytes_.load(std::memory_order_relaxed); }
  counts snapshot() const {
    std::lock_guard lock{mutex_};
    auto c = counts_;
    c.from_store = store_bytes_.load(std::memory_order_relaxed);
    return c;
  }

  /// Reads another source from now on (counts go on); called between
  /// stages.
  void retarget(std::shared_ptr<tensor_source> inner) {
    std::lock_guard lock{mutex_};
    inner_ = std::move(inner);
  }

private:
  fetch_report counted(const version_ref& ref, std::span<const fetch_target> targets,
                       const std::function<void(const transfer_progress&)>& on, bool frames) {
    pipeline::phase_scope fetching{pipeline::stage_phase::fetch};
    auto keep = inner();
    auto* peers = keep->peers();
    if (!peers)
      return {std::vector<bool>(targets.size(), false), {}, {"no peer transport"}, frames};
    auto report = frames ? peers->fetch_frames(ref, targets, on) : peers->fetch(ref, targets, on);
    uint64_t got = 0;
    {
      std::lock_guard lock{mutex_};
      for (const auto& [source, n] : report.bytes_by_source) {
        counts_.from_peers[source] += n;
        got += n;
      }
      (frames ? counts_.frames_from_peers : counts_.whole_from_peers) += got;
      for (const auto& p : report.problems) {
        ++counts_.problems_seen;
        counts_.recent_problems.push_back(p);
        if (counts_.recent_problems.size() > kept_problems)
          counts_.recent_problems.pop_front();
      }
    }
    count(got);
    return report;
  }
  std::shared_ptr<tensor_source> inner() const {
    std::lock_guard lock{mutex_};
    return inner_;
  }
  void count(uint64_t n) {
    uint64_t before = bytes_.fetch_add(n, std::memory_order_relaxed);
    uint64_t after = before + n;
    if (on_progress_ && after / every_ != before / every_)
      on_progress_(after);
  }

  std::shared_ptr<tensor_source> inner_;
  progress on_progress_;
  uint64_t every_;
  std::atomic<uint64_t> bytes_{0};
  std::atomic<uint64_t> store_bytes_{0};
  mutable std::mutex mutex_;
  counts counts_;
};

struct replica_state {
  static inline const char* name = "replica";

  /// The host side of a request; the lifecycle owns its state.
  struct request {
    replica_call call;
    caf::typed_response_promise<replica_answer> promise;
    std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
    /// Who asked: streamed events go there.
    caf::actor caller;
    /// The engine's answer, kept until the lifecycle decides the final one.
    replica_answer reply;
  };

  replica_options opts;
  replica_deps deps;
  reconciler rec;
  /// The request lifecycle, shared with the HTTP surface's lane.
  std::shared_ptr<request_lane> lane;
  std::shared_ptr<engine_port> engine;
  std::shared_ptr<counting_source> bytes;
  std::map<request_id, request> requests;
  /// (caller, caller's key) -> request: keys are unique per caller only (the
  /// gateway and the replica's own HTTP front count independently).
  std::map<std::pair<caf::actor_addr, uint64_t>, request_id> by_key;
  /// The commit the gate is draining for.
  std::optional<reconcile_effects::commit> pending_commit;
  /// An engine built by a rebuild job, taken when its report arrives.
  std::shared_ptr<std::shared_ptr<engine_port>> rebuilt_engine;
  bool drain_timer_armed = false;
  /// `stitch profile`, while one drives this replica.
  struct profiling {
    std::string home_pool;
    std::string pool;
    /// Retargeted to `pool` (the begin was answered).
    bool started = false;
    std::optional<caf::typed_response_promise<replica_info>> begin;
    /// The step being run.
    struct step {
      uint64_t id = 0;
      caf::typed_response_promise<profile_step> promise;
      version_ref target;
      std::optional<version_ref> from;
      std::chrono::steady_clock::time_point began;
      reconcile_metrics before;
      counting_source::counts bytes_before;
      /// Its pass ended; the checksum verdict is being computed.
      bool verifying = false;
    };
    std::optional<step> running;
    uint64_t steps = 0;
    /// Going home (asked, or the lease ran out): retargeted back
    /// (`returned`), then answered when a pass there ended.
    bool ending = false;
    std::optional<caf::typed_response_promise<replica_info>> end;
    bool returned = false;
    /// Counts the lease's renewals: a lease tick of an older one is stale.
    uint64_t lease = 0;
  };
  std::optional<profiling> profile;
  replica_metrics counters;
  fetch_summary last_fetch;
  std::vector<replica_watcher_actor> subscribers;
  /// What subscribers last heard (ready, applied, serving, sync state,
  /// reason, terminal error).
  std::optional<std::tuple<bool, std::optional<version_ref>, std::optional<uint64_t>, sync_state,
                           std::string, std::optional<std::string>>>
    last_published;

  replica_state() = default;
  replica_state(const replica_state&) = delete;
  replica_state& operator=(const replica_state&) = delete;
  /// Runs as the actor ends: generations still running stop at their next
  /// step. (CAF destroys a stateful actor's state before its attached
  /// functors run, so those must never touch the state.)
  ~replica_state() {
    for (auto& [id, r] : requests)
      r.cancelled->store(true);
    if (lane)
      lane->detach();
  }
};

/// A replica over `deps`. Spawn it on the cooperative scheduler: everything
/// slow runs on the workers.
replica_actor::behavior_type replica_service(replica_actor::stateful_pointer<replica_state> self,
                                             replica_options opts, replica_deps deps);

/// The `server_info` of a replica's state (exposed for tests).
replica_info describe(const replica_state& state);

} // namespace stitch
