// builtin_engine::stage: one stage as a job whose steps carry out the
// per-tensor decisions of `stage_ledger` (runtime/core/stage_plan).

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "gpu/checksum.hpp"
#include "gpu/cpu_parallel.hpp"
#include "gpu/device.hpp"
#include "runtime/core/checksum.hpp"
#include "runtime/core/stage_plan.hpp"
#include "runtime/engine/builtin_engine.hpp"
#include "runtime/engine/device_fanout.hpp"
#include "runtime/engine/peer_frames.hpp"
#include "runtime/pipeline/materialize.hpp"
#include "runtime/pipeline/stage_meter.hpp"

namespace stitch::engine {

namespace {

/// How long a stage waits for another GPU of this process that is fetching
/// the same version before fetching it itself.
constexpr std::chrono::milliseconds local_gpu_patience{std::chrono::minutes{2}};

using buffers = std::vector<std::shared_ptr<tensor_buffer>>;

} // namespace

/// One stage. The base is an anchor read afresh (straight into its buffers),
/// the shadow staged so far, or the serving tensors, shared; tensors a delta
/// changes are copied first, the others stay shared with the serving
/// weights. A failure at any step drops whatever was staged. The members'
/// order is their teardown's, reversed: the staging pipeline is waited for
/// before the buffers it reads or writes go.
struct builtin_engine::stage_job {
  stage_job(builtin_engine& e, const chain_plan& p, tensor_source& s)
      : engine(e), plan(p), source(s),
        ledger(p), pipeline{e.device_ ? e.device_->stager.get() : nullptr} {
    read = [&src = source](const version_ref& ref, std::string_view tensor, uint64_t offset,
                           std::span<std::byte> out) { return src.read(ref, tensor, offset, out); };
  }

  builtin_engine& engine;
  const chain_plan& plan;
  tensor_source& source;
  pipeline::range_reader read;
  /// The chain's delta manifests when choosing what to ask peers for read
  /// them already (in the plan's order; empty otherwise).
  std::vector<manifest> delta_manifests;
  stage_ledger ledger;
  manifest target;
  tensor_map tensors;
  /// Buffers this stage made, which it may change in place.
  std::map<std::string, std::shared_ptr<tensor_buffer>> own;
  /// On a device, the same tensors there: the base's shared, or made by this
  /// stage (`dev_own`, which it may change).
  std::map<std::string, std::shared_ptr<const gpu::device_buffer>> dev;
  std::map<std::string, std::shared_ptr<gpu::device_buffer>> dev_own;
  struct pipeline_guard {
    gpu::device_stager* stager;
    ~pipeline_guard() {
      if (stager)
        (void) stager->finish();
    }
  } pipeline;
  /// On a device: another GPU of this process that holds (or fetches) the
  /// target, whose tensors come from it over NCCL.
  std::optional<device_fanout::holding> on_local_gpu;
  /// When this stage fetches the target for the node, the others waiting
  /// for it hear how it ended (the weights are handed over on success).
  struct fanout_guard {
    const void* owner = nullptr;
    version_ref ref;
    int gpu = 0;
    ~fanout_guard() {
      if (owner)
        device_fanout::instance().staged(owner, ref, gpu, nullptr);
    }
  } fetching_for_node;
  /// A pool of this stage's own: the reads may be requests to actors (a
  /// store on another node), which must not run on the process-wide pool's
  /// threads (they outlive the actor system).
  std::optional<gpu::thread_pool> pool;

  device_parts* device() const { return engine.device_.get(); }

  status read_target() {
    auto m = source.manifest_of(plan.target);
    if (!m)
      return std::move(m).error();
    target = std::move(*m);
    if (device()) {
      on_local_gpu = device_fanout::instance().join(plan.target, &engine, local_gpu_patience);
      if (!on_local_gpu)
        fetching_for_node = {&engine, plan.target, device()->gpu};
    }
    return {};
  }

  /// The device copy of a host tensor this stage holds.
  status to_device(const tensor_buffer& t) {
    auto made = gpu::device_buffer::allocate(device()->gpu, t.bytes.size());
    if (!made)
      return std::move(made).error();
    auto buf = std::make_shared<gpu::device_buffer>(std::move(*made));
    if (auto ok = device()->stager->write(*buf, 0, t.bytes.bytes(), true); !ok)
      return ok;
    dev_own[t.name] = buf;
    dev[t.name] = buf;
    return {};
  }

