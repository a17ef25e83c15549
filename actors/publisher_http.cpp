#include "actors/publisher_http.hpp"

#include "runtime/core/base64.hpp"
#include "runtime/core/json_depth.hpp"

#include <caf/all.hpp>

#include <nlohmann/json.hpp>

#include <pthread.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <map>
#include <mutex>

#include "actors/log.hpp"
#include "actors/publisher_actor.hpp"
#include "runtime/core/safetensors.hpp"
#include "runtime/core/token.hpp"
#include "runtime/pipeline/pipeline.hpp"
#include "transport/http_router.hpp"

namespace stitch {

using transport::http_responder;
using transport::server_response;
using json = nlohmann::ordered_json;

namespace {

/// Tensors one session may declare.
constexpr size_t max_tensors = 1'000'000;

server_response refuse(http_failure why, std::string message) {
  return transport::error_response(why, std::move(message));
}

server_response failure(caf::actor_system& sys, const caf::error& err) {
  return transport::response_of(http_error_of(from_caf_error(sys, err)));
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json summary_json(const publisher_http::session_names& args, const pipeline::publish_report& s) {
  json j;
  j["pool"] = args.pool;
  j["run_id"] = args.run_id;
  j["version"] = args.version;
  j["ref"] =
    args.run_id.empty() ? json(nullptr) : json(to_string(version_ref{args.run_id, args.version}));
  j["kind"] = s.kind == version_kind::full ? "anchor" : "delta";
  j["reason_for_anchor"] = s.reason_for_anchor;
  j["raw_bytes"] = s.raw_bytes;
  j["encoded_bytes"] = s.encoded_bytes;
  j["stored_bytes"] = s.stored_bytes;
  j["touched"] = s.touched;
  j["idempotent"] = s.idempotent;
  j["claimed"] = s.claimed;
  j["pointer"] = s.pointer ? json(to_string(s.pointer->latest)) : json(nullptr);
  j["boot_version"] = s.pointer ? json(s.pointer->boot_version) : json(nullptr);
  return j;
}

/// A session's id from `/publish/<id>[/commit]`, or nullopt.
std::optional<uint64_t> session_of(std::string_view rest) {
  uint64_t id = 0;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), id);
  if (ec != std::errc{} || end != rest.data() + rest.size() || rest.empty())
    return std::nullopt;
  return id;
}

/// The open request's `files`: name -> the file's text (a JSON string, kept
/// as its UTF-8 bytes) or {"base64": "..."} for any bytes.
std::variant<std::map<std::string, std::string>, std::string> parse_files(const json& files) {
  std::map<std::string, std::string> out;
  if (!files.is_object())
    return std::string{"'files' must be an object of file name -> text or {\"base64\": ...}"};
  std::map<std::string, file_entry> sizes;
  for (const auto& [name, value] : files.items()) {
    const std::string at = "files[" + quote_untrusted(name) + "]";
    if (auto ok = validate_file_name(name); !ok)
      return at + ": " + ok.error().message;
    if (value.is_string()) {
      out[name] = value.get<std::string>();
    } else if (value.is_object() && value.size() == 1 && value.contains("base64")
               && value["base64"].is_string()) {
      auto bytes = base64_decode(value["base64"].get<std::string>());
      if (!bytes)
        return at + ".base64 is not padded base64 (RFC 4648)";
      out[name] = std::move(*bytes);
    } else {
      return at + " must be the file's text or {\"base64\": \"...\"}";
    }
    sizes[name] = file_entry{out[name].size(), 0};
  }
  if (auto ok = validate_files(sizes); !ok)
    return ok.error().message;
  return out;
}

/// What an open request asks for.
struct open_request {
  publish_args args;
  std::vector<pipeline::tensor_header> headers;
  /// `abort_on_disconnect`.
  bool bound = false;
};

/// The open request's body as publish arguments and tensor headers, or the
/// 400 naming what is wrong.
std::variant<open_request, server_response> parse_open(const std::string& body) {
  auto bad = [](std::string m) { return refuse(http_failure::bad_request, std::move(m)); };
  if (!json_nesting_within(body))
    return bad("the body nests JSON deeper than " + std::to_string(max_json_depth) + " levels");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    // The parser's own text quotes the bytes it read: name the place instead.
    bool utf8 = std::string_view{e.what()}.find("UTF-8") != std::string_view::npos;
    return bad(std::string{utf8 ? "the body is not valid UTF-8" : "the body is not valid JSON"}
               + " (at byte " + std::to_string(e.byte) + ")");
  }
  if (!j.is_object())
    return bad("the body is not a JSON object");
  publish_args args;
  if (j.contains("pool")) {
    if (!j["pool"].is_string() || !transport::valid_pool_name(j["pool"].get<std::string>()))
      return bad("'pool' must be a pool name ([A-Za-z0-9._-], at most 64)");
    args.pool = j["pool"].get<std::string>();
  }
  if (!j.contains("run_id") || !j["run_id"].is_string() || j["run_id"].get<std::string>().empty())
    return bad("'run_id' must be a non-empty string");
  args.run_id = j["run_id"].get<std::string>();
  if (!j.contains("version") || !j["version"].is_number_unsigned())
    return bad("'version' must be a non-negative integer");
  args.version = j["version"].get<uint64_t>();
  if (j.contains("anchor")) {
    if (!j["anchor"].is_boolean())
      return bad("'anchor' must be true or false");
    args.force_anchor = j["anchor"].get<bool>();
  }
  bool bound = false;
  if (j.contains("abort_on_disconnect")) {
    if (!j["abort_on_disconnect"].is_boolean())
      return bad("'abort_on_disconnect' must be true or false");
    bound = j["abort_on_disconnect"].get<bool>();
  }
  if (j.contains("files")) {
    auto files = parse_files(j["files"]);
    if (auto* why = std::get_if<std::string>(&files))
      return bad(std::move(*why));
    args.files = std::get<0>(std::move(files));
  }
  if (!j.contains("tensors") || !j["tensors"].is_array() || j["tensors"].empty())
    return bad("'tensors' must be a non-empty array of {name, dtype, shape}");
  if (j["tensors"].size() > max_tensors)
    return bad("'tensors' lists more than " + std::to_string(max_tensors) + " tensors");
  std::vector<pipeline::tensor_header> headers;
  headers.reserve(j["tensors"].size());
  for (const auto& t : j["tensors"]) {
    const std::string at = "tensors[" + std::to_string(headers.size()) + "]";
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("dtype")
        || !t["dtype"].is_string() || !t.contains("shape") || !t["shape"].is_array())
      return bad(at + " must be {\"name\": string, \"dtype\": string, \"shape\": [int]}");
    pipeline::tensor_header h;
    h.name = t["name"].get<std::string>();
    auto type = safetensors::parse_dtype(t["dtype"].get<std::string>());
    if (!type)
      return bad(at + " ('" + h.name + "'): " + type.error().message);
    h.type = *type;
    if (t["shape"].size() > safetensors::max_rank)
      return bad(at + " ('" + h.name + "'): more than " + std::to_string(safetensors::max_rank)
                 + " dimensions");
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned())
        return bad(at + " ('" + h.name + "'): shape entries must be non-negative integers");
      h.shape.push_back(d.get<uint64_t>());
    }
    auto bytes = safetensors::byte_length(h.type, h.shape);
    if (!bytes)
      return bad(at + " ('" + h.name + "'): " + bytes.error().message);
    h.size = *bytes;
    if (!headers.empty() && !(headers.back().name < h.name))
      return bad(at + " ('" + h.name + "'): tensors must be listed in ascending name order, "
                 + "each once");
    headers.push_back(std::move(h));
  }
  return open_request{std::move(args), std::move(headers), bound};
}

