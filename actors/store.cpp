#include "actors/store.hpp"

#include <caf/all.hpp>

#include <algorithm>

#include "actors/credentials.hpp"
#include "actors/log.hpp"
#include "runtime/core/token.hpp"

namespace stitch {

namespace {

using self_ptr = store_actor::stateful_pointer<store_state>;

const std::string fast_lane_name = "store's fast lane";
const std::string bulk_lane_name = "store's bulk lane";
const std::string reads_lane_name = "store's read lane";

constexpr auto sweep_every = std::chrono::seconds{30};

/// Tells every listener of `pool`, and those of every pool, where its
/// pointer is now.
void tell_listeners(self_ptr self, const std::string& pool, const pointer_record& p) {
  for (const auto& key : {pool, std::string{}}) {
    auto it = self->state.listeners.find(key);
    if (it == self->state.listeners.end())
      continue;
    for (const auto& l : it->second)
      self->send(l, atom::pointer_moved_v, pool, p);
  }
}

/// Forgets an upload; its writer (and, unless committed, what it wrote) goes
/// on its own queue, after its last job.
void end_upload(self_ptr self, uint64_t id) {
  auto it = self->state.uploads.find(id);
  if (it == self->state.uploads.end())
    return;
  it->second.queue->post([w = std::move(it->second.writer)]() mutable { w.reset(); });
  self->state.uploads.erase(it);
}

stitch::error unknown_upload(uint64_t id) {
  return make_error(errc::not_found, "no upload " + std::to_string(id)
                                       + " (it failed, ended, or was dropped after "
                                         "store.upload_idle_timeout)");
}

/// Runs `work(upload)` in the upload's order on the bulk lane; a failure
/// ends the upload.
template <class T, class Work>
caf::result<T> on_upload(self_ptr self, uint64_t id, Work work) {
  auto& st = self->state;
  auto it = st.uploads.find(id);
  if (it == st.uploads.end())
    return to_caf_error(unknown_upload(id));
  it->second.last_seen = self->clock().now();
  auto up = it->second;
  return offload<T>(
    self, st.jobs, *up.queue, "store's upload queue",
    [up, work = std::move(work)]() mutable -> result<T> { return work(up); },
    [self, id](const result<T>& outcome) {
      if (!outcome)
        end_upload(self, id);
    });
}

} // namespace

store_lanes store_lanes::make() {
  return {std::make_shared<worker_pool>(2, "store-fast", 4096),
          std::make_shared<worker_pool>(2, "store-bulk", 256, priority::background),
          std::make_shared<worker_pool>(2, "store-reads", 1024)};
}

namespace {

using self_ptr = store_actor::stateful_pointer<store_state>;

caf::result<uint64_t> on_put_chunk(self_ptr self, uint64_t id, std::vector<char>& bytes) {
  if (bytes.size() > max_chunk_bytes)
    return to_caf_error({errc::limit_exceeded, "an upload chunk is limited to "
                                                 + std::to_string(max_chunk_bytes) + " bytes"});
  return on_upload<uint64_t>(
    self, id, [bytes = std::move(bytes)](store_state::upload& up) -> result<uint64_t> {
      if (auto ok = up.writer->write(std::as_bytes(std::span{bytes})); !ok)
        return std::move(ok).error();
      *up.bytes += bytes.size();
      return *up.bytes;
    });
}

caf::result<bool> on_put_file(self_ptr self, uint64_t id, const std::string& name,
                              std::vector<char>& bytes) {
  if (bytes.size() > max_version_file_bytes)
    return to_caf_error(
      {errc::limit_exceeded,
       "a file is limited to " + std::to_string(max_version_file_bytes) + " bytes"});
  return on_upload<bool>(
    self, id, [name, bytes = std::move(bytes)](store_state::upload& up) -> result<bool> {
      if (auto ok = up.writer->add_file(name, std::as_bytes(std::span{bytes})); !ok)
        return std::move(ok).error();
      return true;
    });
}

caf::result<bool> on_put_end(self_ptr self, uint64_t id, const manifest& m) {
  auto answer = on_upload<bool>(self, id, [m](store_state::upload& up) -> result<bool> {
    if (auto ok = up.writer->commit(m); !ok)
      return std::move(ok).error();
    return true;
  });
  // Ended either way.
  end_upload(self, id);
  return answer;
}

void on_tick(self_ptr self) {
  auto& st = self->state;
  const auto now = self->clock().now();
  for (auto it = st.uploads.begin(); it != st.uploads.end();) {
    if (now - it->second.last_seen > st.opts.upload_idle_timeout) {
      log::warn("store", "upload " + std::to_string(it->first) + " was idle for "
                           + std::to_string(st.opts.upload_idle_timeout.count())
                           + " s; dropping it and what it wrote");
      end_upload(self, (it++)->first);
    } else {
      ++it;
    }
  }
  self->delayed_send(self, sweep_every, atom::tick_v);
}

/// A range of a tensor, read on the read lane into a pooled buffer (no
/// zero-fill, no fresh pages per read).
caf::result<shared_piece> on_read_range(self_ptr self, const std::string& pool,
                                        const version_ref& ref, const std::string& tensor,
                                        uint64_t offset, uint64_t len) {
  if (len > max_chunk_bytes)
    return to_caf_error({errc::limit_exceeded, "a range read is limited to "
                                                 + std::to_string(max_chunk_bytes) + " bytes"});
  auto db = self->state.backend;
  return offload<shared_piece>(self, self->state.jobs, *self->state.lanes.reads, reads_lane_name,
                               [db, pool, ref, tensor, offset, len]() -> result<shared_piece> {
                                 auto out = take_piece_buffer(static_cast<size_t>(len));
                                 if (!out)
                                   return std::move(out).error();
                                 auto ok = db->read_range(
                                   pool, ref, tensor, offset,
                                   std::as_writable_bytes(std::span{out->data, out->size}));
                                 if (!ok)
                                   return std::move(ok).error();
                                 return out->share(out->size);
                               });
}

/// The pools, or those holding a version of `run` when it is named.
caf::result<std::vector<std::string>> on_list_pools(self_ptr self, const std::string& run) {
  auto db = self->state.backend;
  return offload<std::vector<std::string>>(self, self->state.jobs, *self->state.lanes.fast,
                                           fast_lane_name,
                                           [db, run]() -> result<std::vector<std::string>> {
                                             auto all = db->list_pools();
                                             if (!all || run.empty())
                                               return all;
                                             std::vector<std::string> holding;
                                             for (const auto& pool : *all) {
                                               auto versions = db->list_versions(pool, run);
                                               if (!versions)
                                                 return std::move(versions).error();
                                               if (!versions->empty())
                                                 holding.push_back(pool);
                                             }
                                             return holding;
                                           });
}

/// A version written as a plain HF directory on the store's node (admin).
caf::result<bool> on_export_to(self_ptr self, const std::string& pool, const version_ref& ref,
                               const std::string& path, bool sync, const std::string& token) {
  if (!token_matches(self->state.opts.admin_token, token))
    return to_caf_error({errc::unauthorized, "writing an export on the store's node needs the "
                                             "admin token (--token or STITCH_TOKEN)"});
  if (!std::filesystem::path{path}.is_absolute())
    return to_caf_error(
      {errc::invalid_argument,
       "an export path on the store's node must be absolute, not " + quote_untrusted(path)});
  pipeline::export_options options;
  options.sync = sync;
  options.buffer_bytes = self->state.opts.io_buffer_bytes;
  auto db = self->state.backend;
  return offload<bool>(self, self->state.jobs, *self->state.lanes.bulk, bulk_lane_name,
                       [db, pool, ref, path, options]() -> result<bool> {
                         auto ok = pipeline::export_version(*db, pool, ref, path, options);
                         if (!ok)
                           return std::move(ok).error();
                         return true;
                       });
}

/// An `unauthorized` refusal of a write without the admin token (none
/// when the token is right, or the store has none).
std::optional<caf::error> without_token(self_ptr self, const std::string& token,
                                        std::string_view what) {
  if (token_matches(self->state.opts.admin_token, token))
    return std::nullopt;
  return to_caf_error(
    {errc::unauthorized, std::string{what} + " needs the admin token (--token or STITCH_TOKEN)"});
}

/// Opens an upload of version `ref` (its writer made on the bulk lane).
caf::result<uint64_t> on_put_begin(self_ptr self, const std::string& pool, const version_ref& ref,
                                   const std::string& token) {
  if (auto no = without_token(self, token, "storing a version"))
    return *no;
  uint64_t id = 0;
  while (id == 0 || self->state.uploads.contains(id))
    id = self->state.upload_ids();
  auto opened = std::make_shared<std::shared_ptr<version_writer>>();
  auto db = self->state.backend;
  return offload<uint64_t>(
    self, self->state.jobs, *self->state.lanes.bulk, bulk_lane_name,
    [db, pool, ref, id, opened]() -> result<uint64_t> {
      auto writer = db->begin_version(pool, ref);
      if (!writer)
        return std::move(writer).error();
      *opened = std::move(*writer);
      return id;
    },
    [self, id, opened](const result<uint64_t>& ok) {
      if (!ok)
        return;
      store_state::upload up;
      up.writer = std::move(*opened);
      up.queue = std::make_shared<strand>(self->state.lanes.bulk);
      up.last_seen = self->clock().now();
      self->state.uploads.emplace(id, std::move(up));
    });
}

} // namespace

store_actor::behavior_type store_service(store_actor::stateful_pointer<store_state> self,
                                         std::shared_ptr<store_backend> backend, store_lanes lanes,
                                         store_options opts) {
  auto& init = self->state;
  init.backend = std::move(backend);
  init.lanes = std::move(lanes);
  init.opts = opts;
  // Every pointer move of the backend, whoever asked for it (this actor, or
  // a publisher on this node writing the backend directly), reaches the
  // listeners from here.
  init.observer = init.backend->observe_pointers(
    [addr = self->address()](const std::string& pool, const pointer_record& now) {
      if (auto h = caf::actor_cast<caf::actor>(addr))
        caf::anon_send(h, atom::pointer_moved_v, pool, now);
    });
  self->set_down_handler([self](const caf::down_msg& down) {
    for (auto& [pool, ls] : self->state.listeners)
      std::erase_if(ls,
                    [&](const pointer_listener_actor& a) { return a.address() == down.source; });
  });
  self->delayed_send(self, sweep_every, atom::tick_v);
  auto db = init.backend;
  auto& fast = *init.lanes.fast;
  auto& bulk = *init.lanes.bulk;
  return {
    [=, &fast](atom::read_pointer,
               const std::string& pool) -> caf::result<caf::optional<pointer_record>> {
      // An embedded store remembers its pointers: answered here, without
      // the two thread hops of the fast lane (a reconcile pass's pointer
      // read then waits on nothing but this actor).
      if (auto known = db->pointer_without_io(pool))
        return caf::optional<pointer_record>{std::move(*known)};
      return offload<caf::optional<pointer_record>>(
        self, self->state.jobs, fast, fast_lane_name,
        [db, pool]() -> result<caf::optional<pointer_record>> {
          auto p = db->read_pointer(pool);
          if (!p)
            return std::move(p).error();
          if (!*p)
            return caf::optional<pointer_record>{};
          return caf::optional<pointer_record>{**p};
        });
    },
    [=, &fast](atom::claim, const std::string& pool, const version_ref& boot,
               const std::string& token) -> caf::result<pointer_record> {
      if (auto no = without_token(self, token, "claiming a run"))
        return *no;
      return offload<pointer_record>(self, self->state.jobs, fast, fast_lane_name,
                                     [db, pool, boot] { return db->claim(pool, boot); });
    },
    [=, &fast](atom::advance, const std::string& pool, const caf::optional<version_ref>& expected,
               const version_ref& proposed,
               const std::string& token) -> caf::result<pointer_record> {
      if (auto no = without_token(self, token, "moving a pointer"))
        return *no;
      std::optional<version_ref> exp;
      if (expected)
        exp = *expected;
      return offload<pointer_record>(
        self, self->state.jobs, fast, fast_lane_name,
        [db, pool, exp, proposed] { return db->compare_and_advance_pointer(pool, exp, proposed); });
    },
    [=, &fast](atom::read_manifest, const std::string& pool, const version_ref& ref) {
      return offload<manifest>(self, self->state.jobs, fast, fast_lane_name,
                               [db, pool, ref] { return db->read_manifest(pool, ref); });
    },
    [self](atom::read_range, const std::string& pool, const version_ref& ref,
           const std::string& tensor, uint64_t offset,
           uint64_t len) { return on_read_range(self, pool, ref, tensor, offset, len); },
    [=, &fast](atom::list, const std::string& pool, const std::string& run) {
      return offload<std::vector<version_ref>>(
        self, self->state.jobs, fast, fast_lane_name,
        [db, pool, run] { return db->list_versions(pool, run); });
    },
    [self](atom::list_pools, const std::string& run) { return on_list_pools(self, run); },
    [self](atom::export_to, const std::string& pool, const version_ref& ref,
           const std::string& path, bool sync,
           const std::string& token) { return on_export_to(self, pool, ref, path, sync, token); },
    [=, &bulk](atom::retain, const std::string& pool, const retention_request& request,
               const std::string& token) -> caf::result<retention_report> {
      if (auto no = without_token(self, token, "retention"))
        return *no;
      return offload<retention_report>(self, self->state.jobs, bulk, bulk_lane_name,
                                       [db, pool, request] { return db->retain(pool, request); });
    },
    [self](atom::put_begin, const std::string& pool, const version_ref& ref,
           const std::string& token) { return on_put_begin(self, pool, ref, token); },
    [self](atom::put_shard, uint64_t id, const std::string& name, uint64_t size) {
      return on_upload<bool>(self, id, [name, size](store_state::upload& up) -> result<bool> {
        if (auto ok = up.writer->begin_shard(name, size); !ok)
          return std::move(ok).error();
        return true;
      });
    },
    [self](atom::put_chunk, uint64_t id, std::vector<char>& bytes) -> caf::result<uint64_t> {
      return on_put_chunk(self, id, bytes);
    },
    [self](atom::put_file, uint64_t id, const std::string& name, std::vector<char>& bytes)
      -> caf::result<bool> { return on_put_file(self, id, name, bytes); },
    [self](atom::put_end, uint64_t id, const manifest& m) { return on_put_end(self, id, m); },
    [self](atom::put_abort, uint64_t id) { end_upload(self, id); },
    [self](atom::subscribe, const std::string& pool, const pointer_listener_actor& listener) {
      // A relay renews subscriptions after the store's node restarted; one
      // listener is told once.
      auto& listeners = self->state.listeners[pool];
      if (std::find(listeners.begin(), listeners.end(), listener) != listeners.end())
        return;
      self->monitor(listener);
      listeners.push_back(listener);
    },
    [self](atom::pointer_moved, const std::string& pool, const pointer_record& now) {
      tell_listeners(self, pool, now);
    },
    // Internal: its lanes' ends and its sweep timer, from itself only (a
    // forged end would answer a request before its work ran).
    [self](atom::done, uint64_t id) {
      if (from_itself(self))
        self->state.jobs.complete(id);
    },
    [self](atom::tick) {
      if (from_itself(self))
        on_tick(self);
    },
  };
}

} // namespace stitch
