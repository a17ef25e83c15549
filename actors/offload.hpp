#pragma once

// Slow work off an actor's thread: a job runs on an executor (a store lane,
// a publisher's worker) and reports `(done, id)` back to its actor, which
// then delivers the answer on its own thread. Handlers stay short whatever
// the backend does.

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>
#include <caf/typed_response_promise.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "actors/credentials.hpp"
#include "actors/value_types.hpp"
#include "actors/workers.hpp"
#include "runtime/core/error.hpp"

namespace stitch {

/// An actor's jobs in flight on executors, by id.
class job_table {
public:
  /// Registers the continuation of a job; returns its id.
  uint64_t add(std::function<void()> then) {
    const uint64_t id = next_++;
    pending_.emplace(id, std::move(then));
    return id;
  }
  /// Forgets a job that never started.
  void drop(uint64_t id) { pending_.erase(id); }
  /// Runs job `id`'s continuation (the actor's `(done, id)` handler).
  void complete(uint64_t id) {
    auto it = pending_.find(id);
    if (it == pending_.end())
      return;
    auto then = std::move(it->second);
    pending_.erase(it);
    then();
  }
  size_t size() const noexcept { return pending_.size(); }

private:
  uint64_t next_ = 1;
  std::unordered_map<uint64_t, std::function<void()>> pending_;
};

/// Answers a promise with a domain result.
template <class T>
void deliver(caf::typed_response_promise<T>& promise, result<T>&& outcome) {
  if (outcome)
    promise.deliver(std::move(*outcome));
  else
    promise.deliver(to_caf_error(outcome.error()));
}

/// Runs `work()` (a `result<T>`) on `lane` and answers the current request
/// with it once `(done, id)` comes back; `then` sees the outcome first, on the
/// actor's thread (to tell subscribers, say). A lane that refuses more work
/// answers `busy` at once (retryable: nothing ran), naming `lane_name`.
template <class T, class Self, class Work>
caf::typed_response_promise<T> offload(Self* self, job_table& jobs, executor& lane,
                                       const std::string& lane_name, Work work,
                                       std::function<void(const result<T>&)> then = {}) {
  auto promise = self->template make_response_promise<T>();
  auto slot = std::make_shared<std::optional<result<T>>>();
  const uint64_t id = jobs.add([promise, slot, then = std::move(then)]() mutable {
    if (then)
      then(**slot);
    deliver(promise, std::move(**slot));
  });
  auto handle = caf::actor_cast<caf::actor>(self);
  bool queued = lane.try_post([slot, handle, id, work = std::move(work)]() mutable {
    slot->emplace(work());
    send_to_itself(handle, atom::done_v, id);
  });
  if (!queued) {
    jobs.drop(id);
    promise.deliver(
      to_caf_error(make_error(errc::busy, "the " + lane_name + " is full; retry in a moment")));
  }
  return promise;
}

} // namespace stitch