/// Pieces of one request in flight to the publisher at once: the publish
/// thread finds the next piece queued when it finishes one, instead of idling
/// for a round trip through the actors per piece.
constexpr size_t feed_window = 3;

/// Hands `body` to session `id` in pieces of at most `max_chunk_bytes`, in
/// order, up to `feed_window` of them in flight (the publisher answers each
/// once consumed). `handed` runs once, when the last piece was sent (or with
/// the error that stopped the feed before); `done` runs once, with nothing or
/// the first error, when all are consumed or one failed.
void feed(caf::actor_system& sys, const caf::actor& publisher, uint64_t id, shared_piece body,
          std::function<void(std::optional<server_response>)> handed,
          std::function<void(std::optional<server_response>)> done) {
  struct progress {
    shared_piece body;
    size_t sent = 0;
    size_t consumed = 0;
    size_t in_flight = 0;
    bool handed = false;
    bool finished = false;
  };
  sys.spawn(
    [publisher, id, handed = std::move(handed), done = std::move(done),
     st = std::make_shared<progress>(progress{std::move(body)})](caf::event_based_actor* self) {
      auto fail = [self, handed, done, st](std::optional<server_response> err) {
        if (st->finished)
          return;
        st->finished = true;
        if (!st->handed) {
          st->handed = true;
          handed(err);
        }
        done(std::move(err));
        self->quit();
      };
      auto pump = std::make_shared<std::function<void()>>();
      *pump = [self, publisher, id, handed, done, st, pump, fail] {
        while (!st->finished && st->in_flight < feed_window && st->sent < st->body.size) {
          const size_t n = std::min<size_t>(max_chunk_bytes, st->body.size - st->sent);
          // The body's own bytes, shared: no copy on the way to the publisher.
          shared_piece piece{st->body.owner, st->body.data + st->sent, n};
          st->sent += n;
          ++st->in_flight;
          self->request(publisher, std::chrono::minutes{2}, atom::chunk_v, id, std::move(piece))
            .then(
              [self, done, st, n, pump](uint64_t) {
                --st->in_flight;
                st->consumed += n;
                if (st->finished)
                  return;
                if (st->consumed == st->body.size) {
                  st->finished = true;
                  done(std::nullopt);
                  *pump = nullptr; // break the cycle
                  self->quit();
                  return;
                }
                (*pump)();
              },
              [self, st, pump, fail](caf::error& err) {
                --st->in_flight;
                *pump = nullptr;
                fail(failure(self->system(), err));
              });
          // Every piece is in the publisher's mailbox, in order: the next PUT
          // of the session may follow at once.
          if (st->sent == st->body.size && !st->handed) {
            st->handed = true;
            handed(std::nullopt);
          }
        }
      };
      (*pump)();
    });
}