  void keep(const std::shared_ptr<tensor_buffer>& t) {
    own[t->name] = t;
    tensors[t->name] = t;
  }

  /// Whole tensors from holders of the target, each chunk verified against
  /// the target's manifest: neither read from the store nor patched.
  void from_peers(const buffers& wanted) {
    auto* peers = source.peers();
    if (!peers || wanted.empty())
      return;
    std::vector<fetch_target> targets;
    buffers asked;
    for (const auto& b : wanted)
      if (auto c = target.checksums.find(b->name); c != target.checksums.end()) {
        targets.push_back({b->name, b->bytes.bytes(), c->second, b});
        asked.push_back(b);
      }
    auto report = peers->fetch(plan.target, targets, {});
    for (size_t i = 0; i < asked.size(); ++i)
      if (i < report.fetched.size() && report.fetched[i]) {
        ledger.arrived(asked[i]->name, tensor_arrival::whole_from_holder);
        keep(asked[i]);
      }
  }

  /// On a device: tensors another GPU of this process already holds come
  /// from it over NCCL (verified on the device like any others); the host
  /// copy peers read is made from it. If the broadcast fails, the other
  /// sources serve. Those taken leave `wanted`.
  status from_local_gpu(buffers& wanted) {
    if (!on_local_gpu || wanted.empty())
      return {};
    auto stream = gpu::device_stream::create(device()->gpu);
    if (!stream)
      return std::move(stream).error();
    for (auto& b : wanted) {
      if (!target.checksums.contains(b->name))
        continue;
      auto taken = device_fanout::instance().take(*on_local_gpu, b->name, device()->gpu);
      if (!taken) {
        on_local_gpu.reset();
        break;
      }
      if (auto ok = gpu::copy_to_host(b->bytes.bytes(), **taken, 0, *stream); !ok)
        return ok;
      engine.from_local_gpus_ += b->bytes.size();
      ledger.arrived(b->name, tensor_arrival::from_local_gpu);
      keep(b);
      dev_own[b->name] = *taken;
      dev[b->name] = *taken;
    }
    if (auto ok = stream->synchronize(); !ok)
      return ok;
    std::erase_if(wanted, [&](const auto& b) { return !ledger.needs_patch(b->name); });
    return {};
  }

  /// Fresh buffers for the tensors the ledger wants whole, among `names`,
  /// shaped as `shape_of` says.
  template <class ShapeOf>
  result<buffers> fresh_buffers(const std::vector<std::string>& names, ShapeOf shape_of) {
    buffers out;
    for (const auto& name : ledger.wanted_whole(names)) {
      auto [type, shape] = shape_of(name);
      auto t = make_tensor_buffer(name, type, std::move(shape));
      if (!t)
        return std::move(t).error();
      out.push_back(std::move(*t));
    }
    return out;
  }

  /// Seeding: every tensor of the anchor, from another local GPU, holders,
  /// or the store (on a device, each piece read goes on to the device while
  /// the next is read: a large tensor's copy overlaps its own fetch).
  status take_anchor() {
    auto anchor = source.manifest_of(*plan.anchor);
    if (!anchor)
      return std::move(anchor).error();
    auto specs = pipeline::read_tensor_specs(*anchor);
    if (!specs)
      return std::move(specs).error();
    std::map<std::string, safetensors::tensor_info> by_name;
    std::vector<std::string> names;
    for (auto& info : *specs) {
      names.push_back(info.name);
      by_name.emplace(info.name, std::move(info));
    }
    auto made = fresh_buffers(names, [&](const std::string& name) {
      auto& spec = by_name.at(name);
      return std::pair{spec.type, std::move(spec.shape)};
    });
    if (!made)
      return std::move(made).error();
    auto& all = *made;
    if (auto ok = from_local_gpu(all); !ok)
      return ok;
    from_peers(all);
    for (auto& t : all) {
      if (ledger.whole(t->name)) {
        if (device())
          if (auto ok = to_device(*t); !ok)
            return ok;
        continue;
      }
      if (auto ok = read_anchor_tensor(anchor->ref, *t); !ok)
        return ok;
      own.emplace(t->name, t);
      tensors.emplace(t->name, t);
    }
    return {};
  }

