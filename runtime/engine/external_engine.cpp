// The external engine: construction, the engine process and its supervision
// (launch, readiness, the health monitor). Updates: external_engine_update.cpp;
// requests: external_engine_requests.cpp.
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
#include "runtime/engine/external_engine_detail.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/materialize.hpp"

namespace stitch::engine {

namespace fs = std::filesystem;
using namespace detail;

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
    // The port was picked when the replica was made; another listener of
    // this node (or any program) may hold it by now, and would answer the
    // health checks in the engine's place.
    if (attempt > 0 || !port_free(endpoint().port)) {
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

engine_health external_engine::health() {
  std::lock_guard lock{mutex_};
  if (in_sync_ && committed_)
    return {true, describe() + " serves " + weight_version_of(committed_->ref)
                    + (paused_ ? " (paused for an activation)" : "")
                    + (vllm_versions_ && !*vllm_versions_
                         ? " (unverified: this vLLM has no weight-version routes)"
                         : "")};
  std::string why = committed_ ? "being verified again" : "no version activated yet";
  if (!last_problem_.empty())
    why += "; last problem: " + last_problem_;
  return {false, describe() + ": " + why};
}

bool external_engine::verifies_versions() const {
  if (opts_.kind == engine_kind::sglang)
    return true;
  std::lock_guard lock{mutex_};
  return vllm_versions_.value_or(false);
}

std::optional<std::string> external_engine::route_refusal(std::string_view method,
                                                          std::string_view route) const {
  return stitch::route_refusal(dialect_->allowed, to_string(opts_.kind), method, route);
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
      {
        std::lock_guard state{mutex_};
        if (paused_)
          continue; // paused meanwhile (set under the control lock)
      }
      if (auto why = probe_health(opts_.control_timeout); !why.empty()) {
        unhealthy = "health check: " + why;
      } else if (verifies_versions()) {
        // SGLang's /model_info, or a vLLM's /weight_info (one that answers
        // 404 now is not the vLLM that had the route).
        auto v = opts_.kind == engine_kind::sglang
                   ? sglang_served_version(control(), opts_.control_timeout, closing_)
                   : vllm_served_version(control(), opts_.control_timeout, closing_);
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