/// Asks the publisher `xs...` and answers with `render(reply)`, or with the
/// error it gave as the HTTP error of its kind.
template <class Reply, class Render, class... Ts>
void answer_with(caf::actor_system& sys, const publisher_actor& publisher, caf::timespan timeout,
                 std::shared_ptr<http_responder> out, Render render, Ts... xs) {
  // The arguments (a publish's files among them) are moved, not copied.
  sys.spawn([publisher, timeout, out, render,
             ... xs = std::move(xs)](caf::event_based_actor* self) mutable {
    self->request(publisher, timeout, std::move(xs)...)
      .then(
        [self, out, render](Reply& reply) {
          out->send(render(reply));
          self->quit();
        },
        [self, out](caf::error& err) {
          out->send(failure(self->system(), err));
          self->quit();
        });
  });
}

/// The bearer token a request carries ("" when none).
std::string bearer_of(const transport::server_request& req) {
  if (const auto* given = req.header("Authorization"); given && given->starts_with("Bearer "))
    return given->substr(7);
  return {};
}

/// Aborts publish session `id` whose client went away: with one of its PUTs
/// unanswered or cut off, it can never learn how far its bytes got; with
/// its bound connection closed, it is gone. The session's slot and its
/// pool's publish queue are freed now instead of after
/// `publisher.session_idle_timeout`.
void abort_abandoned(const caf::actor& publisher, uint64_t id, const char* how) {
  log::warn("publisher", "the client of publish session " + std::to_string(id) + " went away " + how
                           + "; aborting the session");
  caf::anon_send(publisher, atom::abort_v, id);
}

} // namespace

