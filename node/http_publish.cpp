#include "node/http_publish.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>

#include "node/cli.hpp"
#include "runtime/core/base64.hpp"
#include "runtime/core/http_errors.hpp"
#include "runtime/core/version_ref.hpp"

namespace stitch::node {

namespace {

using json = nlohmann::json;

/// Waiting for a `PUT`'s answer: it comes once the request before it was
/// consumed, which a slow store can delay (the CLI's CAF requests wait as long).
constexpr std::chrono::milliseconds put_timeout = std::chrono::minutes{10};
/// Waiting for the commit's answer (the publisher's own limit for it).
constexpr std::chrono::milliseconds commit_timeout = std::chrono::minutes{30};

std::string body_text(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

/// The open request: names, files and tensor headers (DESIGN §5).
std::string open_body(const publish_args& args,
                      const std::vector<pipeline::tensor_header>& tensors) {
  json j;
  j["pool"] = args.pool;
  j["run_id"] = args.run_id;
  j["version"] = args.version;
  j["anchor"] = args.force_anchor;
  // The CLI keeps its one connection for the session: if it dies (killed,
  // or its connection cut) the session is aborted the moment the node sees
  // the connection close, also between requests.
  j["abort_on_disconnect"] = true;
  json files = json::object();
  for (const auto& [name, bytes] : args.files)
    files[name] = json{{"base64", base64_encode(bytes)}};
  j["files"] = std::move(files);
  json list = json::array();
  for (const auto& t : tensors)
    list.push_back(json{{"name", t.name},
                        {"dtype", std::string{safetensors::to_string(t.type)}},
                        {"shape", t.shape}});
  j["tensors"] = std::move(list);
  return body_text(j);
}

/// An error answer as the domain error it stands for, naming the surface.
error refused(const transport::http_endpoint& at, const std::string& what,
              const transport::http_response& r) {
  std::string type;
  std::string message;
  try {
    auto j = json::parse(r.body);
    if (j.is_object() && j.contains("type") && j["type"].is_string())
      type = j["type"].get<std::string>();
    if (j.is_object() && j.contains("message") && j["message"].is_string())
      message = j["message"].get<std::string>();
  } catch (const json::exception&) {
  }
  if (message.empty())
    message = r.body.substr(0, 200);
  return {errc_of_http_answer(static_cast<uint16_t>(r.status), type),
          "the publisher at " + at.to_string() + " refused " + what + " ("
            + std::to_string(r.status) + (type.empty() ? "" : " " + type) + "): " + message};
}

/// A request that got no answer: the node died, restarted or stopped
/// answering (the same kind of error as a CAF link that dropped).
error went_away(const transport::http_endpoint& at, uint64_t session, const error& cause) {
  if (cause.code != errc::backend_failure)
    return cause; // ours (a file cut off under us), not the node's
  return {errc::engine_unavailable,
          "the publisher at " + at.to_string() + " went away in the middle of publish session "
            + std::to_string(session) + " (its node is down or restarting); retry. "
            + cause.message};
}

result<pipeline::publish_report> parse_summary(const std::string& body) {
  try {
    auto j = json::parse(body);
    pipeline::publish_report s;
    s.kind = j.at("kind").get<std::string>() == "delta" ? version_kind::delta : version_kind::full;
    s.touched = j.at("touched").get<std::vector<std::string>>();
    s.raw_bytes = j.at("raw_bytes").get<uint64_t>();
    s.encoded_bytes = j.at("encoded_bytes").get<uint64_t>();
    s.stored_bytes = j.at("stored_bytes").get<uint64_t>();
    s.idempotent = j.at("idempotent").get<bool>();
    s.claimed = j.value("claimed", false);
    s.reason_for_anchor = j.value("reason_for_anchor", std::string{});
    if (j.contains("pointer") && j["pointer"].is_string()) {
      auto latest = parse_required_version_ref(j["pointer"].get<std::string>());
      if (!latest)
        return std::move(latest).error();
      pointer_record p;
      p.latest = std::move(*latest);
      if (j.contains("boot_version") && j["boot_version"].is_number_unsigned())
        p.boot_version = j["boot_version"].get<uint64_t>();
      s.pointer = std::move(p);
    }
    return s;
  } catch (const json::exception& e) {
    return make_error(errc::backend_failure,
                      std::string{"the publisher's commit answer is not a publish summary: "}
                        + e.what());
  }
}

} // namespace

std::optional<transport::http_endpoint> http_surface_for(std::string_view advertised,
                                                         std::string_view coordinator_host,
                                                         bool on_coordinator_node) {
  if (advertised.empty())
    return std::nullopt;
  auto at = transport::parse_endpoint(advertised);
  if (!at || at->tls())
    return std::nullopt;
  const bool wildcard =
    at->host.empty() || at->host == "0.0.0.0" || at->host == "::" || at->host == "[::]";
  if (wildcard) {
    if (!on_coordinator_node || coordinator_host.empty())
      return std::nullopt;
    at->host = std::string{coordinator_host};
    return *at;
  }
  if (is_loopback(at->host) && !(on_coordinator_node && is_loopback(coordinator_host)))
    return std::nullopt;
  return *at;
}

http_publish_outcome publish_over_http(const transport::http_endpoint& at, const publish_args& args,
                                       const pipeline::directory_stream& source,
                                       uint64_t request_bytes) {
  http_publish_outcome out;
  transport::http_client client{at};
  transport::http_headers auth;
  if (!args.token.empty())
    auth.push_back({"Authorization", "Bearer " + args.token});
  const auto& tensors = source.tensors();

  transport::http_request open;
  open.method = "POST";
  open.target = "/publish";
  open.headers = auth;
  open.headers.push_back({"Content-Type", "application/json"});
  const std::string opening = open_body(args, tensors);
  open.body = opening;
  auto opened = client.send(open);
  if (!opened) {
    out.unreachable = opened.error().code == errc::backend_failure;
    out.summary = std::move(opened).error();
    return out;
  }
  if (opened->status != 201) {
    auto why = refused(at, "the publish", *opened);
    // Nothing was opened: a 503 here (every session taken) may pass later.
    if (opened->status == 503)
      why.code = errc::busy;
    out.summary = std::move(why);
    return out;
  }
  uint64_t session = 0;
  uint64_t max_request = request_bytes;
  try {
    auto j = json::parse(opened->body);
    session = j.at("session").get<uint64_t>();
    max_request = std::min(max_request, j.value("max_request_bytes", max_request));
  } catch (const json::exception& e) {
    out.summary =
      make_error(errc::backend_failure, "the publisher at " + at.to_string()
                                          + " answered the publish without a session: " + e.what());
    return out;
  }
  max_request = std::max<uint64_t>(max_request, 1);
  const std::string path = "/publish/" + std::to_string(session);

  auto abandon = [&](error why) {
    // Nothing of the session becomes visible; a node that is gone cleans up
    // on its own (its sessions die with it).
    transport::http_client_options quick;
    quick.connect_timeout = std::chrono::seconds{2};
    quick.io_timeout = std::chrono::seconds{5};
    transport::http_client again{at, quick};
    transport::http_request del;
    del.method = "DELETE";
    del.target = path;
    del.headers = auth;
    (void) again.send(del);
    out.summary = std::move(why);
    return std::move(out);
  };

  // The tensors' bytes in order, each request a run of file ranges.
  size_t index = 0;
  uint64_t within = 0;
  for (;;) {
    transport::http_request put;
    put.method = "PUT";
    put.target = path;
    put.headers = auth;
    put.headers.push_back({"Content-Type", "application/octet-stream"});
    put.io_timeout = put_timeout;
    uint64_t room = max_request;
    while (room > 0 && index < tensors.size()) {
      const uint64_t left = tensors[index].size - within;
      if (left == 0) {
        ++index;
        within = 0;
        continue;
      }
      const uint64_t take = std::min(room, left);
      const auto where = source.locate(index);
      const uint64_t offset = where.offset + within;
      auto& ranges = put.file_body;
      if (!ranges.empty() && ranges.back().fd == where.fd
          && ranges.back().offset + ranges.back().size == offset)
        ranges.back().size += take;
      else
        ranges.push_back({where.fd, offset, take});
      within += take;
      room -= take;
    }
    if (put.file_body.empty())
      break;
    auto answer = client.send(put);
    if (!answer)
      return abandon(went_away(at, session, answer.error()));
    if (answer->status != 200)
      return abandon(
        refused(at, "the bytes of publish session " + std::to_string(session), *answer));
  }

  transport::http_request commit;
  commit.method = "POST";
  commit.target = path + "/commit";
  commit.headers = auth;
  commit.io_timeout = commit_timeout;
  auto committed = client.send(commit);
  if (!committed)
    return abandon(went_away(at, session, committed.error()));
  if (committed->status != 200) {
    out.summary = refused(at, "to commit publish session " + std::to_string(session), *committed);
    return out;
  }
  out.summary = parse_summary(committed->body);
  return out;
}

} // namespace stitch::node
