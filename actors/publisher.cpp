#include "actors/publisher.hpp"

#include <caf/all.hpp>

#include <algorithm>

#include "actors/credentials.hpp"
#include "actors/local_only.hpp"
#include "actors/log.hpp"
#include "actors/peer_offer.hpp"
#include "runtime/core/token.hpp"
#include "runtime/core/version_ref.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/engine/weights.hpp"

namespace stitch {

namespace {

using self_ptr = publisher_actor::stateful_pointer<publisher_state>;

/// Pieces a streamed publish queues ahead of the publish consuming them.
constexpr size_t queued_pieces = 64;

/// How often idle sessions are looked for: often enough for the timeout.
std::chrono::milliseconds sweep_every(const publisher_limits& limits) {
  auto half =
    std::chrono::duration_cast<std::chrono::milliseconds>(limits.session_idle_timeout) / 2;
  return std::clamp(half, std::chrono::milliseconds{500}, std::chrono::milliseconds{30'000});
}

/// A node with an admin token refuses publishes without it (constant time).
status authorized(const publisher_state& st, const publish_args& args) {
  if (!token_matches(st.admin_token, args.token))
    return error{errc::unauthorized, "publishing needs the admin token (--token or STITCH_TOKEN)"};
  return {};
}

/// The queue of `pool`'s publishes.
executor& queue_of(self_ptr self, const std::string& pool) {
  auto& q = self->state.pools[pool];
  if (!q)
    q = std::make_shared<strand>(self->state.workers);
  return *q;
}

using report_handler = std::function<void(result<retention_report>)>;

/// Applies retention to `pool` on the pool's queue (after its publishes),
/// once the directory said which versions replicas use; a directory that
/// does not answer means nothing is collected this time.
void collect(self_ptr self, const std::string& pool, retention_request request,
             report_handler done) {
  auto& st = self->state;
  auto run = [self, pool, done](retention_request req) {
    auto& now = self->state;
    auto slot = std::make_shared<std::optional<result<retention_report>>>();
    const uint64_t job = now.jobs.add([slot, done] { done(std::move(**slot)); });
    queue_of(self, pool)
      .post([backend = now.backend, pool, req = std::move(req), slot,
             handle = caf::actor_cast<caf::actor>(self), job] {
        slot->emplace(backend->retain(pool, req));
        send_to_itself(handle, atom::done_v, job);
      });
  };
  if (!st.retention.directory) {
    run(std::move(request));
    return;
  }
  self
    ->request(st.retention.directory, caf::duration{st.retention.directory_timeout}, atom::in_use_v,
              pool)
    .then(
      [run, request](std::vector<version_ref>& used) mutable {
        request.in_use.insert(used.begin(), used.end());
        run(std::move(request));
      },
      [self, done](caf::error& err) {
        done(error{errc::backend_failure,
                   "the coordinator did not say which versions replicas use ("
                     + self->system().render(err) + "); nothing was collected"});
      });
}

/// `stitch gc` over several pools: each in turn, their reports merged; the
/// first failure ends it.
struct gathered_collection {
  std::vector<std::string> pools;
  size_t next = 0;
  retention_request request;
  retention_report report;
  caf::typed_response_promise<retention_report> promise;
};

void collect_next(self_ptr self, std::shared_ptr<gathered_collection> all) {
  if (all->next == all->pools.size()) {
    all->promise.deliver(std::move(all->report));
    return;
  }
  const auto& pool = all->pools[all->next++];
  collect(self, pool, all->request, [self, all](result<retention_report> r) {
    if (!r) {
      all->promise.deliver(to_caf_error(r.error()));
      return;
    }
    for (auto& e : r->deleted)
      all->report.deleted.push_back(std::move(e));
    for (auto& e : r->kept)
      all->report.kept.push_back(std::move(e));
    collect_next(self, all);
  });
}

/// Retention after a publish to `pool` (one collection per pool at a time).
void collect_after_publish(self_ptr self, const std::string& pool) {
  auto& st = self->state;
  if (st.retention.keep_last == 0)
    return;
  if (st.collecting.contains(pool)) {
    st.collect_again.insert(pool);
    return;
  }
  st.collecting.insert(pool);
  retention_request req;
  req.keep_last = st.retention.keep_last;
  collect(self, pool, std::move(req), [self, pool](result<retention_report> report) {
    auto& now = self->state;
    now.collecting.erase(pool);
    if (!report)
      log::warn("publisher", "retention in pool " + pool + ": " + to_string(report.error()));
    else if (!report->deleted.empty())
      log::info("publisher", "retention in pool " + pool + ": removed "
                               + std::to_string(report->deleted.size()) + " version(s), kept "
                               + std::to_string(report->kept.size()));
    if (now.collect_again.erase(pool) > 0)
      collect_after_publish(self, pool);
  });
}

/// A publish ended well: retention runs (subscribers heard of the pointer
/// move from the store, whose backend moved it).
void published(self_ptr self, const publish_args& args) {
  if (args.dry_run)
    return;
  collect_after_publish(self, args.pool);
}

/// Runs `make_source()` and publishes what it gives on the pool's queue;
/// tells the store when the pointer moved.
template <class MakeSource>
caf::typed_response_promise<pipeline::publish_report>
run_publish(self_ptr self, const publish_args& args, MakeSource make_source) {
  auto impl = self->state.impl;
  return offload<pipeline::publish_report>(
    self, self->state.jobs, queue_of(self, args.pool), "publisher's queue",
    [impl, args,
     make_source = std::move(make_source)]() mutable -> result<pipeline::publish_report> {
      auto source = make_source();
      if (!source)
        return std::move(source).error();
      auto report = impl->publish(args, **source);
      if (!report)
        return std::move(report).error();
      return pipeline::without_manifest(std::move(*report));
    },
    [self, args](const result<pipeline::publish_report>& outcome) {
      if (outcome)
        published(self, args);
      else
        log::warn("publisher", "publishing " + to_string(version_ref{args.run_id, args.version})
                                 + " failed: " + to_string(outcome.error()));
    });
}

/// Watches the sender of the current message as a feeder of `s` when it
/// runs on another node (see `session::feeders`).
template <class Self>
void watch_feeder(Self* self, publisher_state::session& s) {
  const auto& sender = self->current_sender();
  if (!sender || sender->node() == self->node())
    return;
  auto addr = caf::actor_cast<caf::actor_addr>(sender);
  if (std::find(s.feeders.begin(), s.feeders.end(), addr) != s.feeders.end())
    return;
  self->monitor(caf::actor_cast<caf::actor>(sender));
  s.feeders.push_back(std::move(addr));
}

/// A session's outcome went to its client (or nobody wants it): it goes.
/// An aborted one nobody waits for goes at once, its publish still queued
/// or ending: it fails on its own (its stream is closed), and until then it
/// would hold one of the node's `max_sessions` slots (behind a long publish
/// to its pool, for as long as that one takes).
void settle(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto it = st.sessions.find(id);
  if (it == st.sessions.end())
    return;
  if (!it->second.outcome) {
    if (!it->second.aborted || it->second.waiting)
      return; // its publish runs (or waits for its turn), or a client waits for why it failed
  } else if (it->second.waiting) {
    deliver(*it->second.waiting, std::move(*it->second.outcome));
  } else if (!it->second.aborted) {
    return; // the client has yet to ask with `finish`
  }
  auto feeders = std::move(it->second.feeders);
  st.sessions.erase(it);
  // Its feeders are no longer watched unless another session has them too.
  for (const auto& f : feeders)
    if (std::none_of(st.sessions.begin(), st.sessions.end(), [&](const auto& kv) {
          const auto& others = kv.second.feeders;
          return std::find(others.begin(), others.end(), f) != others.end();
        }))
      self->demonitor(f);
}

/// A feeder of sessions went down: each session it fed that is still
/// taking bytes is aborted (nothing will finish it).
void feeder_down(self_ptr self, const caf::down_msg& down) {
  auto& st = self->state;
  std::vector<uint64_t> hit;
  for (auto& [id, s] : st.sessions) {
    auto f = std::find(s.feeders.begin(), s.feeders.end(), down.source);
    if (f == s.feeders.end())
      continue;
    s.feeders.erase(f);
    // A client that asked `finish` has sent everything: its publish ends
    // on its own. A normal exit is the CLI's own scoped actor that opened
    // the session for another (an older client).
    if (s.aborted || s.waiting || down.reason == caf::exit_reason::normal)
      continue;
    log::warn("publisher",
              "the client of publish session " + std::to_string(id) + " (pool " + s.args.pool + ", "
                + to_string(version_ref{s.args.run_id, s.args.version}) + ") went away ("
                + self->system().render(down.reason) + "); aborting it");
    s.aborted = true;
    s.stream->close(
      error{errc::engine_unavailable, "the client went away before it finished the publish"});
    hit.push_back(id);
  }
  for (auto id : hit)
    settle(self, id);
}

stitch::error no_session(uint64_t id) {
  return {errc::not_found, "no publish session " + std::to_string(id)
                             + " (it ended, failed, or was dropped after "
                               "publisher.session_idle_timeout)"};
}

/// Hands the next bytes of session `id` to its stream; answered (with the
/// bytes the session still expects) once the publish consumed them.
template <class Self>
caf::result<uint64_t> take_chunk(Self* self, uint64_t id, std::shared_ptr<const void> owner,
                                 std::span<const char> bytes) {
  auto& st = self->state;
  auto it = st.sessions.find(id);
  if (it == st.sessions.end() || it->second.aborted)
    return to_caf_error(no_session(id));
  auto& s = it->second;
  s.last_seen = self->clock().now();
  watch_feeder(self, s);
  if (bytes.size() > max_chunk_bytes)
    return to_caf_error({errc::limit_exceeded, "a publish chunk is limited to "
                                                 + std::to_string(max_chunk_bytes) + " bytes"});
  auto promise = self->template make_response_promise<uint64_t>();
  const uint64_t left = s.stream->total() - s.stream->pushed() - bytes.size();
  const uint64_t ack = st.jobs.add([promise, left]() mutable { promise.deliver(left); });
  auto handle = caf::actor_cast<caf::actor>(self);
  if (auto ok = s.stream->push(std::move(owner), bytes,
                               [handle, ack] { send_to_itself(handle, atom::done_v, ack); });
      !ok) {
    st.jobs.drop(ack);
    s.stream->close(ok.error());
    promise.deliver(to_caf_error(ok.error()));
  }
  return promise;
}

/// Lends each run's remembered version to peers and keeps the coordinator's
/// directory told (`publisher_lending`). Called on publishing threads.
class lending_watcher final : public pipeline::remembered_watcher {
public:
  lending_watcher(publisher_lending lending, caf::weak_actor_ptr self)
      : lending_(std::move(lending)), self_(std::move(self)) {}

  void remembered(const std::string& pool, host_weights weights) override {
    auto ref = weights.version;
    auto id = holder_id(pool, ref.run_id);
    if (auto ok = lending_.holders->expose(pool + "/" + ref.run_id, id, std::move(weights)); !ok) {
      log::warn("publisher", "cannot lend " + to_string(ref)
                               + " to peers (they read the store): " + to_string(ok.error()));
      return;
    }
    if (auto me = self_.lock())
      caf::anon_send(lending_.registry, atom::offer_v, pool, ref, id, lending_.node,
                     caf::actor_cast<peer_holder_actor>(me), false, lending_.member_token);
  }

  void delta_stored(const std::string& pool, host_weights frames) override {
    if (!lending_.frame_holders)
      return;
    auto ref = frames.version;
    auto id = holder_id(pool, ref.run_id);
    // The frames are a copy of their own: lending the next replaces them,
    // and readers' leases keep them alive till then.
    if (auto ok = lending_.frame_holders->expose(pool + "/" + ref.run_id, id, std::move(frames));
        !ok) {
      log::warn("publisher", "cannot lend the frames of " + to_string(ref)
                               + " to peers (they read the store): " + to_string(ok.error()));
      return;
    }
    if (auto me = self_.lock())
      caf::anon_send(lending_.registry, atom::offer_v, pool, ref, id, lending_.node,
                     caf::actor_cast<peer_holder_actor>(me), true, lending_.member_token);
  }

  void rewriting(const std::string& pool, const std::string& run_id) override {
    auto id = holder_id(pool, run_id);
    caf::anon_send(lending_.registry, atom::release_v, pool, id, lending_.member_token);
    if (!lending_.holders->withdraw(pool + "/" + run_id))
      log::warn("publisher", "readers of " + id
                               + " still hold leases; rewriting its copy anyway (chunks "
                                 "that change fail their digests and are read elsewhere)");
  }

private:
  std::string holder_id(const std::string& pool, const std::string& run_id) const {
    return "publisher@" + lending_.node + "/" + pool + "/" + run_id;
  }
  publisher_lending lending_;
  caf::weak_actor_ptr self_;
};

} // namespace

publisher_state::~publisher_state() {
  for (auto& [id, s] : sessions)
    if (s.stream)
      s.stream->close(error{errc::engine_unavailable, "the publisher stopped"});
}

namespace {

using self_ptr = publisher_actor::stateful_pointer<publisher_state>;

caf::result<pipeline::publish_report> on_publish(self_ptr self, const publish_args& args,
                                                 const std::string& path) {
  if (auto ok = authorized(self->state, args); !ok)
    return to_caf_error(ok.error());
  return run_publish(self, args, [path]() -> result<std::unique_ptr<pipeline::tensor_stream>> {
    auto dir = pipeline::directory_stream::open(path);
    if (!dir)
      return std::move(dir).error();
    return std::unique_ptr<pipeline::tensor_stream>{std::move(*dir)};
  });
}

caf::result<pipeline::publish_report> on_init_model(self_ptr self, const publish_args& args,
                                                    const std::string& preset, uint64_t seed) {
  if (auto ok = authorized(self->state, args); !ok)
    return to_caf_error(ok.error());
  auto config = engine::preset(preset);
  if (!config)
    return to_caf_error(config.error());
  /// Owns the weights it streams.
  struct owned_model final : pipeline::tensor_stream {
    explicit owned_model(pipeline::tensor_set w) : weights(std::move(w)), inner(weights) {}
    const std::vector<pipeline::tensor_header>& tensors() const override { return inner.tensors(); }
    status read(size_t i, uint64_t off, std::span<std::byte> out) override {
      return inner.read(i, off, out);
    }
    pipeline::tensor_set weights;
    pipeline::memory_stream inner;
  };
  return run_publish(
    self, args, [config = *config, seed]() -> result<std::unique_ptr<pipeline::tensor_stream>> {
      auto weights = engine::random_init(config, seed);
      if (!weights)
        return std::move(weights).error();
      return std::unique_ptr<pipeline::tensor_stream>{
        std::make_unique<owned_model>(std::move(*weights))};
    });
}

caf::result<uint64_t> on_open_session(self_ptr self, const publish_args& args,
                                      std::vector<pipeline::tensor_header>& tensors) {
  auto& st = self->state;
  if (auto ok = authorized(st, args); !ok)
    return to_caf_error(ok.error());
  // Busy, not a bad request: retryable (HTTP 503 with Retry-After).
  if (st.sessions.size() >= st.limits.max_sessions)
    return to_caf_error({errc::busy, "too many publishes in progress ("
                                       + std::to_string(st.limits.max_sessions)
                                       + "); retry later"});
  if (auto ok = validate_run_id(args.run_id); !ok)
    return to_caf_error(ok.error());
  if (auto ok = pipeline::validate_headers(tensors); !ok)
    return to_caf_error(ok.error());
  auto stream = std::make_shared<pipeline::fed_stream>(std::move(tensors), queued_pieces);
  if (stream->total() > st.limits.max_session_bytes)
    return to_caf_error(
      {errc::limit_exceeded, "the publish declares " + std::to_string(stream->total())
                               + " bytes, more than the "
                               + std::to_string(st.limits.max_session_bytes) + " allowed"});
  // Random: the session's chunks, finish and abort name it, and only its
  // opener (who showed the token) knows it.
  uint64_t id = 0;
  while (id == 0 || st.sessions.contains(id))
    id = st.session_ids();
  auto& s = st.sessions[id];
  s.args = args;
  s.stream = stream;
  s.last_seen = self->clock().now();
  watch_feeder(self, s);
  auto impl = st.impl;
  auto handle = caf::actor_cast<caf::actor>(self);
  auto slot = std::make_shared<std::optional<result<pipeline::publish_report>>>();
  const uint64_t job = st.jobs.add([self, id, slot, args] {
    if (**slot)
      published(self, args);
    auto it = self->state.sessions.find(id);
    if (it == self->state.sessions.end())
      return;
    it->second.outcome = std::move(*slot);
    settle(self, id);
  });
  // The client hears the session id once the buffers its first pieces
  // land in are warm (their pages faulted in here, on a bulk thread, not
  // on the network thread while other connections wait).
  const uint64_t pieces = std::min<uint64_t>(
    queued_pieces, (stream->total() + streamed_piece_bytes - 1) / streamed_piece_bytes);
  auto answer = offload<uint64_t>(
    self, st.jobs, *st.workers, "publisher's workers", [id, pieces]() -> result<uint64_t> {
      warm_piece_buffers(static_cast<size_t>(pieces), streamed_piece_bytes);
      return id;
    });
  queue_of(self, args.pool).post([impl, args, stream, slot, handle, job] {
    auto report = impl->publish(args, *stream);
    // Bytes still queued for a publish that ended are dropped; bytes
    // that arrive later are refused with why it ended.
    error why{errc::invalid_argument, "the publish already ended"};
    if (report) {
      slot->emplace(pipeline::without_manifest(std::move(*report)));
    } else {
      why = report.error();
      slot->emplace(std::move(report).error());
    }
    stream->close(std::move(why));
    send_to_itself(handle, atom::done_v, job);
  });
  return answer;
}

caf::result<pipeline::publish_report> on_finish(self_ptr self, uint64_t id) {
  auto& st = self->state;
  auto it = st.sessions.find(id);
  if (it == st.sessions.end() || it->second.aborted || it->second.waiting)
    return to_caf_error(no_session(id));
  auto& s = it->second;
  // No more bytes: a publish still missing some fails with "truncated".
  s.stream->close();
  s.waiting = self->make_response_promise<pipeline::publish_report>();
  auto promise = *s.waiting;
  settle(self, id);
  return promise;
}

caf::result<retention_report> on_collect_runs(self_ptr self, const std::string& pool,
                                              const std::vector<std::string>& runs,
                                              const std::string& token) {
  auto& st = self->state;
  if (!token_matches(st.admin_token, token))
    return to_caf_error({errc::unauthorized, "dropping runs needs the admin token (--token "
                                             "or STITCH_TOKEN)"});
  if (auto ok = validate_pool(pool); !ok)
    return to_caf_error(ok.error());
  retention_request req;
  req.keep_last = std::max<size_t>(1, st.retention.keep_last);
  req.drop_runs.insert(runs.begin(), runs.end());
  auto promise = self->make_response_promise<retention_report>();
  collect(self, pool, std::move(req), [promise](result<retention_report> r) mutable {
    if (r)
      promise.deliver(std::move(*r));
    else
      promise.deliver(to_caf_error(r.error()));
  });
  return promise;
}

caf::result<retention_report> on_collect_newest(self_ptr self, const std::string& pool,
                                                uint32_t keep, bool dry_run,
                                                const std::string& token) {
  auto& st = self->state;
  if (!dry_run && !token_matches(st.admin_token, token))
    return to_caf_error({errc::unauthorized,
                         "collecting versions needs the admin token (--token or "
                         "STITCH_TOKEN); --dry-run does not"});
  if (!pool.empty())
    if (auto ok = validate_pool(pool); !ok)
      return to_caf_error(ok.error());
  retention_request req;
  req.keep_last = keep > 0 ? keep : st.retention.keep_last;
  if (req.keep_last == 0)
    return to_caf_error({errc::invalid_argument,
                         "store.retain_versions is 0 on the publisher's node (keep every "
                         "version): give --keep N to collect anyway"});
  req.dry_run = dry_run;
  auto promise = self->make_response_promise<retention_report>();
  auto all = std::make_shared<gathered_collection>();
  all->request = std::move(req);
  all->promise = promise;
  if (!pool.empty()) {
    all->pools = {pool};
    collect_next(self, all);
    return promise;
  }
  // Listing pools reads the store: off the actor's thread.
  auto slot = std::make_shared<std::optional<result<std::vector<std::string>>>>();
  const uint64_t job = st.jobs.add([self, slot, all] {
    if (!**slot) {
      all->promise.deliver(to_caf_error((*slot)->error()));
      return;
    }
    all->pools = std::move(***slot);
    collect_next(self, all);
  });
  st.workers->post([backend = st.backend, slot, handle = caf::actor_cast<caf::actor>(self), job] {
    slot->emplace(backend->list_pools());
    send_to_itself(handle, atom::done_v, job);
  });
  return promise;
}

void on_tick(self_ptr self) {
  auto& st = self->state;
  const auto now = self->clock().now();
  for (auto& [id, s] : st.sessions) {
    // Bytes waiting for the publish (queued behind another publish to
    // the pool, say): the client waits on us, it is not idle.
    if (!s.aborted && s.stream && s.stream->has_unread()) {
      s.last_seen = now;
      continue;
    }
    if (!s.aborted && !s.waiting && now - s.last_seen > st.limits.session_idle_timeout) {
      log::warn("publisher", "publish session " + std::to_string(id) + " was idle for "
                               + std::to_string(st.limits.session_idle_timeout.count())
                               + " s; dropping it");
      s.aborted = true;
      s.stream->close(
        error{errc::invalid_argument, "no bytes arrived for publisher.session_idle_timeout"});
    }
  }
  std::vector<uint64_t> ids;
  for (const auto& [id, s] : st.sessions)
    ids.push_back(id);
  for (auto id : ids)
    settle(self, id);
  self->delayed_send(self, sweep_every(self->state.limits), atom::tick_v);
}

} // namespace

publisher_actor::behavior_type
publisher_service(publisher_actor::stateful_pointer<publisher_state> self,
                  std::shared_ptr<store_backend> backend, store_actor store,
                  pipeline::publisher_options options, std::shared_ptr<executor> workers,
                  std::string admin_token, publisher_limits limits, publisher_retention retention,
                  publisher_lending lending) {
  auto& init = self->state;
  init.retention = std::move(retention);
  init.admin_token = std::move(admin_token);
  init.backend = std::move(backend);
  init.impl = std::make_shared<pipeline::publisher>(*init.backend, std::move(options));
  init.store = std::move(store);
  init.workers = std::move(workers);
  init.limits = limits;
  init.lending = std::move(lending);
  if (init.lending.holders && init.lending.registry)
    init.impl->watch(std::make_shared<lending_watcher>(
      init.lending, caf::actor_cast<caf::weak_actor_ptr>(self->ctrl())));
  self->delayed_send(self, sweep_every(init.limits), atom::tick_v);
  self->set_down_handler([self](caf::down_msg& down) { feeder_down(self, down); });
  return {
    [self](atom::publish, const publish_args& args, const std::string& path)
      -> caf::result<pipeline::publish_report> { return on_publish(self, args, path); },
    [self](atom::init_model, const publish_args& args, const std::string& preset, uint64_t seed)
      -> caf::result<pipeline::publish_report> { return on_init_model(self, args, preset, seed); },
    [self](atom::publish, const publish_args& args, std::vector<pipeline::tensor_header>& tensors)
      -> caf::result<uint64_t> { return on_open_session(self, args, tensors); },
    [self](atom::chunk, uint64_t id, shared_piece& piece) -> caf::result<uint64_t> {
      if (!piece.owner || (!piece.data && piece.size > 0))
        return to_caf_error({errc::invalid_argument, "a publish piece without its bytes"});
      std::span<const char> view{piece.data, piece.size};
      return take_chunk(self, id, std::move(piece.owner), view);
    },
    [self](atom::finish, uint64_t id) -> caf::result<pipeline::publish_report> {
      return on_finish(self, id);
    },
    [self](atom::abort, uint64_t id) {
      auto it = self->state.sessions.find(id);
      if (it == self->state.sessions.end())
        return;
      it->second.aborted = true;
      it->second.stream->close(error{errc::invalid_argument, "the client aborted the publish"});
      settle(self, id);
    },
    [self](atom::collect, const std::string& pool, const std::vector<std::string>& runs,
           const std::string& token) -> caf::result<retention_report> {
      return on_collect_runs(self, pool, runs, token);
    },
    [self](atom::collect, const std::string& pool, uint32_t keep, bool dry_run,
           const std::string& token) -> caf::result<retention_report> {
      return on_collect_newest(self, pool, keep, dry_run, token);
    },
    // Internal: its workers' ends and its sweep timer, from itself only (a
    // forged end would answer a request before its work ran).
    [self](atom::done, uint64_t id) {
      if (from_itself(self))
        self->state.jobs.complete(id);
    },
    [self](atom::offer, const version_ref& version, bool frames,
           const std::string& cap) -> caf::result<peer_offer> {
      auto& st = self->state;
      if (!member_admits("publisher", st.lending.member_token, cap, "a peer's offer request"))
        return not_a_member("reading a version from a peer");
      const auto& holders = frames ? st.lending.frame_holders : st.lending.holders;
      if (!holders)
        return to_caf_error(error{errc::not_found, "this publisher lends no versions"});
      auto o = holders->lease(version);
      if (!o)
        return to_caf_error(o.error());
      return to_peer_offer(*o);
    },
    [self](atom::server_info) { return self->state.http_url; },
    [self](atom::server_info, std::string& url) {
      // Only this node says where its publisher's HTTP surface listens:
      // `stitch publish --stream` sends the admin token to that address.
      if (!from_this_node(self)) {
        log::warn("publisher", "ignored a new HTTP address from outside this node ("
                                 + quote_untrusted(url) + ")");
        return;
      }
      self->state.http_url = std::move(url);
    },
    [self](atom::release, uint64_t lease) {
      // Lease ids are unique in the process: only the set that gave it
      // knows it.
      for (const auto& h : {self->state.lending.holders, self->state.lending.frame_holders})
        if (h)
          h->release(lease);
    },
    [self](atom::tick) {
      if (from_itself(self))
        on_tick(self);
    },
  };
}

} // namespace stitch