transport::http_server_options
publisher_http::server_options(transport::http_server_options o, caf::actor publisher,
                               std::string admin_token, std::shared_ptr<session_table> table) {
  // Tensor bytes as they arrive (no zero-fill, no copy): they go to the
  // publish as they are.
  o.raw_large_bodies = true;
  // Receiving a publish's body is bulk work, as the publish that consumes
  // it: on a machine that also serves, pointer reads, claims and requests
  // go first (at the default priority, the thread receiving a streamed
  // 1 GB publish held a core for up to 0.6 ms at a time while a pointer
  // read waited for it). Named, for `top -H` and `perf`.
  o.thread_setup = [] {
    ::pthread_setname_np(::pthread_self(), "publisher-http");
    pipeline::run_as_background_thread();
  };
  // A `PUT /publish/<id>` whose body was cut off aborts its session (under
  // the same token rule as `DELETE`).
  o.abandoned = [publisher = std::move(publisher), admin_token = std::move(admin_token),
                 table = std::move(table)](const transport::server_request& head) {
    if (head.method != "PUT" || !head.path.starts_with("/publish/"))
      return;
    if (!admin_token.empty() && !token_matches(admin_token, bearer_of(head)))
      return;
    if (auto id =
          session_of(std::string_view{head.path}.substr(std::string_view{"/publish/"}.size()));
        id && table->abandon(*id))
      abort_abandoned(publisher, *id, "in the middle of a PUT's body");
  };
  return o;
}

publisher_http::publisher_http(caf::actor_system& sys, caf::actor publisher,
                               publisher_http_options options)
    : publisher_http(sys, std::move(publisher), std::move(options),
                     std::make_shared<session_table>()) {}

publisher_http::publisher_http(caf::actor_system& sys, caf::actor publisher,
                               publisher_http_options options, std::shared_ptr<session_table> table)
    : http_surface(sys, publisher,
                   server_options(options.server, publisher, options.admin_token, table)),
      admin_token_(std::move(options.admin_token)), table_(std::move(table)) {}

publisher_http::~publisher_http() {
  stop();
}

void publisher_http::session_table::remember(uint64_t session, session_names names,
                                             uint64_t expects, std::optional<uint64_t> bound_to) {
  std::lock_guard lock{mutex};
  auto& st = sessions[session];
  st.names = std::move(names);
  st.expects = expects;
  st.bound_to = bound_to;
  // Sessions a client opened and never ended expire at the publisher; their
  // names here are dropped oldest first.
  while (sessions.size() > 4096)
    sessions.erase(sessions.begin());
}

publisher_http::session_names publisher_http::session_table::forget(uint64_t session) {
  std::lock_guard lock{mutex};
  auto it = sessions.find(session);
  if (it == sessions.end())
    return {};
  auto names = std::move(it->second.names);
  sessions.erase(it);
  return names;
}

bool publisher_http::session_table::abandon_locked(uint64_t session) {
  sessions.erase(session);
  if (std::find(abandoned.begin(), abandoned.end(), session) != abandoned.end())
    return false;
  abandoned.push_back(session);
  if (abandoned.size() > 256)
    abandoned.pop_front();
  return true;
}

bool publisher_http::session_table::abandon(uint64_t session) {
  std::lock_guard lock{mutex};
  return abandon_locked(session);
}

std::vector<uint64_t> publisher_http::session_table::abandon_bound_to(uint64_t connection) {
  // Under one lock: a commit that unbinds a session cannot slip in between
  // finding it bound and abandoning it.
  std::lock_guard lock{mutex};
  std::vector<uint64_t> bound;
  for (const auto& [id, st] : sessions)
    if (st.bound_to == connection)
      bound.push_back(id);
  std::erase_if(bound, [this](uint64_t id) { return !abandon_locked(id); });
  return bound;
}

void publisher_http::watch_connection(std::shared_ptr<session_table> table, caf::actor publisher,
                                      const std::shared_ptr<http_responder>& out) {
  out->on_client_close([table = std::move(table), publisher = std::move(publisher),
                        connection = out->connection()] {
    for (uint64_t id : table->abandon_bound_to(connection))
      abort_abandoned(publisher, id, "between requests (its connection closed before the commit)");
  });
}

void publisher_http::session_table::when_reached(
  uint64_t session, mark which, uint64_t count,
  std::function<void(std::optional<server_response>)> f) {
  std::unique_lock lock{mutex};
  auto it = sessions.find(session);
  if (it == sessions.end() || it->second.count(which) >= count) {
    std::optional<server_response> err;
    if (it != sessions.end())
      err = it->second.error;
    lock.unlock();
    f(std::move(err));
    return;
  }
  it->second.waiting.push_back({which, count, std::move(f)});
}

