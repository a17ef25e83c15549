#include "runtime/engine/external_engine.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <set>

#include "gpu/checksum.hpp"
#include "runtime/core/checksum.hpp"
#include "runtime/core/json_depth.hpp"
#include "runtime/engine/api_shapes.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/materialize.hpp"

namespace stitch::engine {

namespace fs = std::filesystem;
using json = nlohmann::json;
using transport::http_request;
using transport::http_response;

namespace {

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

/// A short, printable excerpt of an engine's answer for an error message.
std::string excerpt(std::string_view body) {
  return quote_untrusted(body, 200);
}

} // namespace

/// What differs between engines besides their update calls: the request
/// field that namespaces the prefix cache, the control routes to keep from
/// clients. Each route below names the engine source it follows.
struct external_engine::dialect {
  std::string cache_key_field;
  std::vector<std::string> blocked;
};

namespace {

// SGLang (python/sglang/srt/entrypoints/http_server.py, managers/io_struct.py;
// fields checked against releases from v0.4.9 to the 2026 main line):
//   POST /pause_generation    {"mode": "in_place"}   (body ignored up to v0.5.5,
//                              which aborts instead: use commit_mode quiesce there)
//   POST /update_weights_from_disk {"model_path", "weight_version",
//                              "abort_all_requests": false, "flush_cache": false}
//                              -> 200/400 {"success", "message", ...}
//   POST /continue_generation {}
//   GET  /model_info, /get_model_info, /get_weight_version -> "weight_version"
//                              (the first that answers 200: 2026 servers answer 404
//                              on /get_weight_version, 2025 ones lack /model_info)
//   POST /flush_cache         (plain text, 200 or 400)
//   POST /abort_request       {"rid"}
//   GET  /health              200 when healthy, 503 while starting
const external_engine::dialect sglang_dialect{"extra_key",
                                              {"/update_weights_from_disk",
                                               "/update_weights_from_tensor",
                                               "/update_weights_from_distributed",
                                               "/update_weights_from_ipc",
                                               "/init_weights_update_group",
                                               "/destroy_weights_update_group",
                                               "/update_weight_version",
                                               "/pause_generation",
                                               "/continue_generation",
                                               "/flush_cache",
                                               "/abort_request",
                                               "/release_memory_occupation",
                                               "/resume_memory_occupation",
                                               "/start_profile",
                                               "/stop_profile",
                                               "/configure_logging",
                                               "/set_internal_state",
                                               "/load_lora_adapter",
                                               "/unload_lora_adapter",
                                               "/shutdown"}};

// vLLM 0.16 and later (vllm/entrypoints/serve/{rlhf,rpc,cache}/api_router.py,
// vllm/v1/worker/gpu_worker.py), development mode (VLLM_SERVER_DEV_MODE=1):
//   POST /pause?mode=keep       {"status": "paused"}   (0.12-0.15 ignore `mode` and
//                               abort running requests: use commit_mode quiesce)
//   POST /collective_rpc        {"method": "reload_weights", "kwargs": {"weights_path",
//                               "is_checkpoint_format": true}} -> {"results": [...]}, one
//                               per worker; a failing worker: 500 (before 0.16
//                               reload_weights takes no path: unsupported)
//   POST /resume                {"status": "resumed"}
//   POST /reset_prefix_cache    200, empty (flush_cache)
//   GET  /health                200; 503 once the engine died
//   POST /v1/completions        SGLang's /generate goes here (vllm serve has none):
//                               {prompt, max_tokens, temperature, top_p, top_k, seed,
//                               stop, logprobs: 0, return_token_ids: true (0.10.2+),
//                               cache_salt, stream, stream_options.include_usage}
// vLLM keeps no weight version: the reload's answer is the verification, and
// the monitor treats a failed health check as a restart to re-sync after.
// `cache_salt` (chat since 0.9, completions since 0.10) namespaces the cache.
const external_engine::dialect vllm_dialect{
  "cache_salt",
  {"/pause", "/resume", "/is_paused", "/collective_rpc", "/reset_prefix_cache", "/reset_mm_cache",
   "/sleep", "/wake_up", "/is_sleeping", "/update_weights", "/init_weight_transfer",
   "/start_profile", "/stop_profile", "/server_info", "/scale_elastic_ep", "/is_scaling_elastic_ep",
   "/reload", "/get_weight_version", "/update_weight_version"}};

/// Both engines answer GET /health 200 when they can serve.
constexpr const char* health_route = "/health";

bool is_json_object_text(std::string_view body, json* out = nullptr) {
  if (!json_nesting_within(body))
    return false;
  auto doc = json::parse(body, nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    return false;
  if (out)
    *out = std::move(doc);
  return true;
}

/// Splits server-sent events as their bytes arrive; each complete event's
/// `data` (lines joined) goes to `on_data`.
class sse_reader {
public:
  explicit sse_reader(std::function<status(std::string data)> on_data)
      : on_data_(std::move(on_data)) {}

  status feed(std::string_view bytes) {
    pending_.append(bytes);
    for (;;) {
      auto end = pending_.find("\n\n");
      size_t skip = 2;
      if (auto crlf = pending_.find("\r\n\r\n"); crlf != std::string::npos && crlf < end) {
        end = crlf;
        skip = 4;
      }
      if (end == std::string::npos)
        break;
      std::string block = pending_.substr(0, end);
      pending_.erase(0, end + skip);
      if (auto ok = event(block); !ok)
        return ok;
    }
    if (pending_.size() > (size_t{64} << 20))
      return make_error(errc::limit_exceeded, "an event of the engine's stream is over 64 MiB");
    return {};
  }

  status finish() {
    if (pending_.find_first_not_of("\r\n") == std::string::npos)
      return {};
    std::string block = std::move(pending_);
    pending_.clear();
    return event(block);
  }

private:
  status event(std::string_view block) {
    std::string data;
    bool any = false;
    while (!block.empty()) {
      auto nl = block.find('\n');
      auto line = block.substr(0, nl);
      if (!line.empty() && line.back() == '\r')
        line.remove_suffix(1);
      if (line.starts_with("data:")) {
        line.remove_prefix(5);
        if (line.starts_with(' '))
          line.remove_prefix(1);
        if (any)
          data += '\n';
        data += line;
        any = true;
      }
      block = nl == std::string_view::npos ? std::string_view{} : block.substr(nl + 1);
    }
    if (!any)
      return {};
    return on_data_(std::move(data));
  }

  std::function<status(std::string)> on_data_;
  std::string pending_;
};

/// The answer object of a versioned route: the last item of a batch.
const json* answer_item(const json& doc) {
  const json* item = doc.is_array() ? (doc.empty() ? nullptr : &doc.back()) : &doc;
  return item && item->is_object() ? item : nullptr;
}

/// "stop", "length" or "abort" from an answer of a versioned route, or empty.
std::string finish_reason_of(const json& doc) {
  const json* item = answer_item(doc);
  if (!item)
    return {};
  if (auto meta = item->find("meta_info"); meta != item->end() && meta->is_object()) {
    auto f = meta->find("finish_reason");
    if (f != meta->end() && f->is_object() && f->contains("type") && (*f)["type"].is_string())
      return (*f)["type"].get<std::string>();
    return {};
  }
  if (auto choices = item->find("choices");
      choices != item->end() && choices->is_array() && !choices->empty()) {
    const auto& c = choices->back();
    if (c.is_object() && c.contains("finish_reason") && c["finish_reason"].is_string())
      return c["finish_reason"].get<std::string>();
  }
  return {};
}

/// The `weight_version` an SGLang answer reports (`meta_info` of the native
/// route, `metadata` of the OpenAI ones), if any.
std::optional<std::string> reported_version(const json& doc) {
  const json* item = answer_item(doc);
  if (!item)
    return std::nullopt;
  for (const char* holder : {"meta_info", "metadata"}) {
    auto h = item->find(holder);
    if (h != item->end() && h->is_object()) {
      auto v = h->find("weight_version");
      if (v != h->end() && v->is_string())
        return v->get<std::string>();
    }
  }
  return std::nullopt;
}

/// config.json keys that do not change how weights are used.
bool cosmetic_config_key(std::string_view key) {
  return key == "_name_or_path" || key == "transformers_version" || key == "torch_dtype"
         || key == "dtype" || key == "use_cache";
}

/// The first architecture setting two config.json texts disagree on, or empty.
std::string config_difference(std::string_view served, std::string_view next) {
  if (!json_nesting_within(next) || !json_nesting_within(served))
    return "config.json nests JSON deeper than " + std::to_string(max_json_depth) + " levels";
  auto a = json::parse(served, nullptr, false);
  auto b = json::parse(next, nullptr, false);
  if (a.is_discarded() || !a.is_object())
    return "the served config.json is not a JSON object";
  if (b.is_discarded() || !b.is_object())
    return "config.json is not a JSON object";
  std::set<std::string> keys;
  for (const auto& [k, v] : a.items())
    keys.insert(k);
  for (const auto& [k, v] : b.items())
    keys.insert(k);
  for (const auto& k : keys) {
    if (cosmetic_config_key(k))
      continue;
    auto x = a.find(k);
    auto y = b.find(k);
    bool same = x != a.end() && y != b.end() && *x == *y;
    if (!same)
      return "'" + k + "' is " + (y == b.end() ? std::string{"absent"} : excerpt(dump(*y)))
             + " instead of " + (x == a.end() ? std::string{"absent"} : excerpt(dump(*x)));
  }
  return {};
}

/// The staging folder name of a version: `<run>@v<version>`.
std::string folder_of(const version_ref& ref) {
  std::string run;
  for (char c : ref.run_id)
    run +=
      (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return run + "@" + version_dir_name(ref.version);
}

} // namespace

std::string external_engine::weight_version_of(const version_ref& ref) {
  return to_string(ref);
}

external_engine::external_engine(external_engine_options options) : opts_(std::move(options)) {
  dialect_ = opts_.kind == engine_kind::sglang ? &sglang_dialect : &vllm_dialect;
  closing_ = [this] { return closing_flag_.load(); };
}

result<std::shared_ptr<external_engine>> external_engine::make(external_engine_options options) {
  if (options.kind == engine_kind::builtin)
    return make_error(errc::invalid_argument,
                      "an external engine is sglang or vllm; builtin is the node's own engine");
  if (options.url.empty() == !options.launch)
    return make_error(errc::invalid_argument,
                      "an external engine needs exactly one of engine.url and engine.launch");
  if (options.staging_dir.empty())
    return make_error(errc::invalid_argument, "engine.staging_dir is empty");
  std::shared_ptr<external_engine> e{new external_engine(std::move(options))};
  if (!e->opts_.url.empty()) {
    auto ep = transport::parse_endpoint(e->opts_.url);
    if (!ep)
      return make_error(errc::invalid_argument, "engine.url: " + ep.error().message);
    e->endpoint_ = *ep;
  } else {
    auto port = pick_free_port();
    if (!port)
      return std::move(port).error();
    e->endpoint_ = transport::http_endpoint{"http", "127.0.0.1", *port};
  }
  std::error_code ec;
  fs::create_directories(e->opts_.staging_dir, ec);
  if (ec)
    return make_error(errc::backend_failure, "cannot create the staging folder "
                                               + e->opts_.staging_dir.string() + ": "
                                               + ec.message());
  e->monitor_ = std::thread{[raw = e.get()] { raw->monitor(); }};
  return e;
}

external_engine::~external_engine() {
  // Calls to the engine in flight (a monitor's re-sync to a hung engine)
  // give up at once.
  closing_flag_ = true;
  {
    std::lock_guard lock{monitor_mutex_};
    stopping_ = true;
  }
  monitor_wake_.notify_all();
  if (monitor_.joinable())
    monitor_.join();
  std::unique_ptr<engine_process> p;
  {
    std::lock_guard lock{mutex_};
    p = std::move(process_);
  }
  if (p)
    p->stop();
}

std::string external_engine::describe() const {
  return std::string{to_string(opts_.kind)} + " " + endpoint().to_string();
}

engine_process* external_engine::process() {
  std::lock_guard lock{mutex_};
  return process_.get();
}

fs::path external_engine::committed_dir() const {
  std::lock_guard lock{mutex_};
  return committed_ ? committed_->dir : fs::path{};
}

transport::http_client& external_engine::control() {
  if (!control_client_) {
    transport::http_client_options o;
    o.connect_timeout = std::chrono::milliseconds{5'000};
    o.io_timeout = opts_.control_timeout;
    o.max_body_bytes = size_t{16} << 20;
    control_client_ = std::make_unique<transport::http_client>(endpoint(), o);
  }
  return *control_client_;
}

std::unique_ptr<transport::http_client> external_engine::take_client() {
  {
    std::lock_guard lock{pool_mutex_};
    if (!idle_clients_.empty()) {
      auto c = std::move(idle_clients_.back());
      idle_clients_.pop_back();
      return c;
    }
  }
  transport::http_client_options o;
  o.connect_timeout = std::chrono::milliseconds{5'000};
  o.io_timeout = opts_.request_timeout;
  o.max_body_bytes = size_t{256} << 20;
  return std::make_unique<transport::http_client>(endpoint(), o);
}

void external_engine::give_client(std::unique_ptr<transport::http_client> c) {
  std::lock_guard lock{pool_mutex_};
  if (idle_clients_.size() < 64)
    idle_clients_.push_back(std::move(c));
}

void external_engine::note_problem(std::string message) {
  if (opts_.log)
    opts_.log(message);
  std::lock_guard lock{mutex_};
  last_problem_ = std::move(message);
}

void external_engine::note_lost(std::string why) {
  bool was = false;
  {
    std::lock_guard lock{mutex_};
    was = in_sync_;
    in_sync_ = false;
  }
  if (was)
    note_problem(describe() + " is out of service until it is verified again: " + why);
  monitor_wake_.notify_all();
}

namespace {

/// A JSON POST (or GET with an empty body) through `client`.
result<http_response> call_json(transport::http_client& client, std::string method,
                                std::string target, const std::string& body,
                                std::chrono::milliseconds timeout,
                                const std::function<bool()>& cancelled = {}) {
  http_request r;
  r.cancelled = cancelled;
  r.method = std::move(method);
  r.target = std::move(target);
  if (!body.empty() || r.method == "POST")
    r.headers.push_back({"Content-Type", "application/json"});
  r.body = body;
  r.io_timeout = timeout;
  return client.send(r);
}

} // namespace

status external_engine::wait_ready(std::chrono::milliseconds limit, bool* exited) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  std::string last = "no answer yet";
  engine_process* p = nullptr;
  {
    std::lock_guard lock{mutex_};
    p = process_.get();
  }
  const uint64_t starts = p ? p->starts() : 0;
  for (;;) {
    {
      std::lock_guard lock{control_mutex_};
      last = probe_health(std::chrono::milliseconds{5'000});
      // Healthy, and (a launched engine) still the process that was started:
      // not another program answering on its port.
      bool ours = !p || (p->running() && p->starts() == starts);
      if (last.empty() && ours)
        return {};
      if (last.empty())
        last = "another program answers on its port";
    }
    if (p && (p->starts() != starts || (!p->running() && !p->last_exit().empty()))) {
      if (exited)
        *exited = true;
      return make_error(errc::engine_unavailable,
                        describe() + " exited while starting (it " + p->last_exit() + ")");
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return make_error(errc::engine_unavailable, describe() + " did not become healthy within "
                                                    + std::to_string(limit.count() / 1000)
                                                    + " s: " + last);
    std::unique_lock lock{monitor_mutex_};
    if (monitor_wake_.wait_for(lock, std::chrono::milliseconds{250}, [&] { return stopping_; }))
      return make_error(errc::engine_unavailable, describe() + " is shutting down");
  }
}

transport::http_endpoint external_engine::endpoint() const {
  std::lock_guard lock{endpoint_mutex_};
  return endpoint_;
}

void external_engine::move_to_port(uint16_t port) {
  {
    std::lock_guard lock{endpoint_mutex_};
    endpoint_.port = port;
  }
  {
    std::lock_guard lock{control_mutex_};
    control_client_.reset();
  }
  std::lock_guard lock{pool_mutex_};
  idle_clients_.clear();
}

status external_engine::launch_from(const fs::path& dir) {
  std::unique_ptr<engine_process> old;
  {
    std::lock_guard lock{mutex_};
    old = std::move(process_);
  }
  if (old)
    old->stop();
  // The port was free when it was picked; another program may take it before
  // the engine binds it (the engine then exits at once): another port.
  status ready;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) {
      auto port = pick_free_port();
      if (!port)
        return std::move(port).error();
      move_to_port(*port);
    }
    auto started = engine_process::start(*opts_.launch, endpoint().port, dir);
    if (!started)
      return std::move(started).error();
    engine_process* p = started->get();
    {
      std::lock_guard lock{mutex_};
      process_ = std::move(*started);
      process_starts_seen_ = p->starts();
    }
    bool exited = false;
    ready = wait_ready(opts_.ready_timeout, &exited);
    if (ready || !exited)
      return ready;
    if (opts_.log)
      opts_.log(describe() + ": the engine exited while starting (" + p->last_exit()
                + "); starting it on another port");
    std::unique_ptr<engine_process> failed;
    {
      std::lock_guard lock{mutex_};
      failed = std::move(process_);
    }
    failed->stop();
  }
  return ready;
}

// ---- the weight-update cycle, per engine -----------------------------------

namespace {

/// `weight_version` as the engine reports it now.
result<std::string> sglang_served_version(transport::http_client& c,
                                          std::chrono::milliseconds timeout,
                                          const std::function<bool()>& cancelled) {
  std::string tried;
  for (const char* route : {"/model_info", "/get_model_info", "/get_weight_version"}) {
    auto r = call_json(c, "GET", route, {}, timeout, cancelled);
    if (!r)
      return std::move(r).error();
    json doc;
    if (r->status == 200 && is_json_object_text(r->body, &doc) && doc.contains("weight_version")
        && doc["weight_version"].is_string())
      return doc["weight_version"].get<std::string>();
    tried +=
      std::string{tried.empty() ? "" : ", "} + route + " answered " + std::to_string(r->status);
  }
  return make_error(errc::engine_unavailable,
                    "the engine reports no weight_version (" + tried + ")");
}

/// A control call that must answer 200 with a JSON object whose `success`
/// (when present) is true.
status expect_success(const result<http_response>& r, std::string_view what) {
  if (!r)
    return make_error(errc::activation_failed, std::string{what} + ": " + r.error().message);
  json doc;
  bool object = is_json_object_text(r->body, &doc);
  bool failed = r->status != 200
                || (object && doc.contains("success") && doc["success"].is_boolean()
                    && !doc["success"].get<bool>());
  if (!failed)
    return {};
  std::string why = object && doc.contains("message") && doc["message"].is_string()
                      ? doc["message"].get<std::string>()
                      : r->body;
  return make_error(errc::activation_failed, std::string{what} + " answered "
                                               + std::to_string(r->status) + ": " + excerpt(why));
}

} // namespace

status external_engine::load_and_verify(const staged& s) {
  const std::string id = weight_version_of(s.ref);
  std::lock_guard lock{control_mutex_};
  auto& c = control();
  if (opts_.kind == engine_kind::sglang) {
    json body = {{"model_path", s.dir.string()},
                 {"weight_version", id},
                 {"abort_all_requests", false},
                 {"flush_cache", false}};
    auto r =
      call_json(c, "POST", "/update_weights_from_disk", dump(body), opts_.update_timeout, closing_);
    if (auto ok = expect_success(r, describe() + " /update_weights_from_disk"); !ok)
      return ok;
    auto now = sglang_served_version(c, opts_.control_timeout, closing_);
    if (!now)
      return make_error(errc::activation_failed, describe() + ": " + now.error().message);
    if (*now != id)
      return make_error(errc::activation_failed, describe() + " reports weight_version "
                                                   + excerpt(*now) + " after loading " + id);
    return {};
  }
  // vLLM reports no weight version: the reload answering 200 with one
  // result per worker (none of them an error) is the verification.
  json body = {{"method", "reload_weights"},
               {"kwargs", {{"weights_path", s.dir.string()}, {"is_checkpoint_format", true}}}};
  auto r = call_json(c, "POST", "/collective_rpc", dump(body), opts_.update_timeout, closing_);
  if (auto ok = expect_success(r, describe() + " /collective_rpc reload_weights"); !ok)
    return ok;
  json doc;
  if (!r->body.empty()
      && (!is_json_object_text(r->body, &doc) || !doc.contains("results")
          || !doc["results"].is_array()))
    return make_error(errc::activation_failed, describe()
                                                 + " /collective_rpc reload_weights answered "
                                                 + excerpt(r->body) + " (no results list)");
  return {};
}

status external_engine::prefetch(const chain_plan&) {
  return {};
}

status external_engine::stage(const chain_plan& plan, bool onto_shadow, tensor_source& source) {
  auto fail_stage = [&](errc code, std::string why) {
    return make_error(code,
                      "staging " + to_string(plan.target) + " for " + describe() + ": " + why);
  };
  auto target = source.manifest_of(plan.target);
  if (!target)
    return std::move(target).error();
  pipeline::range_reader read = [&source](const version_ref& ref, std::string_view tensor,
                                          uint64_t offset, std::span<std::byte> out) {
    return source.read(ref, tensor, offset, out);
  };
  pipeline::manifest_reader manifests = [&source](const version_ref& ref) {
    return source.manifest_of(ref);
  };
  std::optional<staged> base;
  std::string served_config;
  {
    std::lock_guard lock{mutex_};
    base = onto_shadow ? shadow_ : committed_;
    served_config = boot_config_;
  }
  staged next{plan.target, opts_.staging_dir / folder_of(plan.target), {}};
  if (target->files.contains("config.json")) {
    auto text = read_version_file(*target, "config.json", read);
    if (!text)
      return std::move(text).error();
    next.config = std::move(*text);
  }
  // The engine loads weights, not architectures: a version that says the
  // model is another one is refused while the engine keeps serving.
  if (!served_config.empty() && !next.config.empty())
    if (auto diff = config_difference(served_config, next.config); !diff.empty()) {
      if (!opts_.launch)
        return fail_stage(errc::invalid_argument,
                          "its config.json changes the architecture the engine runs (" + diff
                            + "); restart the engine with this version to serve it");
      // A launched engine is restarted from it at the commit.
      next.restart = true;
    }
  status written;
  if (link_sibling_copy(next)) {
    // Another replica of this node staged the same version: its verified
    // files are linked, not written again (a tmpfs holds one copy).
  } else if (plan.anchor || !base) {
    if (!plan.anchor)
      return fail_stage(errc::invalid_argument, "nothing is staged to build its deltas on");
    // A rebuild names the version only: its chain starts at the nearest
    // full anchor below it.
    uint64_t boot = plan.reset_to_boot ? 0 : plan.anchor->version;
    auto reader = pipeline::version_reader::open(manifests, read, plan.target, boot);
    if (!reader)
      return std::move(reader).error();
    pipeline::export_options eo;
    eo.max_shard_bytes = opts_.max_shard_bytes;
    written = pipeline::export_version(*reader, read, next.dir, eo);
  } else {
    written = write_delta(*base, plan, *target, source, next);
  }
  if (!written)
    return written;
  {
    std::lock_guard lock{mutex_};
    shadow_ = std::move(next);
  }
  prune_staging();
  return {};
}

status external_engine::write_delta(const staged& base, const chain_plan& plan,
                                    const manifest& target, tensor_source& source,
                                    const staged& next) {
  auto ckpt = pipeline::open_hf_directory(base.dir);
  if (!ckpt)
    return std::move(ckpt).error();
  std::vector<manifest> deltas;
  for (const auto& ref : plan.deltas) {
    auto m = source.manifest_of(ref);
    if (!m)
      return std::move(m).error();
    deltas.push_back(std::move(*m));
  }
  for (const auto& [name, sum] : target.checksums)
    if (!ckpt->tensors.contains(name))
      return make_error(errc::corrupt_data, to_string(plan.target) + " has tensor '" + name
                                              + "', which the staged " + to_string(base.ref)
                                              + " lacks");
  std::vector<safetensors::tensor_spec> specs;
  for (const auto& [name, t] : ckpt->tensors) {
    if (!target.checksums.contains(name))
      return make_error(errc::corrupt_data, to_string(plan.target) + " lacks tensor '" + name
                                              + "' of the staged " + to_string(base.ref));
    specs.push_back({t.name, t.type, t.shape});
  }
  pipeline::range_reader read = [&source](const version_ref& ref, std::string_view tensor,
                                          uint64_t offset, std::span<std::byte> out) {
    return source.read(ref, tensor, offset, out);
  };
  std::map<std::string, size_t> per_shard;
  for (const auto& [name, t] : ckpt->tensors)
    ++per_shard[t.file];
  // A shard whose tensors the chain leaves alone is the same file again.
  pipeline::shard_reuse reuse =
    [&](const std::string& shard,
        const std::vector<std::string>& tensors) -> std::optional<fs::path> {
    auto it = per_shard.find(shard);
    if (it == per_shard.end() || it->second != tensors.size())
      return std::nullopt;
    for (const auto& name : tensors) {
      auto t = ckpt->tensors.find(name);
      if (plan.touched.contains(name) || t == ckpt->tensors.end() || t->second.file != shard)
        return std::nullopt;
    }
    return ckpt->directory / shard;
  };
  std::vector<std::byte> piece(size_t{8} << 20);
  std::vector<std::byte> scratch;
  pipeline::tensor_filler fill = [&](const std::string& name,
                                     const safetensors::byte_sink& sink) -> status {
    const auto& t = ckpt->tensors.at(name);
    if (!plan.touched.contains(name)) {
      // Unchanged: its bytes as staged (verified then), piece by piece.
      auto fd = pipeline::open_checkpoint_file(*ckpt, t.file);
      if (!fd)
        return std::move(fd).error();
      status ok;
      for (uint64_t done = 0; ok && done < t.size;) {
        auto n = static_cast<size_t>(std::min<uint64_t>(piece.size(), t.size - done));
        ok = pipeline::read_file_range(*fd, t.offset + done, std::span{piece}.first(n), name);
        if (ok)
          ok = sink(std::span{piece}.first(n));
        done += n;
      }
      ::close(*fd);
      return ok;
    }
    std::vector<std::byte> bytes(t.size);
    if (auto ok = pipeline::read_tensor(*ckpt, name, bytes); !ok)
      return ok;
    for (const auto& d : deltas) {
      if (std::find(d.touched.begin(), d.touched.end(), name) == d.touched.end())
        continue;
      if (scratch.empty())
        scratch.resize(size_t{8} << 20);
      if (auto ok = pipeline::apply_delta(read, d, name, bytes, scratch); !ok)
        return ok;
    }
    // Nothing reaches the engine unless it is exactly what was published.
    uint64_t got = gpu::parallel_tree_checksum(bytes);
    uint64_t expected = target.checksums.at(name);
    if (got != expected)
      return make_error(errc::checksum_mismatch,
                        "tensor '" + name + "' of " + to_string(plan.target) + " has checksum "
                          + checksum::to_hex(got) + " but the manifest says "
                          + checksum::to_hex(expected));
    return sink(bytes);
  };
  std::map<std::string, std::string> files;
  for (const auto& [name, entry] : target.files) {
    auto text = read_version_file(target, name, read);
    if (!text)
      return std::move(text).error();
    files.emplace(name, std::move(*text));
  }
  return pipeline::write_hf_directory(next.dir, specs, fill, opts_.max_shard_bytes, false, files,
                                      reuse);
}

bool external_engine::link_sibling_copy(const staged& next) {
  const fs::path mine = opts_.staging_dir;
  const fs::path parent = mine.parent_path();
  const std::string folder = next.dir.filename().string();
  std::error_code ec;
  if (parent.empty() || fs::exists(next.dir, ec))
    return false;
  for (const auto& sibling : fs::directory_iterator(parent, ec)) {
    if (!sibling.is_directory(ec) || sibling.path() == mine)
      continue;
    fs::path from = sibling.path() / folder;
    if (!fs::is_directory(from, ec))
      continue;
    // Versions appear by rename, so a folder that exists is complete.
    fs::path temp = mine / ("." + folder + ".link-" + std::to_string(::getpid()));
    fs::remove_all(temp, ec);
    if (!fs::create_directory(temp, ec))
      continue;
    bool ok = true;
    for (const auto& file : fs::directory_iterator(from, ec)) {
      if (!file.is_regular_file(ec)
          || ::link(file.path().c_str(), (temp / file.path().filename()).c_str()) != 0) {
        ok = false;
        break;
      }
    }
    if (ok && !ec && ::rename(temp.c_str(), next.dir.c_str()) == 0)
      return true;
    fs::remove_all(temp, ec);
  }
  return false;
}

void external_engine::discard_shadow() {
  std::lock_guard lock{mutex_};
  shadow_.reset();
}

std::string external_engine::probe_health(std::chrono::milliseconds timeout) {
  // The caller holds control_mutex_.
  auto r = call_json(control(), "GET", health_route, {}, timeout, closing_);
  if (r && r->status == 200)
    return {};
  if (!r)
    control().close();
  return r ? "status " + std::to_string(r->status) : r.error().message;
}

bool external_engine::answers_health() {
  std::lock_guard lock{control_mutex_};
  return probe_health(opts_.control_timeout).empty();
}

status external_engine::pause_engine() {
  std::lock_guard lock{control_mutex_};
  result<http_response> r =
    opts_.kind == engine_kind::sglang
      ? call_json(control(), "POST", "/pause_generation", R"({"mode":"in_place"})",
                  opts_.control_timeout, closing_)
      : call_json(control(), "POST", "/pause?mode=keep", {}, opts_.control_timeout, closing_);
  return expect_success(r, describe() + " pause");
}

status external_engine::resume_engine() {
  std::lock_guard lock{control_mutex_};
  result<http_response> r =
    opts_.kind == engine_kind::sglang
      ? call_json(control(), "POST", "/continue_generation", "{}", opts_.control_timeout, closing_)
      : call_json(control(), "POST", "/resume", {}, opts_.control_timeout, closing_);
  return expect_success(r, describe() + " resume");
}

status external_engine::pause() {
  {
    std::lock_guard lock{mutex_};
    // A launched engine not started yet serves nothing to pause.
    if (opts_.launch && (!process_ || !process_->running()))
      return {};
  }
  if (auto ok = pause_engine(); !ok)
    return ok;
  std::lock_guard lock{mutex_};
  paused_ = true;
  return {};
}

status external_engine::resume() {
  {
    std::lock_guard lock{mutex_};
    if (!paused_)
      return {};
  }
  auto ok = resume_engine();
  std::lock_guard lock{mutex_};
  if (ok)
    paused_ = false;
  return ok;
}

status external_engine::commit() {
  std::lock_guard sync{sync_mutex_};
  std::optional<staged> next;
  bool started = false;
  {
    std::lock_guard lock{mutex_};
    if (!shadow_)
      return make_error(errc::invalid_argument, "nothing is staged to activate");
    next = *shadow_;
    started = process_ && process_->running();
  }
  status ok;
  if (opts_.launch && (!started || next->restart)) {
    // The first activation (or a new architecture): the engine starts from
    // the staged directory; the load that follows labels its weights.
    if (next->restart && opts_.log)
      opts_.log("restarting the engine for " + to_string(next->ref)
                + ", whose config.json changes its architecture");
    ok = launch_from(next->dir);
    std::lock_guard lock{mutex_};
    paused_ = false;
  }
  if (ok)
    ok = load_and_verify(*next);
  if (!ok) {
    note_lost(ok.error().message);
    return ok;
  }
  {
    std::lock_guard lock{mutex_};
    if (boot_config_.empty() || next->restart)
      boot_config_ = next->config;
    if (process_)
      process_->set_model_dir(next->dir);
    previous_version_ = committed_ ? weight_version_of(committed_->ref) : std::string{};
    committed_ = std::move(next);
    shadow_.reset();
    in_sync_ = true;
  }
  prune_staging();
  return {};
}

status external_engine::flush_cache() {
  std::lock_guard lock{control_mutex_};
  result<http_response> r =
    opts_.kind == engine_kind::sglang
      ? call_json(control(), "POST", "/flush_cache", {}, opts_.control_timeout, closing_)
      : call_json(control(), "POST", "/reset_prefix_cache", {}, opts_.control_timeout, closing_);
  if (!r)
    return make_error(errc::backend_failure, describe() + " flush: " + r.error().message);
  if (r->status != 200)
    return make_error(errc::backend_failure, describe() + " refused to flush its cache ("
                                               + std::to_string(r->status)
                                               + "): " + excerpt(r->body));
  return {};
}

status external_engine::reset_to_boot(const version_ref& ref, tensor_source& source) {
  if (auto ok = stage(boot_plan(ref), false, source); !ok)
    return ok;
  if (opts_.launch && !answers_health()) {
    // The engine's state is unknown and it does not answer: start it anew.
    std::lock_guard lock{mutex_};
    if (shadow_)
      shadow_->restart = true;
  }
  if (auto ok = pause(); !ok && opts_.log)
    opts_.log("pausing before the rebuild failed (loading anyway): " + ok.error().message);
  auto ok = commit();
  auto resumed = resume();
  if (ok && !resumed)
    return resumed;
  return ok;
}

void external_engine::prune_staging() {
  std::set<std::string> keep;
  {
    std::lock_guard lock{mutex_};
    for (const auto* s : {&committed_, &shadow_})
      if (*s)
        keep.insert((*s)->dir.filename().string());
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(opts_.staging_dir, ec)) {
    auto name = entry.path().filename().string();
    if (name.starts_with(".") || name.find("@weight_v") == std::string::npos || keep.contains(name))
      continue;
    std::error_code ignored;
    fs::remove_all(entry.path(), ignored);
  }
}

result<engine_reply> external_engine::forward(const engine_call& call, const event_sink& on_event,
                                              const std::function<bool()>& cancelled) {
  if (opts_.kind == engine_kind::vllm && call.route == "/generate")
    return generate_over_completions(call, on_event, cancelled);
  return pass_through(call, on_event, cancelled);
}

namespace {

/// What a vLLM completion (or its stream so far) says, gathered into
/// SGLang's native answer.
struct native_answer {
  std::string id;
  std::string text;
  json output_ids = json::array();
  json logprobs = json::array();
  std::string finish;
  json usage;
  bool want_logprobs = false;

  /// Takes in one completion object or stream chunk; `delta`: its text and
  /// ids add to what came before (a stream), else they are the whole.
  void take(const json& doc, bool delta) {
    if (doc.contains("id") && doc["id"].is_string())
      id = doc["id"].get<std::string>();
    if (doc.contains("usage") && doc["usage"].is_object())
      usage = doc["usage"];
    if (!doc.contains("choices") || !doc["choices"].is_array() || doc["choices"].empty())
      return;
    const json& c = doc["choices"][0];
    if (!c.is_object())
      return;
    std::string t = c.contains("text") && c["text"].is_string() ? c["text"].get<std::string>() : "";
    json ids =
      c.contains("token_ids") && c["token_ids"].is_array() ? c["token_ids"] : json::array();
    json lps = json::array();
    if (c.contains("logprobs") && c["logprobs"].is_object()) {
      const json& l = c["logprobs"];
      if (l.contains("token_logprobs") && l["token_logprobs"].is_array())
        for (size_t i = 0; i < l["token_logprobs"].size(); ++i)
          lps.push_back(json::array(
            {l["token_logprobs"][i], i < ids.size() ? ids[i] : json(nullptr), nullptr}));
    }
    if (delta) {
      text += t;
      for (auto& x : ids)
        output_ids.push_back(x);
      for (auto& x : lps)
        logprobs.push_back(x);
    } else {
      text = std::move(t);
      output_ids = std::move(ids);
      logprobs = std::move(lps);
    }
    if (c.contains("finish_reason") && c["finish_reason"].is_string())
      finish = c["finish_reason"].get<std::string>();
  }

  /// SGLang's shape: `{text, output_ids, meta_info}` (`finish_reason` null
  /// until the end).
  std::string render(bool last) const {
    json meta;
    meta["id"] = id;
    if (last && !finish.empty())
      meta["finish_reason"] = {{"type", finish}};
    else
      meta["finish_reason"] = nullptr;
    // An engine's garbage must not throw here: counts are taken only when
    // they are counts.
    auto count = [&](const char* key) -> json {
      if (usage.is_object() && usage.contains(key) && usage[key].is_number_unsigned())
        return usage[key];
      return nullptr;
    };
    meta["prompt_tokens"] = count("prompt_tokens");
    meta["completion_tokens"] =
      count("completion_tokens").is_null() ? json(output_ids.size()) : count("completion_tokens");
    if (want_logprobs)
      meta["output_token_logprobs"] = logprobs;
    json out;
    out["text"] = text;
    out["output_ids"] = output_ids;
    out["meta_info"] = std::move(meta);
    return dump(out);
  }
};

} // namespace

result<engine_reply>
external_engine::generate_over_completions(const engine_call& call, const event_sink& on_event,
                                           const std::function<bool()>& cancelled) {
  // vLLM serves no /generate: SGLang's native request becomes a completion
  // (the same sampling; token ids and logprobs asked for), and the answer
  // (or each stream chunk) SGLang's native shape again.
  auto req = parse_api_request(api_kind::native, call.body);
  if (!req)
    return std::move(req).error();
  json in;
  (void) is_json_object_text(call.body, &in);
  const auto& sp = req->sampling;
  json body = {{"prompt", req->prompt},
               {"max_tokens", sp.max_tokens},
               {"temperature", sp.temperature},
               {"top_p", sp.top_p},
               {"top_k", sp.top_k == 0 ? -1 : static_cast<int64_t>(sp.top_k)},
               {"return_token_ids", true}};
  if (!sp.stop.empty())
    body["stop"] = sp.stop;
  if (req->seeded)
    body["seed"] = sp.seed;
  if (req->return_logprob)
    body["logprobs"] = 0;
  if (in.contains("cache_salt"))
    body["cache_salt"] = in["cache_salt"];
  if (req->stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  engine_call sub = call;
  sub.route = "/v1/completions";
  sub.body = dump(body);
  native_answer acc;
  acc.want_logprobs = req->return_logprob;
  event_sink sink;
  if (req->stream)
    sink = [&](std::string ev) {
      auto doc = json::parse(ev, nullptr, false);
      if (doc.is_discarded() || !doc.is_object() || doc.contains("error")) {
        if (on_event)
          on_event(std::move(ev));
        return;
      }
      acc.take(doc, true);
      if (on_event && doc.contains("choices") && doc["choices"].is_array()
          && !doc["choices"].empty())
        on_event(acc.render(false));
    };
  auto reply = pass_through(sub, sink, cancelled);
  if (!reply || reply->status != 200)
    return reply;
  auto doc = json::parse(reply->body, nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || doc.contains("error"))
    return reply;
  acc.take(doc, reply->stream);
  reply->body = acc.render(true);
  reply->content_type = "application/json";
  reply->finish_reason = acc.finish;
  return reply;
}

result<engine_reply> external_engine::pass_through(const engine_call& call,
                                                   const event_sink& on_event,
                                                   const std::function<bool()>& cancelled) {
  std::set<std::string> accepted;
  {
    std::lock_guard lock{mutex_};
    if (!in_sync_)
      return make_error(errc::engine_unavailable,
                        describe() + " is not serving a verified version"
                          + (last_problem_.empty() ? std::string{} : ": " + last_problem_));
    for (const auto* s : {&committed_, &shadow_})
      if (*s)
        accepted.insert(weight_version_of((*s)->ref));
    // An answer made just before the last commit can arrive just after it.
    if (!previous_version_.empty())
      accepted.insert(previous_version_);
  }
  const bool versioned = api_kind_of(call.route).has_value();
  std::string body = call.body;
  std::string rid;
  bool stream = false;
  // One parse of the body: does it ask for a stream, and (SGLang) a request
  // id of our own, so that a client going away aborts it. SGLang aborts
  // every request whose rid starts with the one given (a batch's items are
  // `<rid>_<i>`): ours end in ':' so that none is the start of another's.
  if (json doc; (versioned || body.find("\"stream\"") != std::string::npos)
                && is_json_object_text(body, &doc)) {
    auto s = doc.find("stream");
    stream = s != doc.end() && s->is_boolean() && s->get<bool>();
    if (versioned && opts_.kind == engine_kind::sglang) {
      if (!doc.contains("rid")) {
        doc["rid"] = "stitch:" + call.tag + ":";
        body = dump(doc);
      }
      if (doc["rid"].is_string())
        rid = doc["rid"].get<std::string>();
    }
  }
  http_request r;
  r.method = call.method;
  r.target = call.route;
  if (!body.empty())
    r.headers.push_back({"Content-Type", "application/json"});
  r.body = body;
  r.cancelled = cancelled;
  engine_reply reply;
  std::optional<std::string> held;
  bool sse = false;
  sse_reader events{[&](std::string data) -> status {
    if (data == "[DONE]")
      return {};
    if (!json_nesting_within(data))
      return make_error(errc::engine_unavailable, describe()
                                                    + " streamed an event nesting JSON "
                                                      "deeper than "
                                                    + std::to_string(max_json_depth) + " levels");
    if (held && on_event)
      on_event(std::move(*held));
    held = std::move(data);
    return {};
  }};
  std::string raw;
  if (stream)
    r.on_body = [&](const http_response& head, std::string_view piece) -> status {
      if (!sse) {
        auto* type = transport::find_header(head.headers, "Content-Type");
        sse = head.status == 200 && type && type->starts_with("text/event-stream");
      }
      if (sse)
        return events.feed(piece);
      if (raw.size() + piece.size() > (size_t{64} << 20))
        return make_error(errc::limit_exceeded,
                          describe() + " answered " + call.route + " with more than 64 MiB");
      raw.append(piece);
      return {};
    };
  auto client = take_client();
  auto answer = client->send(r);
  if (!answer) {
    if (cancelled && cancelled()) {
      if (!rid.empty()) {
        // SGLang aborts a disconnected stream after 2 s; tell it at once.
        auto aborter = take_client();
        auto a = call_json(*aborter, "POST", "/abort_request", dump(json{{"rid", rid}}),
                           opts_.control_timeout, closing_);
        if (a)
          give_client(std::move(aborter));
      }
      return make_error(errc::engine_unavailable, "the caller of " + call.route + " went away");
    }
    monitor_wake_.notify_all();
    auto e = make_error(errc::engine_unavailable,
                        describe() + " " + call.route + ": " + answer.error().message);
    note_problem(e.message);
    return e;
  }
  give_client(std::move(client));
  reply.status = static_cast<uint16_t>(answer->status);
  if (auto* type = transport::find_header(answer->headers, "Content-Type"))
    reply.content_type = *type;
  if (sse) {
    if (auto ok = events.finish(); !ok)
      return std::move(ok).error();
    if (!held) {
      auto e = make_error(errc::engine_unavailable,
                          describe() + " ended its " + call.route + " stream without an event");
      note_problem(e.message);
      return e;
    }
    reply.stream = true;
    reply.content_type = "application/json";
    reply.body = std::move(*held);
  } else {
    reply.body = r.on_body ? std::move(raw) : std::move(answer->body);
  }
  if (!versioned || reply.status != 200)
    return reply;
  if (!json_nesting_within(reply.body)) {
    // Stamping would write it out again: nlohmann's writer recurses.
    auto e = make_error(errc::engine_unavailable, describe() + " answered " + call.route
                                                    + " with JSON nested deeper than "
                                                    + std::to_string(max_json_depth) + " levels");
    note_problem(e.message);
    return e;
  }
  auto doc = json::parse(reply.body, nullptr, false);
  if (doc.is_discarded() || !(doc.is_object() || doc.is_array())) {
    auto e = make_error(errc::engine_unavailable,
                        describe() + " answered " + call.route
                          + " with a body that is not JSON: " + excerpt(reply.body));
    note_problem(e.message);
    return e;
  }
  // The weights that answered must be the ones Stitch activated: stamps
  // never vouch for anything else.
  if (auto v = reported_version(doc); v && !accepted.contains(*v)) {
    auto why = describe() + " answered " + call.route + " with weight_version " + excerpt(*v)
               + ", not the version Stitch activated";
    note_lost(why);
    return make_error(errc::engine_unavailable, why);
  }
  reply.finish_reason = finish_reason_of(doc);
  return reply;
}

result<generation_result> external_engine::generate(const generation_request& request,
                                                    const std::function<bool()>& cancelled) {
  // SGLang's native route for both engines (vLLM's goes through its
  // completions route in `forward`).
  const auto& p = request.sampling;
  json sampling = {{"temperature", p.temperature},
                   {"top_p", p.top_p},
                   {"top_k", p.top_k == 0 ? -1 : static_cast<int64_t>(p.top_k)},
                   {"max_new_tokens", p.max_new_tokens},
                   {"stop", p.stop}};
  if (p.seed)
    sampling["sampling_seed"] = *p.seed;
  engine_call call;
  call.id = request.id;
  call.tag = "gen-" + std::to_string(request.id);
  call.route = "/generate";
  call.body = dump(json{{"text", request.prompt},
                        {"sampling_params", sampling},
                        {"return_logprob", request.return_logprob}});
  auto reply = forward(call, {}, cancelled);
  if (!reply)
    return std::move(reply).error();
  auto doc = json::parse(reply->body, nullptr, false);
  if (reply->status != 200 || !doc.is_object())
    return make_error(errc::engine_unavailable, describe() + " answered " + call.route + " with "
                                                  + std::to_string(reply->status) + ": "
                                                  + excerpt(reply->body));
  generation_result out;
  auto finish = finish_reason_of(doc);
  out.finish = finish == "length"  ? finish_reason::length
               : finish == "abort" ? finish_reason::abort
                                   : finish_reason::stop;
  try {
    out.text = doc.value("text", "");
    for (const auto& id : doc.value("output_ids", json::array()))
      out.tokens.push_back(id.get<int32_t>());
    const auto& meta = doc.at("meta_info");
    out.prompt_tokens = meta.value("prompt_tokens", 0u);
    for (const auto& lp : meta.value("output_token_logprobs", json::array()))
      if (lp.is_array() && !lp.empty() && lp[0].is_number())
        out.logprobs.push_back(lp[0].get<float>());
  } catch (const json::exception& e) {
    return make_error(errc::engine_unavailable, describe() + " answered " + call.route
                                                  + " in an unexpected shape: " + e.what());
  }
  return out;
}

std::string external_engine::stamp_request(std::string_view route, std::string_view body,
                                           const version_ref& served) {
  // The engine's own cache namespace: SGLang's `extra_key`, vLLM's
  // `cache_salt`; entries computed under other weights never match.
  return add_request_fields(route, body, {{dialect_->cache_key_field, weight_version_of(served)}});
}

std::string external_engine::stamp_response(std::string_view route, std::string_view body,
                                            const stamps& s, std::string_view run_id) {
  return stamp_answer(route, body, s, run_id);
}

engine_health external_engine::health() {
  std::lock_guard lock{mutex_};
  if (in_sync_ && committed_)
    return {true, describe() + " serves " + weight_version_of(committed_->ref)
                    + (paused_ ? " (paused for an activation)" : "")};
  std::string why = committed_ ? "being verified again" : "no version activated yet";
  if (!last_problem_.empty())
    why += "; last problem: " + last_problem_;
  return {false, describe() + ": " + why};
}

std::vector<std::string> external_engine::blocked_routes() const {
  return dialect_->blocked;
}

void external_engine::monitor() {
  for (;;) {
    {
      std::unique_lock lock{monitor_mutex_};
      monitor_wake_.wait_for(lock, opts_.monitor_every);
      if (stopping_)
        return;
    }
    bool skip = false;
    {
      std::lock_guard lock{mutex_};
      skip = paused_ || !committed_;
      if (process_ && process_->starts() != process_starts_seen_) {
        process_starts_seen_ = process_->starts();
        in_sync_ = false;
        last_problem_ = "the engine restarted (it " + process_->last_exit() + ")";
        if (opts_.log)
          opts_.log(describe() + ": " + last_problem_ + "; loading "
                    + weight_version_of(committed_ ? committed_->ref : version_ref{})
                    + " into it again");
      }
    }
    if (skip)
      continue;
    std::unique_lock sync{sync_mutex_, std::try_to_lock};
    if (!sync.owns_lock())
      continue; // a commit is under way; it verifies what it loads
    std::optional<staged> expected;
    {
      std::lock_guard lock{mutex_};
      expected = committed_;
      if (!expected || paused_)
        continue;
    }
    const std::string id = weight_version_of(expected->ref);
    std::string unhealthy;
    std::string mismatch;
    {
      std::lock_guard lock{control_mutex_};
      if (auto why = probe_health(opts_.control_timeout); !why.empty()) {
        unhealthy = "health check: " + why;
      } else if (opts_.kind == engine_kind::sglang) {
        auto v = sglang_served_version(control(), opts_.control_timeout, closing_);
        if (!v)
          unhealthy = v.error().message;
        else if (*v != id)
          mismatch = "it reports weight_version " + excerpt(*v) + " instead of " + id;
      }
    }
    if (!unhealthy.empty()) {
      note_lost(unhealthy);
      continue;
    }
    if (!mismatch.empty())
      note_lost(mismatch);
    bool in_sync = false;
    {
      std::lock_guard lock{mutex_};
      in_sync = in_sync_;
    }
    if (in_sync)
      continue;
    // Healthy again but not verified: load what Stitch activated last.
    if (auto ok = load_and_verify(*expected); !ok) {
      note_problem(describe() + " could not be re-synced to " + id + ": " + ok.error().message);
      continue;
    }
    {
      std::lock_guard lock{mutex_};
      if (committed_ && committed_->ref == expected->ref)
        in_sync_ = true;
      last_problem_.clear();
    }
    if (opts_.log)
      opts_.log(describe() + " re-synced: it serves " + id + " again");
  }
}

} // namespace stitch::engine
