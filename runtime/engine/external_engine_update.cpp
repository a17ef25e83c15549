// The external engine's weight-update cycle: staging a version as a Hugging
// Face directory while the engine serves, then pause, load, verify, resume.
#include "runtime/engine/external_engine.hpp"
#include "runtime/engine/peer_frames.hpp"

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

// ---- the weight-update cycle, per engine -----------------------------------

namespace {

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

status external_engine::sglang_load(const fs::path& dir, const std::string& id) {
  // The caller holds control_mutex_.
  auto& c = control();
  // managers/io_struct.py UpdateWeightFromDiskReqInput: `keep_pause`, or
  // a paused scheduler runs again as soon as the weights are loaded (before
  // Stitch verified them and resumed); `load_format`, or the server's own
  // applies (`--load-format dummy`, common in RL launches, would load
  // random weights under the right name). Releases before them ignore both.
  json body = {{"model_path", dir.string()},  {"weight_version", id},
               {"abort_all_requests", false}, {"flush_cache", false},
               {"keep_pause", true},          {"load_format", "safetensors"}};
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

status external_engine::load_and_verify(const staged& s, bool partial) {
  const std::string id = weight_version_of(s.ref);
  const auto started = std::chrono::steady_clock::now();
  engine_load_report report{"full", s.full_reason, s.total_tensors, s.total_bytes, 0};
  auto finish = [&](status ok) {
    report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::lock_guard state{mutex_};
    if (ok)
      last_load_ = report;
    return ok;
  };
  std::lock_guard lock{control_mutex_};
  auto& c = control();
  if (opts_.kind == engine_kind::sglang) {
    if (!partial) {
      if (report.detail.empty())
        report.detail = s.partial_dir.empty()
                          ? "every tensor loaded"
                          : "the engine does not serve " + to_string(s.partial_base)
                              + " verified, which the changed tensors apply to";
      return finish(sglang_load(s.dir, id));
    }
    // Only the changed tensors: SGLang's update_weights_from_disk hands the
    // folder's weights to the model's load_weights, which writes each into
    // its (fused, sharded) parameter in place and leaves the others alone.
    if (auto ok = sglang_load(s.partial_dir, id); !ok)
      return finish(ok);
    std::string unanswerable;
    auto checked = read_back(s, &unanswerable);
    if (checked) {
      report = {"partial",
                std::to_string(s.partial_tensors.size()) + " changed tensors loaded and read back",
                s.partial_tensors.size(), s.partial_bytes, 0};
      return finish(checked);
    }
    if (unanswerable.empty())
      return finish(checked);
    // The engine cannot read its weights back for this model: a partial
    // load cannot be verified, so this and later loads are full ones.
    {
      std::lock_guard state{mutex_};
      partial_off_ = "partial reloads are off: " + unanswerable;
    }
    if (opts_.log)
      opts_.log(describe() + ": " + unanswerable + "; loading " + id
                + " in full, and every later version too");
    report.detail = "partial reloads are off: " + unanswerable;
    return finish(sglang_load(s.dir, id));
  }
  if (report.detail.empty())
    report.detail = "every tensor loaded";
  // vLLM: the reload answering 200 with one result per worker (none of
  // them an error), then the version named through its weight-version
  // routes and read back. A vLLM without them (before 2026) has only the
  // reload's answer as the verification, and `health` says so.
  json body = {{"method", "reload_weights"},
               {"kwargs", {{"weights_path", s.dir.string()}, {"is_checkpoint_format", true}}}};
  auto r = call_json(c, "POST", "/collective_rpc", dump(body), opts_.update_timeout, closing_);
  if (auto ok = expect_success(r, describe() + " /collective_rpc reload_weights"); !ok)
    return finish(ok);
  json doc;
  if (!r->body.empty()
      && (!is_json_object_text(r->body, &doc) || !doc.contains("results")
          || !doc["results"].is_array()))
    return finish(
      make_error(errc::activation_failed, describe() + " /collective_rpc reload_weights answered "
                                            + excerpt(r->body) + " (no results list)"));
  auto named = call_json(c, "POST", "/update_weight_version", dump(json{{"new_version", id}}),
                         opts_.control_timeout, closing_);
  if (!named)
    return finish(make_error(errc::activation_failed,
                             describe() + " /update_weight_version: " + named.error().message));
  if (named->status == 404) {
    bool news = false;
    {
      std::lock_guard state{mutex_};
      news = vllm_versions_.value_or(true);
      vllm_versions_ = false;
    }
    if (news && opts_.log) // logged outside the lock, once per change
      opts_.log(describe()
                + " has no weight-version routes (/update_weight_version answered 404): its "
                  "reloads are trusted on their answer alone");
    return finish({});
  }
  if (auto ok = expect_success(named, describe() + " /update_weight_version"); !ok)
    return finish(ok);
  auto now = vllm_served_version(c, opts_.control_timeout, closing_);
  if (!now)
    return finish(make_error(errc::activation_failed, describe() + ": " + now.error().message));
  if (*now != id)
    return finish(make_error(errc::activation_failed, describe() + " reports weight_version "
                                                        + excerpt(*now) + " after loading " + id));
  {
    std::lock_guard state{mutex_};
    vllm_versions_ = true;
  }
  return finish({});
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
  staged next;
  next.ref = plan.target;
  next.dir = opts_.staging_dir / folder_of(plan.target);
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
  // The staged folder's tensors, read once for the reports and the partial folder.
  auto ckpt = pipeline::open_hf_directory(next.dir);
  if (!ckpt)
    return std::move(ckpt).error();
  next.total_tensors = ckpt->tensors.size();
  next.total_bytes = ckpt->total_size;
  next.full_reason = partial_refusal(plan, base, onto_shadow, next, *ckpt);
  if (next.full_reason.empty())
    if (auto ok = write_partial(next, plan, base->ref, *target, *ckpt); !ok)
      return ok;
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
  std::map<std::string, uint64_t, std::less<>> base_sizes;
  for (const auto& [name, t] : ckpt->tensors)
    base_sizes.emplace(name, t.size);
  std::vector<manifest> deltas;
  auto choice = choose_for_stage(plan, source, base_sizes, deltas);
  if (deltas.size() != plan.deltas.size()) {
    auto m = source.manifest_of(plan.deltas[deltas.size()]);
    return m ? make_error(errc::corrupt_data, "the chain's manifests changed while read")
             : std::move(m).error();
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
  // The deltas' frames from peers when they are the fewest bytes; the
  // store gives what they did not.
  if (auto* peers = source.peers(); peers && choice.how == peer_fetch::frames)
    read = peer_frames::fetch(*peers, deltas).reader(std::move(read));
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
    if (!plan.touched.contains(name)) // unchanged: its bytes as staged (verified then)
      return pipeline::stream_tensor(*ckpt, name, piece, sink);
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
  auto ok = expect_success(r, describe() + " pause");
  if (ok) {
    // Set before the control lock is released: the monitor, which waits
    // for that lock, sees the pause and does not probe a paused engine
    // (SGLang's /health answers 503 while paused).
    std::lock_guard state{mutex_};
    paused_ = true;
  }
  return ok;
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
  return pause_engine();
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
  bool partial = false;
  {
    std::lock_guard lock{mutex_};
    if (!shadow_)
      return make_error(errc::invalid_argument, "nothing is staged to activate");
    next = *shadow_;
    started = process_ && process_->running();
    // The changed tensors apply only over the version they were computed
    // against, verified as what the engine serves.
    partial = !next->partial_dir.empty() && partial_off_.empty() && in_sync_ && committed_
              && committed_->ref == next->partial_base;
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
    partial = false;
  }
  if (ok)
    ok = load_and_verify(*next, partial);
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
      if (*s) {
        keep.insert((*s)->dir.filename().string());
        keep.insert((*s)->partial_dir.filename().string());
      }
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

} // namespace stitch::engine