void publisher_http::session_table::reached(uint64_t session, mark which,
                                            std::optional<server_response> err) {
  std::vector<std::function<void(std::optional<server_response>)>> ready;
  std::optional<server_response> first_error;
  {
    std::lock_guard lock{mutex};
    auto it = sessions.find(session);
    if (it == sessions.end())
      return;
    auto& st = it->second;
    ++st.count(which);
    if (err && !st.error)
      st.error = std::move(err);
    first_error = st.error;
    std::erase_if(st.waiting, [&](waiter& w) {
      if (w.count > st.count(w.which))
        return false;
      ready.push_back(std::move(w.f));
      return true;
    });
  }
  for (auto& f : ready)
    f(first_error);
}

void publisher_http::put(uint64_t id, shared_piece body, std::shared_ptr<http_responder> out) {
  uint64_t index = 0, remaining = 0;
  bool bound = false;
  const uint64_t size = body.size;
  {
    std::lock_guard lock{table_->mutex};
    auto it = table_->sessions.find(id);
    if (it != table_->sessions.end()) {
      auto& st = it->second;
      // Requests of a session sent without waiting for answers (several
      // connections) would each hold their body here: two at most.
      if (st.sent - st.consumed >= 2) {
        out->send(refuse(http_failure::bad_request,
                         "publish session " + std::to_string(id)
                           + " has two requests in flight already; send the next once one is "
                             "answered"));
        return;
      }
      index = ++st.sent;
      st.received += size;
      remaining = st.expects > st.received ? st.expects - st.received : 0;
      if (st.bound_to) {
        st.bound_to = out->connection();
        bound = true;
      }
    }
  }
  if (bound)
    watch_connection(table_, target_, out);
  // A client gone before this PUT is answered aborts the session.
  out->on_disconnect([table = table_, publisher = target_, id] {
    if (table->abandon(id))
      abort_abandoned(publisher, id, "before its PUT was answered");
  });
  if (index == 0) {
    // A session this surface did not open: one request at a time.
    feed(
      sys_, target_, id, std::move(body), [](std::optional<server_response>) {},
      [out, size](std::optional<server_response> err) {
        if (err) {
          out->send(std::move(*err));
          return;
        }
        server_response r;
        r.body = dump(json{{"received", size}});
        out->send(std::move(r));
      });
    return;
  }
  // This PUT's bytes go to the publisher once the earlier PUTs' were all
  // handed on, so the pieces of two PUTs never interleave in the session's
  // stream and the publish finds the next PUT's pieces queued when it ends
  // one. It is answered once the earlier PUTs were consumed, so the client
  // uploads the next while the publisher consumes this one (two requests of
  // a session in memory at most).
  auto handed = [table = table_, id](std::optional<server_response> err) {
    table->reached(id, mark::fed, std::move(err));
  };
  auto consumed = [table = table_, id](std::optional<server_response> err) {
    table->reached(id, mark::consumed, std::move(err));
  };
  table_->when_reached(id, mark::fed, index - 1,
                       [sys = &sys_, target = target_, id, bytes = std::move(body), handed,
                        consumed](std::optional<server_response> err) mutable {
                         if (err) {
                           // Nothing fed; the session's error stands.
                           handed(std::nullopt);
                           consumed(std::nullopt);
                           return;
                         }
                         feed(*sys, target, id, std::move(bytes), handed, consumed);
                       });
  table_->when_reached(id, mark::consumed, index - 1,
                       [out, size, remaining](std::optional<server_response> err) {
                         if (err) {
                           out->send(std::move(*err));
                           return;
                         }
                         json j;
                         j["received"] = size;
                         j["remaining"] = remaining;
                         server_response r;
                         r.body = dump(j);
                         out->send(std::move(r));
                       });
}