  status read_anchor_tensor(const version_ref& anchor, tensor_buffer& t) {
    if (!device())
      return source.read(anchor, t.name, 0, t.bytes.bytes());
    auto made = gpu::device_buffer::allocate(device()->gpu, t.bytes.size());
    if (!made)
      return std::move(made).error();
    auto buf = std::make_shared<gpu::device_buffer>(std::move(*made));
    const auto all = t.bytes.bytes();
    const size_t step = std::max<size_t>(engine.opts_.device_read_piece, 1);
    for (size_t at = 0; at < all.size(); at += step) {
      auto piece = all.subspan(at, std::min(step, all.size() - at));
      if (auto ok = source.read(anchor, t.name, at, piece); !ok)
        return ok;
      if (auto ok = device()->stager->write(*buf, at, piece, true); !ok)
        return ok;
    }
    dev_own[t.name] = buf;
    dev[t.name] = buf;
    return {};
  }

  /// Building on: the shadow staged so far, or the serving tensors, shared.
  status take_base(bool onto_shadow) {
    std::lock_guard guard{engine.mutex_};
    auto& shadow = engine.shadow_;
    if (onto_shadow) {
      if (!shadow)
        return make_error(errc::invalid_argument,
                          "no staged shadow to continue to " + to_string(plan.target));
      tensors = shadow->prepared->tensors;
      if (shadow->prepared->device)
        dev = shadow->prepared->device->buffers;
      shadow.reset();
    } else {
      if (!engine.serving_)
        return make_error(errc::invalid_argument,
                          "nothing is served to build " + to_string(plan.target) + " on");
      shadow.reset();
      tensors = engine.serving_->tensors;
      if (engine.serving_->device)
        dev = engine.serving_->device->buffers;
    }
    if (device() && dev.size() != tensors.size())
      return make_error(errc::invalid_argument, "the weights to build " + to_string(plan.target)
                                                  + " on have no complete device copy");
    return {};
  }

  /// Building on: the tensors the chain changes, whole, from holders of the
  /// target (another local GPU first); only those of `among` when given.
  status touched_from_holders(const std::optional<std::set<std::string>>& among = std::nullopt) {
    if (!source.peers() && !on_local_gpu)
      return {};
    std::vector<std::string> names;
    for (const auto& [name, t] : tensors)
      if (!among || among->contains(name))
        names.push_back(name);
    if (names.empty())
      return {};
    auto made = fresh_buffers(names, [&](const std::string& name) {
      const auto& t = *tensors.at(name);
      return std::pair{t.type, t.shape};
    });
    if (!made)
      return std::move(made).error();
    if (auto ok = from_local_gpu(*made); !ok)
      return ok;
    from_peers(*made);
    if (device())
      for (const auto& name : ledger.from_holders())
        if (auto ok = to_device(*own.at(name)); !ok)
          return ok;
    return {};
  }

  /// Building on: the chain's delta frames from their holders, when they
  /// are fewer bytes than the tensors they touch (`choose_peer_fetch`); the
  /// deltas then read them from memory. Answers the touched tensors some of
  /// whose frames no holder gave (asked for whole next, else patched from
  /// the store's frames), or nullopt when whole tensors are the better ask
  /// (or there are no peers, or another local GPU holds the target).
  std::optional<std::set<std::string>> frames_from_peers() {
    auto* peers = source.peers();
    if (!peers || on_local_gpu)
      return std::nullopt;
    std::map<std::string, uint64_t, std::less<>> sizes;
    for (const auto& [name, t] : tensors)
      sizes.emplace(name, t->bytes.size());
    auto choice = choose_for_stage(plan, source, sizes, delta_manifests);
    if (delta_manifests.size() != plan.deltas.size())
      delta_manifests.clear(); // apply_deltas reads them and meets the error
    if (choice.how != peer_fetch::frames)
      return std::nullopt;
    auto frames = peer_frames::fetch(*peers, delta_manifests);
    read = frames.reader(std::move(read));
    return frames.missing(delta_manifests);
  }

  struct patch {
    std::string name;
    /// The bytes to copy first (a tensor still shared with the base).
    std::shared_ptr<const tensor_buffer> base;
    std::shared_ptr<tensor_buffer> into;
  };

