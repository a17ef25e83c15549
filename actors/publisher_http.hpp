#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "actors/http_front.hpp"
#include "actors/publisher_actor.hpp"

namespace stitch {

struct publisher_http_options {
  transport::http_server_options server;
  /// When set, every request must carry `Authorization: Bearer <token>`.
  std::string admin_token;
};

/// The publisher's HTTP surface (DESIGN §5 "Publisher", `publisher.listen`):
/// a publish session over HTTP, for trainers that are not CAF clients.
///
///   POST   /publish                 {"pool", "run_id", "version", "anchor",
///                                    "tensors": [{"name", "dtype", "shape"}],
///                                    "files": {"config.json": "<text>",
///                                              "tokenizer.model":
///                                                {"base64": "..."}}}
///                                   (`files`, optional: the checkpoint's
///                                   non-tensor files, kept with the version;
///                                   `"abort_on_disconnect": true`, optional:
///                                   see below)
///                                   → 201 {"session", "expects_bytes",
///                                          "max_request_bytes"}
///   PUT    /publish/<id>            the next bytes of the tensors, in the
///                                   order listed, as they lie in a
///                                   safetensors file (at most
///                                   `max_request_bytes` per request)
///                                   → {"received", "remaining"}
///   POST   /publish/<id>/commit     → what was published (version ref, anchor
///                                   or delta, bytes, touched tensors)
///   DELETE /publish/<id>            → nothing of it becomes visible
///   GET    /health
///
/// The same rules as `stitch publish` (claim, idempotent re-publish,
/// `VersionExists`, rewind refused, durable before visible); each PUT is
/// answered once the publisher consumed its bytes (back-pressure, bounded
/// memory per session); a session silent for the publisher's idle timeout is
/// dropped and leaves nothing visible. Every refusal is a JSON error naming
/// the problem.
///
/// A client that goes away with a PUT unanswered or cut off aborts its
/// session at once. One that goes away between requests cannot be told from
/// one that will reconnect, unless it opened the session with
/// `"abort_on_disconnect": true`: then the session is bound to the
/// connection of its latest request, and the client closing that connection
/// before the commit (a process killed, a reset) aborts it at once. A close
/// by the server (its idle timeout) does not, and the next request on
/// another connection binds the session to that one. For clients that keep
/// one connection open for the session (`stitch publish --stream`), not for
/// those behind a proxy that opens a connection per request.
class publisher_http final : public http_surface {
public:
  publisher_http(caf::actor_system& sys, caf::actor publisher, publisher_http_options options);
  ~publisher_http() override;

  /// What a session publishes, for its commit's answer.
  struct session_names {
    std::string pool;
    std::string run_id;
    uint64_t version = 0;
  };

private:
  void handle(transport::server_request req,
              std::shared_ptr<transport::http_responder> out) override;
  /// Feeds one PUT's bytes to the publisher and answers it.
  void put(uint64_t id, shared_piece body, std::shared_ptr<transport::http_responder> out);
  /// How far a session's PUTs went: all their pieces handed to the
  /// publisher, or consumed by it.
  enum class mark { fed, consumed };

  struct waiter {
    mark which = mark::consumed;
    uint64_t count = 0;
    std::function<void(std::optional<transport::server_response>)> f;
  };
  /// A session this surface opened.
  struct session_state {
    session_names names;
    /// Opened with `abort_on_disconnect` and not yet committed: the
    /// connection of its latest request.
    std::optional<uint64_t> bound_to;
    uint64_t expects = 0;
    uint64_t received = 0;
    /// PUTs received; handed on to the publisher; consumed by it.
    uint64_t sent = 0;
    uint64_t fed = 0;
    uint64_t consumed = 0;
    uint64_t& count(mark which) { return which == mark::fed ? fed : consumed; }
    std::optional<transport::server_response> error;
    std::vector<waiter> waiting;
  };

  /// The sessions this surface opened. Shared with the callbacks that
  /// answer PUTs and commits, which may run after the surface is gone (a
  /// node stopping in the middle of a publish).
  struct session_table {
    std::mutex mutex;
    std::map<uint64_t, session_state> sessions;
    /// Sessions given up because their client went away, newest last (a
    /// few hundred): each is aborted and logged once, whichever way the
    /// server heard of it first.
    std::deque<uint64_t> abandoned;

    void remember(uint64_t session, session_names names, uint64_t expects,
                  std::optional<uint64_t> bound_to);
    session_names forget(uint64_t session);
    /// Forgets `session`, whose client went away; false when that was
    /// heard of already.
    bool abandon(uint64_t session);
    /// `abandon` with `mutex` held.
    bool abandon_locked(uint64_t session);
    /// Forgets and answers the uncommitted sessions bound to `connection`,
    /// whose client closed it.
    std::vector<uint64_t> abandon_bound_to(uint64_t connection);
    /// Runs `f` (with the session's first error, if any) once `count` of its
    /// PUTs reached `which` (at once if they did, or the session is gone).
    void when_reached(uint64_t session, mark which, uint64_t count,
                      std::function<void(std::optional<transport::server_response>)> f);
    /// One more PUT of `session` reached `which` (`err`: how it failed).
    void reached(uint64_t session, mark which, std::optional<transport::server_response> err);
  };

  publisher_http(caf::actor_system& sys, caf::actor publisher, publisher_http_options options,
                 std::shared_ptr<session_table> table);
  /// The server's options with the hook that aborts a session whose PUT's
  /// body was cut off.
  static transport::http_server_options server_options(transport::http_server_options o,
                                                       caf::actor publisher,
                                                       std::string admin_token,
                                                       std::shared_ptr<session_table> table);
  /// Aborts the sessions bound to the connection `out`'s request came on
  /// when its client closes it.
  static void watch_connection(std::shared_ptr<session_table> table, caf::actor publisher,
                               const std::shared_ptr<transport::http_responder>& out);

  std::string admin_token_;
  std::shared_ptr<session_table> table_;
};

} // namespace stitch
