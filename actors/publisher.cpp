#include "actors/publisher.hpp"

#include <caf/all.hpp>

#include <cstring>

#include "runtime/core/safetensors.hpp"
#include "runtime/core/token.hpp"
#include "runtime/engine/model_config.hpp"
#include "runtime/engine/weights.hpp"
#include "runtime/store/hf_directory.hpp"

namespace stitch {

namespace {

store::publish_request to_request(const publish_args& args) {
  store::publish_request r;
  r.pool = args.pool;
  r.run_id = args.run_id;
  r.version = args.version;
  r.force_anchor = args.force_anchor;
  r.dry_run = args.dry_run;
  return r;
}

caf::result<publish_summary> run_publish(publisher_actor::stateful_pointer<publisher_state> self,
                                         const publish_args& args,
                                         const store::tensor_set& weights) {
  auto report = self->state.impl->publish(to_request(args), weights);
  if (!report)
    return to_caf_error(report.error());
  if (!args.dry_run && self->state.store)
    caf::anon_send(self->state.store, atom::notify_v, args.pool);
  return summarize(*report);
}

} // namespace

publish_summary summarize(const store::publish_report& report) {
  publish_summary s;
  s.kind = std::string{to_string(report.kind)};
  s.touched = report.touched;
  s.raw_bytes = report.raw_bytes;
  s.encoded_bytes = report.encoded_bytes;
  s.stored_bytes = report.stored_bytes;
  s.idempotent = report.idempotent;
  s.claimed = report.claimed;
  if (report.pointer)
    s.pointer = *report.pointer;
  s.reason_for_anchor = report.reason_for_anchor;
  return s;
}

namespace {

/// A node with an admin token refuses publishes without it (constant time).
status authorized(const publisher_state& st, const publish_args& args) {
  if (!token_matches(st.admin_token, args.token))
    return error{errc::unauthorized, "publishing needs the admin token (--token or STITCH_TOKEN)"};
  return {};
}

} // namespace

publisher_actor::behavior_type
publisher_service(publisher_actor::stateful_pointer<publisher_state> self,
                  std::shared_ptr<store_backend> backend, store_actor store,
                  store::publisher_options options, std::string admin_token) {
  self->state.admin_token = std::move(admin_token);
  self->state.backend = std::move(backend);
  self->state.impl = std::make_unique<store::publisher>(*self->state.backend, options);
  self->state.store = std::move(store);
  return {
    [self](atom::publish, const publish_args& args,
           const std::string& path) -> caf::result<publish_summary> {
      if (auto ok = authorized(self->state, args); !ok)
        return to_caf_error(ok.error());
      auto weights = store::load_hf_directory(path);
      if (!weights)
        return to_caf_error(weights.error());
      return run_publish(self, args, *weights);
    },
    [self](atom::init_model, const publish_args& args, const std::string& preset,
           uint64_t seed) -> caf::result<publish_summary> {
      if (auto ok = authorized(self->state, args); !ok)
        return to_caf_error(ok.error());
      auto config = engine::preset(preset);
      if (!config)
        return to_caf_error(config.error());
      auto weights = engine::random_init(*config, seed);
      if (!weights)
        return to_caf_error(weights.error());
      return run_publish(self, args, *weights);
    },
    [self](atom::publish, const publish_args& args) -> caf::result<uint64_t> {
      if (auto ok = authorized(self->state, args); !ok)
        return to_caf_error(ok.error());
      const auto now = std::chrono::steady_clock::now();
      std::erase_if(self->state.sessions, [&](const auto& kv) {
        return now - kv.second.last_seen > self->state.session_idle_timeout;
      });
      if (self->state.sessions.size() >= self->state.max_sessions)
        return to_caf_error({errc::limit_exceeded, "too many publishes in progress"});
      if (auto ok = validate_run_id(args.run_id); !ok)
        return to_caf_error(ok.error());
      auto id = self->state.next_session++;
      auto& session = self->state.sessions[id];
      session.args = args;
      session.last_seen = now;
      return id;
    },
    [self](atom::tensor, uint64_t id, const std::string& name, const std::string& dtype,
           const std::vector<uint64_t>& shape) -> caf::result<uint64_t> {
      auto it = self->state.sessions.find(id);
      if (it == self->state.sessions.end())
        return to_caf_error({errc::not_found, "no publish session " + std::to_string(id)});
      auto& s = it->second;
      s.last_seen = std::chrono::steady_clock::now();
      auto fail = [&](error err) -> caf::result<uint64_t> {
        self->state.sessions.erase(it);
        return to_caf_error(err);
      };
      if (s.remaining != 0)
        return fail({errc::invalid_argument, "tensor '" + s.current + "' is still missing "
                                               + std::to_string(s.remaining) + " bytes"});
      if (auto ok = validate_tensor_name(name); !ok)
        return fail(ok.error());
      if (s.weights.contains(name))
        return fail({errc::invalid_argument, "tensor '" + name + "' was sent twice"});
      auto type = safetensors::parse_dtype(dtype);
      if (!type)
        return fail(type.error());
      auto size = safetensors::byte_length(*type, shape);
      if (!size)
        return fail(size.error());
      if (*size > self->state.max_session_bytes - s.received)
        return fail({errc::limit_exceeded, "the publish session exceeds "
                                             + std::to_string(self->state.max_session_bytes)
                                             + " bytes"});
      auto& t = s.weights[name];
      t.name = name;
      t.type = *type;
      t.shape = shape;
      s.current = name;
      s.remaining = *size;
      return *size;
    },
    [self](atom::chunk, uint64_t id, const std::vector<char>& bytes) -> caf::result<uint64_t> {
      auto it = self->state.sessions.find(id);
      if (it == self->state.sessions.end())
        return to_caf_error({errc::not_found, "no publish session " + std::to_string(id)});
      auto& s = it->second;
      s.last_seen = std::chrono::steady_clock::now();
      if (bytes.size() > s.remaining || bytes.size() > max_chunk_bytes) {
        auto current = s.current;
        self->state.sessions.erase(it);
        return to_caf_error(
          {errc::invalid_argument, "more bytes than tensor '" + current + "' holds"});
      }
      auto& t = s.weights[s.current].bytes;
      auto at = t.size();
      t.resize(at + bytes.size());
      std::memcpy(t.data() + at, bytes.data(), bytes.size());
      s.remaining -= bytes.size();
      s.received += bytes.size();
      return s.remaining;
    },
    [self](atom::finish, uint64_t id) -> caf::result<publish_summary> {
      auto it = self->state.sessions.find(id);
      if (it == self->state.sessions.end())
        return to_caf_error({errc::not_found, "no publish session " + std::to_string(id)});
      auto s = std::move(it->second);
      self->state.sessions.erase(it);
      if (s.remaining != 0)
        return to_caf_error({errc::invalid_argument, "tensor '" + s.current + "' is missing "
                                                       + std::to_string(s.remaining) + " bytes"});
      if (s.weights.empty())
        return to_caf_error({errc::invalid_argument, "the publish sent no tensors"});
      return run_publish(self, s.args, s.weights);
    },
  };
}

} // namespace stitch