  /// The tensors of `delta` still to patch, each made this stage's own.
  result<std::vector<patch>> patches_of(const manifest& delta) {
    std::vector<patch> patches;
    patches.reserve(delta.touched.size());
    for (const auto& name : delta.touched) {
      if (!ledger.needs_patch(name))
        continue;
      auto it = tensors.find(name);
      if (it == tensors.end())
        return make_error(errc::corrupt_data, to_string(delta.ref) + " changes tensor '" + name
                                                + "', which its base lacks");
      patch p{name, nullptr, nullptr};
      auto mine = own.find(name);
      if (mine == own.end()) {
        p.base = it->second;
        auto copy = make_tensor_buffer(p.base->name, p.base->type, p.base->shape);
        if (!copy)
          return std::move(copy).error();
        it->second = *copy;
        mine = own.emplace(name, std::move(*copy)).first;
      }
      p.into = mine->second;
      ledger.patched(name);
      patches.push_back(std::move(p));
    }
    return patches;
  }

  /// On a device: each patched tensor's device copy starts as its base's,
  /// and every decoded piece is applied to it there as it is to the host's.
  result<std::vector<pipeline::decoded_sink>> device_sinks(const std::vector<patch>& patches) {
    std::vector<pipeline::decoded_sink> sinks(device() ? patches.size() : 0);
    for (size_t i = 0; i < sinks.size(); ++i) {
      const auto& name = patches[i].name;
      auto mine = dev_own.find(name);
      if (mine == dev_own.end()) {
        auto base = dev.find(name);
        if (base == dev.end() || !base->second)
          return make_error(errc::invalid_argument,
                            "tensor '" + name + "' has no device copy to patch");
        auto made = gpu::device_buffer::allocate(device()->gpu, base->second->size());
        if (!made)
          return std::move(made).error();
        auto buf = std::make_shared<gpu::device_buffer>(std::move(*made));
        if (auto ok = device()->stager->copy(*buf, *base->second); !ok)
          return ok.error();
        mine = dev_own.emplace(name, buf).first;
        dev[name] = buf;
      }
      sinks[i].piece = [stager = device()->stager.get(),
                        buf = mine->second](uint64_t offset, std::span<const std::byte> decoded,
                                            delta_encoding encoding) {
        return encoding == delta_encoding::xor_bytes ? stager->xor_apply(*buf, offset, decoded)
                                                     : stager->write(*buf, offset, decoded);
      };
    }
    return sinks;
  }

  /// Each delta's tensors are independent: copied (those still shared with
  /// the base) and patched on the stage's pool, one tensor per task.
  status apply_deltas() {
    // The anchor's host bytes are copied to the device where they lie; the
    // deltas patch them in place, so those copies are done first.
    if (device() && !plan.deltas.empty())
      if (auto ok = device()->stager->finish(); !ok)
        return ok;
    for (size_t k = 0; k < plan.deltas.size(); ++k) {
      if (!pool)
        pool.emplace();
      auto delta = k < delta_manifests.size() ? result<manifest>{delta_manifests[k]}
                                              : source.manifest_of(plan.deltas[k]);
      if (!delta)
        return std::move(delta).error();
      auto patches = patches_of(*delta);
      if (!patches)
        return std::move(patches).error();
      pool->run(patches->size(), [&](size_t i) {
        const auto& p = (*patches)[i];
        if (p.base && p.base->bytes.size() > 0)
          std::memcpy(p.into->bytes.data(), p.base->bytes.data(), p.base->bytes.size());
      });
      auto sinks = device_sinks(*patches);
      if (!sinks)
        return std::move(sinks).error();
      std::vector<status> outcomes(patches->size());
      {
        // Decoding: the pool's workers keep no phase meter, so the frames
        // they read count as decode (those the stage's own thread reads as
        // fetch).
        pipeline::phase_scope decoding{pipeline::stage_phase::decode};
        pool->run(patches->size(), [&](size_t i) {
          thread_local std::vector<std::byte> scratch;
          if (scratch.empty())
            scratch.resize(size_t{8} << 20);
          auto& p = (*patches)[i];
          outcomes[i] = pipeline::apply_delta(read, *delta, p.name, p.into->bytes.bytes(), scratch,
                                              sinks->empty() ? nullptr : &(*sinks)[i]);
        });
      }
      for (auto& outcome : outcomes)
        if (!outcome)
          return outcome;
    }
    if (device())
      if (auto ok = device()->stager->finish(); !ok)
        return ok;
    return {};
  }