void publisher_http::handle(transport::server_request req, std::shared_ptr<http_responder> out) {
  if (req.path == "/health") {
    server_response r;
    r.body = R"({"ok":true})";
    out->send(std::move(r));
    return;
  }
  if (req.path != "/publish" && !req.path.starts_with("/publish/")) {
    out->send(refuse(http_failure::not_found,
                     "the publisher serves /publish, /publish/<session>[/commit] and /health"));
    return;
  }
  const std::string token = bearer_of(req);
  if (!admin_token_.empty() && !token_matches(admin_token_, token)) {
    out->send(
      refuse(http_failure::unauthorized, "publishing needs Authorization: Bearer <admin token>"));
    return;
  }
  auto method_not_allowed = [&](const std::string& allowed) {
    auto r = refuse(http_failure::method_not_allowed, req.path + " takes " + allowed);
    r.headers.push_back({"Allow", allowed});
    out->send(std::move(r));
  };
  auto publisher = caf::actor_cast<publisher_actor>(target_);
  if (req.path == "/publish") {
    if (req.method != "POST")
      return method_not_allowed("POST");
    auto parsed = parse_open(req.body);
    if (auto* r = std::get_if<server_response>(&parsed)) {
      out->send(std::move(*r));
      return;
    }
    auto [args, headers, bound] = std::get<0>(std::move(parsed));
    args.token = token;
    uint64_t expects = 0;
    for (const auto& h : headers)
      expects += h.size;
    const uint64_t max_request = body_limit();
    // The answer needs the names only, not the files the arguments carry.
    auto render = [out, bound, target = target_, table = table_, expects, max_request,
                   names = session_names{args.pool, args.run_id, args.version}](uint64_t session) {
      table->remember(session, names, expects,
                      bound ? std::optional<uint64_t>{out->connection()} : std::nullopt);
      if (bound)
        watch_connection(table, target, out);
      json j;
      j["session"] = session;
      j["expects_bytes"] = expects;
      j["max_request_bytes"] = max_request;
      server_response r;
      r.status = 201;
      r.body = dump(j);
      return r;
    };
    answer_with<uint64_t>(sys_, publisher, std::chrono::seconds{30}, std::move(out), render,
                          atom::publish_v, std::move(args), std::move(headers));
    return;
  }
  std::string_view rest{req.path};
  rest.remove_prefix(std::string_view{"/publish/"}.size());
  const bool commit = rest.ends_with("/commit");
  if (commit)
    rest.remove_suffix(std::string_view{"/commit"}.size());
  auto id = session_of(rest);
  if (!id) {
    out->send(refuse(http_failure::not_found, "no publish session named '" + std::string{rest}
                                                + "' (sessions are numbers)"));
    return;
  }
  if (commit) {
    if (req.method != "POST")
      return method_not_allowed("POST");
    // Every request's bytes are consumed before the publish may end.
    uint64_t sent = 0;
    {
      std::lock_guard lock{table_->mutex};
      if (auto it = table_->sessions.find(*id); it != table_->sessions.end()) {
        sent = it->second.sent;
        // Committed: it ends as the publish does, client or not.
        it->second.bound_to.reset();
      }
    }
    table_->when_reached(
      *id, mark::consumed, sent,
      [table = table_, sys = &sys_, publisher, id = *id, out](std::optional<server_response> bad) {
        auto args = table->forget(id);
        if (bad) {
          caf::anon_send(publisher, atom::abort_v, id);
          out->send(std::move(*bad));
          return;
        }
        answer_with<pipeline::publish_report>(
          *sys, publisher, std::chrono::minutes{30}, out,
          [args](const pipeline::publish_report& s) {
            server_response r;
            r.body = dump(summary_json(args, s));
            return r;
          },
          atom::finish_v, id);
      });
    return;
  }
  if (req.method == "PUT") {
    if (req.raw_body) {
      // A large body, as it arrived.
      const char* data = req.raw_body.get();
      put(*id, shared_piece{std::move(req.raw_body), data, req.raw_body_size}, std::move(out));
      return;
    }
    if (req.body.empty()) {
      out->send(refuse(http_failure::bad_request, "a PUT carries the session's next bytes"));
      return;
    }
    auto owned = std::make_shared<const std::string>(std::move(req.body));
    const char* data = owned->data();
    const size_t size = owned->size();
    put(*id, shared_piece{std::move(owned), data, size}, std::move(out));
    return;
  }
  if (req.method == "DELETE") {
    table_->forget(*id);
    caf::anon_send(publisher, atom::abort_v, *id);
    json j;
    j["session"] = *id;
    j["aborted"] = true;
    server_response r;
    r.body = dump(j);
    out->send(std::move(r));
    return;
  }
  method_not_allowed("PUT, DELETE");
}

} // namespace stitch
