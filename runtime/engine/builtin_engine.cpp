#include "runtime/engine/builtin_engine.hpp"

#include <nlohmann/json.hpp>

#include "gpu/checksum.hpp"
#include "gpu/cpu_parallel.hpp"
#include "gpu/device.hpp"
#include "gpu/device_memory.hpp"
#include "runtime/core/checksum.hpp"
#include "runtime/core/constraint.hpp"
#include "runtime/engine/api_shapes.hpp"
#include "runtime/engine/device_fanout.hpp"
#include "runtime/engine/sampler.hpp"
#include <algorithm>
#include <chrono>
#include <mutex>
#include <random>
#include <set>

namespace stitch::engine {

struct builtin_engine::job {
  job(decoder d, std::function<bool()> c, std::function<void(const decoder&)> t)
      : dec(std::move(d)), cancelled(std::move(c)), on_token(std::move(t)) {}
  decoder dec;
  std::function<bool()> cancelled;
  /// Called on the decode loop after each step of this request.
  std::function<void(const decoder&)> on_token;
  /// Which served version produced which generated tokens.
  std::vector<version_span> spans;
  /// Which served version routed which fed positions (mixtures of experts).
  std::vector<version_span> routed_spans;
  std::promise<result<generation_output>> answer;
  /// Distinct per engine (0 = none yet); on a device, the KV slot it holds.
  uint64_t id = 0;
  int slot = -1;
};

builtin_engine::builtin_engine(model_config config)
    : builtin_engine(std::move(config), options{}) {}

builtin_engine::builtin_engine(model_config config, options opts)
    : config_(std::move(config)), opts_(opts), seed_salt_(std::random_device{}()) {
  seed_salt_ = (seed_salt_ << 32) ^ std::random_device{}();
  if (opts_.max_batch == 0)
    opts_.max_batch = 1;
  loop_ = std::thread{[this] { decode_loop(); }};
}

namespace {

/// Page locking a fresh buffer costs about as much as filling it: a released
/// version's host buffers are kept for the next version's tensors (an eighth
/// more than the weights, for the mappings' rounding to 2 MiB).
gpu::recycling_reservation recycling_for(uint64_t weights) {
  return {gpu::staging_allocator(), weights + weights / 8};
}

} // namespace

result<std::shared_ptr<builtin_engine>> builtin_engine::create(model_config config, options opts) {
  if (opts.device == engine_device::cpu && opts.device_copy_on_host) {
    auto parts = std::make_unique<device_parts>();
    parts->gpu = gpu::host_device;
    parts->name = gpu::device_name(gpu::host_device);
    auto stager = gpu::device_stager::create(gpu::host_device);
    if (!stager)
      return std::move(stager).error();
    parts->stager = std::move(*stager);
    // Host buffers recycle as on a device, so tests see stale recycled bytes.
    parts->recycling = recycling_for(device_budget_for(config, 1, 0).weights);
    auto engine = std::make_shared<builtin_engine>(std::move(config), opts);
    engine->device_ = std::move(parts);
    return engine;
  }
  if (opts.device == engine_device::cpu) {
    auto recycling = recycling_for(device_budget_for(config, 1, 0).weights);
    auto engine = std::make_shared<builtin_engine>(std::move(config), opts);
    engine->host_recycling_ = std::move(recycling);
    return engine;
  }
  auto refuse = [&](const stitch::error& e) {
    return make_error(e.code,
                      "engine.device = cuda (GPU " + std::to_string(opts.gpu) + "): " + e.message);
  };
  auto shape = llama_shape_of(config);
  if (!shape)
    return refuse(shape.error());
  if (auto ok = gpu::require_device(opts.gpu); !ok)
    return refuse(ok.error());
  auto memory = gpu::memory_info(opts.gpu);
  if (!memory)
    return refuse(memory.error());
  auto parts = std::make_unique<device_parts>();
  parts->gpu = opts.gpu;
  parts->name = gpu::device_name(opts.gpu);
  parts->memory_total = memory->total;
  const auto slots = static_cast<uint32_t>(std::max<size_t>(1, opts.max_batch));
  const gpu::device_stager::options ring;
  parts->budget = device_budget_for(config, slots, ring.chunk_bytes * ring.ring);
  if (auto ok = check_budget(parts->budget, memory->free,
                             "CUDA device " + std::to_string(opts.gpu) + " (" + parts->name + ")");
      !ok)
    return refuse(ok.error());
  auto runner = gpu::llama_runner::create(opts.gpu, *shape, slots);
  if (!runner)
    return refuse(runner.error());
  auto stager = gpu::device_stager::create(opts.gpu, ring);
  if (!stager)
    return refuse(stager.error());
  parts->runner = std::move(*runner);
  parts->stager = std::move(*stager);
  parts->slot_owner.assign(slots, 0);
  // Staging buffers are page-locked from now on, so what lands in them is
  // copied to the device by DMA, without a bounce.
  static std::once_flag pinned;
  std::call_once(pinned, [] {
    gpu::staging_allocator().add_registrar(std::make_shared<gpu::pinned_registrar>());
  });
  parts->recycling = recycling_for(parts->budget.weights);
  opts.max_batch = slots;
  auto engine = std::make_shared<builtin_engine>(std::move(config), opts);
  // No job can reach the decode loop before this returns.
  engine->device_ = std::move(parts);
  return engine;
}

builtin_engine::~builtin_engine() {
  device_fanout::instance().withdraw(this);
  {
    std::lock_guard guard{jobs_mutex_};
    stopping_ = true;
  }
  jobs_ready_.notify_all();
  // A paused engine must not hold the loop forever.
  {
    std::lock_guard guard{mutex_};
    paused_ = false;
  }
  resumed_.notify_all();
  loop_.join();
}

size_t builtin_engine::requests_in_flight() const {
  std::lock_guard guard{jobs_mutex_};
  return incoming_.size() + active_jobs_;
}

builtin_engine::batch_stats builtin_engine::stats() const {
  std::lock_guard guard{jobs_mutex_};
  return stats_;
}

void builtin_engine::decode_loop() {
  std::vector<std::shared_ptr<job>> active;
  for (;;) {
    {
      std::unique_lock lock{jobs_mutex_};
      jobs_ready_.wait(lock, [&] { return stopping_ || !incoming_.empty() || !active.empty(); });
      if (stopping_)
        break;
      // Newcomers join at this step, up to the batch limit.
      size_t room = opts_.max_batch - std::min(opts_.max_batch, active.size());
      size_t take = std::min(room, incoming_.size());
      active.insert(active.end(), std::make_move_iterator(incoming_.begin()),
                    std::make_move_iterator(incoming_.begin() + static_cast<ptrdiff_t>(take)));
      incoming_.erase(incoming_.begin(), incoming_.begin() + static_cast<ptrdiff_t>(take));
      active_jobs_ = active.size();
    }
    step_batch(active);
    std::lock_guard guard{jobs_mutex_};
    active_jobs_ = active.size();
  }
  std::lock_guard guard{jobs_mutex_};
  for (auto* list : {&active, &incoming_})
    for (auto& j : *list)
      j->answer.set_value(make_error(errc::engine_unavailable, "the engine shut down"));
  active.clear();
  incoming_.clear();
  active_jobs_ = 0;
}

void builtin_engine::step_batch(std::vector<std::shared_ptr<job>>& active) {
  auto finish_job = [](job& j) {
    auto out = std::move(j.dec).finish();
    out.spans = std::move(j.spans);
    out.routed_spans = std::move(j.routed_spans);
    j.answer.set_value(std::move(out));
  };
  // Cancelled requests leave before the step.
  std::erase_if(active, [&](const std::shared_ptr<job>& j) {
    if (j->cancelled && j->cancelled()) {
      j->dec.abort();
      finish_job(*j);
      return true;
    }
    return false;
  });
  if (active.empty())
    return;
  auto [w, served_version] = current_with_version();
  if (!w) {
    for (auto& j : active)
      j->answer.set_value(make_error(errc::engine_unavailable, "generate: no weights are served"));
    active.clear();
    return;
  }
  std::erase_if(active, [&](const std::shared_ptr<job>& j) {
    if (w->config == j->dec.config())
      return false;
    j->answer.set_value(
      make_error(errc::invalid_argument, "generate: the served weights changed shape mid-request"));
    return true;
  });
  std::vector<sequence*> batch;
  std::vector<int32_t> feed;
  batch.reserve(active.size());
  feed.reserve(active.size());
  for (auto& j : active) {
    batch.push_back(&j->dec.seq());
    feed.push_back(j->dec.next_token());
  }
  auto logits = device_ && device_->runner ? step_on_device(*w, active) : step(*w, batch, feed);
  const bool w_config_is_moe = w->config.is_moe();
  w.reset();
  {
    std::lock_guard guard{jobs_mutex_};
    ++stats_.steps;
    stats_.sequences_stepped += batch.size();
    stats_.largest_batch = std::max(stats_.largest_batch, batch.size());
  }
  if (!logits) {
    for (auto& j : active)
      j->answer.set_value(logits.error());
    active.clear();
    return;
  }
  for (size_t i = 0; i < active.size(); ++i) {
    if (w_config_is_moe) {
      // The position this step fed was routed by this version's router.
      auto& routed = active[i]->routed_spans;
      const auto row = static_cast<uint32_t>(active[i]->dec.seq().position - 1);
      if (routed.empty() || routed.back().version != served_version)
        routed.push_back({served_version, row, row});
      else
        routed.back().last_token = row;
    }
    const size_t before = active[i]->dec.progress().tokens.size();
    if (auto ok = active[i]->dec.on_logits((*logits)[i]); !ok) {
      active[i]->answer.set_value(std::move(ok).error());
      active[i].reset();
    } else {
      // A token sampled from this step's logits came from this version.
      auto& spans = active[i]->spans;
      for (size_t t = before; t < active[i]->dec.progress().tokens.size(); ++t) {
        const auto index = static_cast<uint32_t>(t);
        if (spans.empty() || spans.back().version != served_version)
          spans.push_back({served_version, index, index});
        else
          spans.back().last_token = index;
      }
      if (active[i]->on_token)
        active[i]->on_token(active[i]->dec);
      if (active[i]->dec.done()) {
        finish_job(*active[i]);
        active[i].reset();
      }
    }
  }
  std::erase(active, nullptr);
}

result<step_logits>
builtin_engine::step_on_device(const weights& w, const std::vector<std::shared_ptr<job>>& active) {
  auto& d = *device_;
  if (!w.device)
    return make_error(errc::engine_unavailable, "generate: the served weights have no device copy");
  // Slots of requests that left are free again; newcomers take free ones.
  std::set<uint64_t> present;
  for (const auto& j : active)
    present.insert(j->id);
  for (auto& owner : d.slot_owner)
    if (owner != 0 && !present.contains(owner))
      owner = 0;
  std::vector<gpu::llama_token> tokens;
  tokens.reserve(active.size());
  for (const auto& j : active) {
    if (j->slot < 0 || d.slot_owner[static_cast<size_t>(j->slot)] != j->id) {
      auto free = std::find(d.slot_owner.begin(), d.slot_owner.end(), uint64_t{0});
      if (free == d.slot_owner.end())
        return make_error(errc::limit_exceeded, "generate: every KV slot of the device is taken");
      *free = j->id;
      j->slot = static_cast<int>(free - d.slot_owner.begin());
    }
    const sequence& seq = j->dec.seq();
    if (seq.position >= w.config.max_position_embeddings)
      return make_error(errc::limit_exceeded, "step: a sequence is at max_position_embeddings "
                                                + std::to_string(w.config.max_position_embeddings));
    tokens.push_back({static_cast<uint32_t>(j->slot), seq.position, j->dec.next_token()});
  }
  const size_t vocab = w.config.vocab_size;
  std::vector<float> flat(tokens.size() * vocab);
  if (auto ok = d.runner->step(w.device->pointers, tokens, flat); !ok)
    return std::move(ok).error();
  step_logits out(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    out[i].assign(flat.begin() + static_cast<ptrdiff_t>(i * vocab),
                  flat.begin() + static_cast<ptrdiff_t>((i + 1) * vocab));
    ++active[i]->dec.seq().position;
  }
  return out;
}

engine_device_usage builtin_engine::device_usage() {
  if (!device_) {
    // The CPU: no device memory; its host buffers recycle all the same.
    engine_device_usage u;
    const auto recycled = gpu::staging_allocator().recycling();
    u.host_recycled_kept_bytes = recycled.kept_bytes;
    u.host_recycled_bytes_total = recycled.reused_bytes;
    return u;
  }
  engine_device_usage u;
  u.device = device_->runner ? "cuda:" + std::to_string(device_->gpu) : "host";
  u.name = device_->name;
  u.memory_total = device_->memory_total;
  u.memory_used = device_->budget.workspace + device_->budget.staging;
  std::set<const gpu::device_buffer*> counted;
  auto add = [&](const std::shared_ptr<const weights>& w) {
    if (!w || !w->device)
      return;
    for (const auto& [name, b] : w->device->buffers)
      if (counted.insert(b.get()).second)
        u.memory_used += b->size();
  };
  {
    std::lock_guard guard{mutex_};
    add(serving_);
    add(retired_weights_);
    if (shadow_)
      add(shadow_->prepared);
  }
  auto c = device_->stager->stats();
  u.staged_bytes_total = c.bytes_copied + c.bytes_xored;
  u.staging_seconds_total = c.busy_seconds;
  const auto recycled = gpu::staging_allocator().recycling();
  u.host_recycled_kept_bytes = recycled.kept_bytes;
  u.host_recycled_bytes_total = recycled.reused_bytes;
  return u;
}

std::shared_ptr<const weights> builtin_engine::served() const {
  std::lock_guard guard{mutex_};
  return serving_;
}

std::shared_ptr<const weights> builtin_engine::current() {
  return current_with_version().first;
}

std::pair<std::shared_ptr<const weights>, uint64_t> builtin_engine::current_with_version() {
  std::unique_lock lock{mutex_};
  resumed_.wait(lock, [&] { return !paused_; });
  return {serving_, serving_ref_ ? serving_ref_->version : 0};
}

status builtin_engine::prefetch(const chain_plan& plan) {
  std::lock_guard guard{mutex_};
  if (!plan.anchor && !serving_ && !shadow_)
    return make_error(errc::invalid_argument, "cannot prepare " + to_string(plan.target)
                                                + ": the plan builds on weights this engine lacks");
  return {};
}

void builtin_engine::discard_shadow() {
  std::optional<shadow> dropped;
  std::lock_guard guard{mutex_};
  dropped.swap(shadow_);
}

status builtin_engine::commit() {
  std::lock_guard guard{mutex_};
  if (!shadow_)
    return make_error(errc::invalid_argument, "nothing is staged to activate");
  // One pointer swap; the replaced weights are freed later, outside the
  // pause (requests still stepping on them keep them alive meanwhile).
  retired_weights_ = std::exchange(serving_, std::move(shadow_->prepared));
  serving_ref_ = shadow_->target;
  shadow_.reset();
  if (device_)
    device_fanout::instance().offer(this, *serving_ref_, device_->gpu, serving_->device);
  return {};
}

void builtin_engine::relabel(const version_ref& ref) {
  std::lock_guard guard{mutex_};
  if (serving_) {
    serving_ref_ = ref;
    if (device_)
      device_fanout::instance().offer(this, ref, device_->gpu, serving_->device);
  }
}

std::optional<host_weights> builtin_engine::host_view() {
  std::lock_guard guard{mutex_};
  if (!serving_ || !serving_ref_)
    return std::nullopt;
  host_weights out;
  out.version = *serving_ref_;
  for (const auto& [name, t] : serving_->tensors)
    out.tensors.push_back({name, t->bytes.bytes()});
  out.keep = serving_;
  return out;
}

status builtin_engine::pause() {
  std::lock_guard guard{mutex_};
  paused_ = true;
  return {};
}

status builtin_engine::resume() {
  {
    std::lock_guard guard{mutex_};
    paused_ = false;
  }
  resumed_.notify_all();
  return {};
}

status builtin_engine::flush_cache() {
  // KV caches live in each request and follow its weights; the built-in engine
  // keeps no cache across requests, so there is nothing to flush.
  return {};
}

model_config builtin_engine::served_config() const {
  auto w = served();
  return w ? w->config : config_;
}

status builtin_engine::reset_to_boot(const version_ref& ref, tensor_source& source) {
  if (auto ok = stage(boot_plan(ref), false, source); !ok)
    return ok;
  return commit();
}

uint64_t builtin_engine::seed_for(uint64_t request_id) const noexcept {
  uint64_t z = seed_salt_ ^ (request_id * 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

result<generation_output> builtin_engine::run(decoder d, const std::function<bool()>& cancelled,
                                              std::function<void(const decoder&)> on_token) {
  if (d.done())
    return std::move(d).finish();
  auto j = std::make_shared<job>(std::move(d), cancelled, std::move(on_token));
  auto answer = j->answer.get_future();
  {
    std::lock_guard guard{jobs_mutex_};
    if (stopping_)
      return make_error(errc::engine_unavailable, "the engine is shutting down");
    j->id = next_job_id_++;
    incoming_.push_back(std::move(j));
  }
  jobs_ready_.notify_one();
  return answer.get();
}

result<generation_result> builtin_engine::generate(const generation_request& request,
                                                   const std::function<bool()>& cancelled) {
  sampling_options options;
  options.temperature = request.sampling.temperature;
  options.top_k = request.sampling.top_k;
  options.top_p = request.sampling.top_p;
  options.seed = request.sampling.seed ? *request.sampling.seed : seed_for(request.id);
  options.max_tokens = request.sampling.max_new_tokens;
  options.stop = request.sampling.stop;
  auto started = decoder::start(served_config(), tokenizer_, request.prompt, options);
  if (!started)
    return std::move(started).error();
  auto out = run(std::move(*started), cancelled, {});
  if (!out)
    return std::move(out).error();
  generation_result r;
  r.tokens = std::move(out->tokens);
  r.text = std::move(out->text);
  if (request.return_logprob)
    r.logprobs = std::move(out->logprobs);
  r.finish = out->finish_reason == "stop"     ? finish_reason::stop
             : out->finish_reason == "length" ? finish_reason::length
                                              : finish_reason::abort;
  r.prompt_tokens = out->prompt_tokens;
  r.spans = std::move(out->spans);
  return r;
}

namespace {

/// The longest prefix of `text` (at most `n` bytes) that does not end inside
/// a UTF-8 sequence.
size_t utf8_boundary(std::string_view text, size_t n) {
  size_t cut = n;
  size_t back = 0;
  while (cut > 0 && back < 4 && (static_cast<unsigned char>(text[cut - 1]) & 0xC0) == 0x80) {
    --cut;
    ++back;
  }
  if (cut == 0)
    return n;
  auto lead = static_cast<unsigned char>(text[cut - 1]);
  size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return need > back + 1 ? cut - 1 : n;
}

} // namespace

result<engine_reply> builtin_engine::forward(const engine_call& call, const event_sink& on_event,
                                             const std::function<bool()>& cancelled) {
  engine_reply reply;
  auto kind = api_kind_of(call.route);
  if (!kind) {
    nlohmann::ordered_json j;
    if (call.method == "GET" && call.route == "/v1/models") {
      nlohmann::ordered_json model;
      model["id"] = "stitch-builtin";
      model["object"] = "model";
      model["owned_by"] = "stitch";
      j["object"] = "list";
      j["data"] = nlohmann::ordered_json::array({model});
    } else if (call.method == "GET" && call.route == "/get_model_info") {
      j["model_path"] = "stitch-builtin";
      j["is_generation"] = true;
      j["config"] =
        nlohmann::ordered_json::parse(render_model_config(served_config()), nullptr, false);
    } else {
      reply.status = 404;
      reply.body = error_json(
        "NotFound",
        "the built-in engine serves no " + call.method + " " + quote_untrusted(call.route), false);
      return reply;
    }
    reply.body = j.dump();
    return reply;
  }
  if (call.method != "POST")
    return make_error(errc::invalid_argument, call.route + " takes POST");
  auto req = parse_api_request(*kind, call.body);
  if (!req)
    return std::move(req).error();
  if (!req->seeded)
    req->sampling.seed = seed_for(call.id);
  if (req->model.empty())
    req->model = "stitch-builtin";
  const model_config served_arch = served_config();
  if (req->return_routed_experts && !served_arch.is_moe())
    return make_error(errc::invalid_argument,
                      "return_routed_experts: the served model has no experts (model_type "
                        + std::string(to_string(served_arch.arch)) + ")");
  auto started = decoder::start(served_arch, tokenizer_, req->prompt, req->sampling);
  if (!started)
    return std::move(started).error();
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  size_t holdback = 0;
  for (const auto& stop : req->sampling.stop)
    holdback = std::max(holdback, stop.size() - 1);
  size_t released = 0;
  std::function<void(const decoder&)> on_token;
  if (req->stream && on_event) {
    // Text that may still turn out to start a stop string is held back.
    on_token = [&](const decoder& d) {
      const std::string& text = d.progress().text;
      if (d.done() || text.size() <= released + holdback)
        return;
      size_t upto = utf8_boundary(text, text.size() - holdback);
      if (upto <= released)
        return;
      on_event(render_stream_event(*req, call.tag, created, std::string_view{text}.substr(0, upto),
                                   std::string_view{text}.substr(released, upto - released)));
      released = upto;
    };
  }
  auto out = run(std::move(*started), cancelled, std::move(on_token));
  if (!out)
    return std::move(out).error();
  api_output o;
  o.tokens = std::move(out->tokens);
  o.logprobs = std::move(out->logprobs);
  o.text = std::move(out->text);
  o.finish_reason = out->finish_reason;
  o.prompt_tokens = out->prompt_tokens;
  o.spans = std::move(out->spans);
  if (req->return_routed_experts) {
    o.routed_experts = std::move(out->routed_experts);
    o.routed_spans = std::move(out->routed_spans);
  }
  if (!o.spans.empty())
    reply.last_token_version = o.spans.back().version;
  reply.finish_reason = o.finish_reason;
  reply.stream = req->stream;
  if (req->stream) {
    std::string_view rest =
      released <= o.text.size() ? std::string_view{o.text}.substr(released) : std::string_view{};
    reply.body = render_stream_final(*req, o, call.tag, created, rest);
  } else {
    reply.body = render_response(*req, o, call.tag, created);
  }
  return reply;
}

std::string builtin_engine::stamp_request(std::string_view route, std::string_view body,
                                          const version_ref& served) {
  // The engine's cache key namespace: entries of other weights never match.
  return namespace_cache(route, body, "extra_key", to_string(served));
}

std::string builtin_engine::stamp_response(std::string_view route, std::string_view body,
                                           const stamps& s, std::string_view run_id) {
  return stamp_answer(route, body, s, run_id);
}

engine_health builtin_engine::health() {
  std::lock_guard guard{mutex_};
  if (!serving_)
    return {false, "builtin: no weights activated yet"};
  std::string what = "builtin: serves " + (serving_ref_ ? to_string(*serving_ref_) : "weights");
  if (paused_)
    return {true, what + " (paused for an activation)"};
  return {true, what};
}

std::optional<std::string> builtin_engine::route_refusal(std::string_view, std::string_view) const {
  // The built-in engine has no HTTP control routes: it answers what it
  // serves (`forward`) and 404 for the rest.
  return std::nullopt;
}

} // namespace stitch::engine