  /// Nothing is activated unless it is exactly what was published: on a
  /// device, the bytes there are what is checked.
  status verify() {
    pipeline::phase_scope verifying{pipeline::stage_phase::verify};
    for (const auto& [name, expected] : target.checksums) {
      auto it = tensors.find(name);
      if (it == tensors.end())
        return make_error(errc::corrupt_data, to_string(plan.target) + " has tensor '" + name
                                                + "', which the staged weights lack");
      if (ledger.check(name) == tensor_check::none)
        continue;
      uint64_t got = 0;
      if (device()) {
        auto on_device = device()->stager->checksum(*dev.at(name), it->second->bytes.size());
        if (!on_device)
          return std::move(on_device).error();
        got = *on_device;
      } else {
        got = gpu::parallel_tree_checksum(it->second->bytes.bytes());
      }
      if (got != expected)
        return make_error(errc::checksum_mismatch,
                          "tensor '" + name + "' of " + to_string(plan.target) + " has checksum "
                            + checksum::to_hex(got) + " but the manifest says "
                            + checksum::to_hex(expected));
    }
    return {};
  }

  /// The architecture the version's own config.json says (rope_theta,
  /// rms_norm_eps, ... included), else the engine's: never the engine's
  /// settings for a checkpoint that says otherwise.
  result<model_config> served_config() {
    if (!target.files.contains("config.json"))
      return engine.config_;
    auto text = read_version_file(target, "config.json", read);
    if (!text)
      return std::move(text).error();
    auto parsed = parse_model_config(*text);
    if (!parsed)
      return make_error(errc::invalid_argument, "the config.json of " + to_string(plan.target)
                                                  + " cannot be served: " + parsed.error().message);
    return parsed;
  }

  /// The staged tensors bound as weights (on a device, the device copy
  /// beside the host tensors peers read), kept as the shadow.
  status bind(const model_config& config) {
    if (!device()) {
      // The expensive part of activation happens here, while serving.
      auto prepared = build_weights(config, std::move(tensors));
      if (!prepared)
        return make_error(
          errc::invalid_argument,
          to_string(plan.target) + " does not match the architecture it is served with"
            + (target.files.contains("config.json") ? " (its config.json)"
                                                    : " (the engine's model settings)")
            + ": " + prepared.error().message);
      std::lock_guard guard{engine.mutex_};
      engine.shadow_ = shadow{std::move(*prepared), plan.target};
      return {};
    }
    if (device()->runner)
      if (auto ok = fits_runner(device()->runner->shape(), config); !ok)
        return make_error(errc::invalid_argument,
                          to_string(plan.target) + " cannot be served on CUDA device "
                            + std::to_string(device()->gpu) + ": " + ok.error().message);
    // On the device the host tensors are kept for peers, not viewed; staged
    // on the host (tests), the CPU computes from them.
    result<std::shared_ptr<weights>> bound = make_error(errc::invalid_argument, "no weights");
    if (device()->runner) {
      bound = bind_weights(config, std::move(tensors));
    } else if (auto built = build_weights(config, std::move(tensors))) {
      bound = std::make_shared<weights>(**built);
    } else {
      bound = std::move(built).error();
    }
    if (!bound)
      return make_error(errc::invalid_argument,
                        to_string(plan.target)
                          + " does not match the architecture it is served with: "
                          + bound.error().message);
    auto on_device = bind_device_weights(config, std::move(dev));
    if (!on_device)
      return std::move(on_device).error();
    (*bound)->device = std::move(*on_device);
    device_fanout::instance().staged(&engine, plan.target, device()->gpu, (*bound)->device);
    fetching_for_node.owner = nullptr;
    std::lock_guard guard{engine.mutex_};
    engine.shadow_ = shadow{std::move(*bound), plan.target};
    return {};
  }
};

status builtin_engine::stage(const chain_plan& plan, bool onto_shadow, tensor_source& source) {
  {
    // What the last commit replaced is freed here, outside any pause.
    std::shared_ptr<const weights> old_weights;
    std::lock_guard guard{mutex_};
    old_weights.swap(retired_weights_);
  }
  stage_job job{*this, plan, source};
  if (auto ok = job.read_target(); !ok)
    return ok;
  if (plan.anchor) {
    if (auto ok = job.take_anchor(); !ok)
      return ok;
  } else {
    if (auto ok = job.take_base(onto_shadow); !ok)
      return ok;
    // Frames when they are the fewer bytes; what they lack, whole.
    if (auto ok = job.touched_from_holders(job.frames_from_peers()); !ok)
      return ok;
  }
  if (auto ok = job.apply_deltas(); !ok)
    return ok;
  if (auto ok = job.verify(); !ok)
    return ok;
  auto config = job.served_config();
  if (!config)
    return std::move(config).error();
  return job.bind(*config);
}

} // namespace stitch::engine
