#include "runtime/pipeline/publisher.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "gpu/host_buffer.hpp"
#include "runtime/core/checksum.hpp"
#include "runtime/core/delta_codec.hpp"
#include "runtime/core/publish_plan.hpp"
#include "runtime/core/version_ref.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/pipeline.hpp"
#include "runtime/pipeline/publish_encoding.hpp"

namespace stitch::pipeline {

namespace fs = std::filesystem;
using detail::add_files;
using detail::anchor_items;
using detail::anchor_manifest;
using detail::describe_files;
using detail::frame_encoder;
using detail::layout_difference;
using detail::shard_streamer;
using detail::spill_buffer;
using detail::version_copy;

struct publisher::run_state {
  uint64_t version = 0;
  /// nullopt when unknown (adopted from the store): the next one anchors.
  std::optional<uint64_t> last_anchor;
  manifest published;
  std::vector<tensor_header> tensors;
  /// Where each tensor starts in `copy`.
  std::vector<uint64_t> offsets;
  /// Shared with the peers' readers of the version it holds (a publisher
  /// offers it), so that replacing it never frees bytes they read.
  std::shared_ptr<version_copy> copy;
  /// `copy` holds `version`'s bytes (false while a publish rewrites it).
  bool valid = false;
};

/// The buffers one publish works in, kept between publishes (fresh memory
/// costs page faults; a model's worth of publishes would fault in the same
/// buffers again and again).
struct publisher::work_buffers {
  gpu::host_buffer fresh;
  gpu::host_buffer old;
  /// Started by the first delta.
  std::unique_ptr<frame_encoder> encoder;
};

result<std::unique_ptr<publisher::work_buffers>> publisher::take_work_buffers() {
  {
    std::lock_guard guard{mutex_};
    if (!idle_buffers_.empty()) {
      auto w = std::move(idle_buffers_.back());
      idle_buffers_.pop_back();
      return w;
    }
  }
  auto w = std::make_unique<work_buffers>();
  for (auto* b : {&w->fresh, &w->old}) {
    auto got = gpu::staging_allocator().allocate(options_.chunk_bytes);
    if (!got)
      return std::move(got).error();
    *b = std::move(*got);
  }
  return w;
}

void publisher::give_back(std::unique_ptr<work_buffers> w) {
  std::lock_guard guard{mutex_};
  // One set per publish that may run at once is plenty.
  if (idle_buffers_.size() < 4)
    idle_buffers_.push_back(std::move(w));
}

publisher::publisher(store_backend& store, publisher_options options)
    : store_(store), options_(std::move(options)) {
  options_.chunk_bytes = std::clamp<uint64_t>(options_.chunk_bytes, 4096, uint64_t{256} << 20);
  if (options_.delta_format != delta_encoding::xor_bytes)
    options_.delta_format = delta_encoding::xor_sparse;
}

publisher::~publisher() = default;

std::shared_ptr<publisher::run_state>
publisher::find(const std::pair<std::string, std::string>& key) const {
  std::lock_guard guard{mutex_};
  auto it = runs_.find(key);
  if (it == runs_.end() || !it->second->valid)
    return nullptr;
  return it->second;
}

void publisher::forget(const std::pair<std::string, std::string>& key) {
  std::lock_guard guard{mutex_};
  auto it = runs_.find(key);
  if (it == runs_.end())
    return;
  if (it->second->copy && it->second->copy->in_memory())
    memory_in_use_ -= it->second->copy->size();
  runs_.erase(it);
}

std::optional<uint64_t> publisher::last_version(std::string_view pool,
                                                std::string_view run_id) const {
  auto s = find({std::string{pool}, std::string{run_id}});
  if (!s)
    return std::nullopt;
  return s->version;
}

uint64_t publisher::memory_in_use() const {
  std::lock_guard guard{mutex_};
  return memory_in_use_;
}

void publisher::watch(std::shared_ptr<remembered_watcher> w) {
  std::lock_guard guard{mutex_};
  watcher_ = std::move(w);
}

result<publish_report> publisher::publish(const publish_request& request,
                                          const tensor_set& full_weights) {
  for (const auto& [key, t] : full_weights)
    if (key != t.name)
      return make_error(errc::invalid_argument, "tensor " + in_quotes(t.name)
                                                  + " is stored under the key " + in_quotes(key));
  memory_stream source{full_weights};
  return publish(request, source);
}

/// One publish carried out. What it does is the core's decision
/// (`decide_publish`, `delta_tensor_coder`, `decide_pointer_step`,
/// `last_anchor_after` in runtime/core/publish_plan); the pass reads,
/// compares, encodes and writes what they call for, in one pass over the
/// bytes (two for a delta that does not pay off).
struct publisher::pass {
  publisher& self;
  const publish_request& request;
  tensor_stream& source;
  const std::vector<tensor_header>& tensors;
  /// The request's files, else the source's (a checkpoint directory's).
  const std::map<std::string, std::string>& file_bytes;
  std::map<std::string, file_entry> files;
  const std::pair<std::string, std::string> key;
  const version_ref ref;
  uint64_t raw_bytes = 0;
  const uint64_t chunk;

  /// The remembered previous version (may be rewritten in place below), and
  /// what it was before this publish.
  std::shared_ptr<run_state> prev;
  std::optional<remembered_version> remembered;
  /// What the store holds, read before a byte is.
  std::optional<pointer_record> pointer;
  std::optional<manifest> existing;
  publish_decision plan;

  /// What will be remembered after this publish (rewritten chunk by chunk).
  std::shared_ptr<run_state> target;
  /// The copy a delta or a comparison reads.
  const run_state* old = nullptr;
  std::shared_ptr<remembered_watcher> watcher;
  std::shared_ptr<work_buffers> held;
  std::span<std::byte> fresh;
  std::span<std::byte> scratch;

  // An anchor's bytes go to the store on a thread of their own, so the
  // store's writes overlap reading and hashing the next pieces.
  std::unique_ptr<version_writer> writer;
  std::optional<shard_streamer> anchor_shards;
  std::unique_ptr<buffer_pipeline> to_store;

  // The delta's frames, compressed on the encoder's threads.
  bool delta_pays = false;
  frame_encoder* encoder = nullptr;
  bool identical = true;
  std::map<std::string, uint64_t> sums;
  /// The stored delta's frames, lent to peers with the version.
  std::optional<host_weights> frames_to_lend;

  pass(publisher& p, const publish_request& r, tensor_stream& s)
      : self(p), request(r), source(s), tensors(s.tensors()),
        file_bytes(r.files.empty() ? s.files() : r.files),
        key(r.pool, r.run_id), ref{r.run_id, r.version}, chunk(p.options_.chunk_bytes) {
    for (const auto& t : tensors)
      raw_bytes += t.size;
  }

  status validate();
  status read_store();
  void decide();
  status take_copy();
  status take_buffers();
  status open_anchor();
  status commit_anchor(const manifest& m);
  status stream();
  status stream_tensor(size_t i);
  status encode(size_t i, const delta_effect& e, std::span<const std::byte> before,
                std::span<const std::byte> now);
  result<manifest> store_delta();
  result<manifest> store_anchor();
  result<manifest> finish_bytes(publish_report& report);
  status move_pointer(const manifest& m, publish_report& report);
  void lend();
  void remember(const manifest& m);
};

status publisher::pass::validate() {
  if (auto ok = validate_pool(request.pool); !ok)
    return ok;
  if (auto ok = validate_run_id(request.run_id); !ok)
    return ok;
  if (auto ok = validate_headers(tensors); !ok)
    return ok;
  auto described = describe_files(file_bytes);
  if (!described)
    return std::move(described).error();
  files = std::move(*described);
  return {};
}

status publisher::pass::read_store() {
  prev = self.find(key);
  if (prev)
    remembered = remembered_version{prev->version, prev->last_anchor,
                                    layout_difference(prev->tensors, tensors)};
  if (request.dry_run)
    return {};
  auto p = self.store_.read_pointer(request.pool);
  if (!p)
    return std::move(p).error();
  pointer = *p;
  auto m = self.store_.read_manifest(request.pool, ref);
  if (m)
    existing = std::move(*m);
  else if (m.error().code != errc::not_found)
    return std::move(m).error();
  // A rewind is refused before a byte is read.
  if (!existing && pointer && pointer->latest.run_id == ref.run_id
      && ref.version < pointer->latest.version) {
    auto decision = decide_pointer_move(
      pointer, pointer_proposal{ref, true, pointer->boot_version, std::nullopt});
    if (!decision)
      return std::move(decision).error();
  }
  return {};
}

void publisher::pass::decide() {
  publish_facts facts;
  facts.pool = request.pool;
  facts.ref = ref;
  facts.stored = existing.has_value();
  facts.dry_run = request.dry_run;
  facts.force_anchor = request.force_anchor;
  facts.remembered = remembered;
  facts.anchor_every = self.options_.anchor_every;
  plan = decide_publish(facts);
}

status publisher::pass::take_copy() {
  {
    std::lock_guard guard{self.mutex_};
    watcher = self.watcher_;
  }
  if (!plan.rewrite_remembered)
    return {};
  // Peers stop reading the remembered version before its bytes change.
  if (watcher)
    watcher->rewriting(request.pool, request.run_id);
  std::lock_guard guard{self.mutex_};
  auto& slot = self.runs_[key];
  if (slot && slot->copy && !layout_difference(slot->tensors, tensors)) {
    target = slot;
  } else {
    if (slot && slot->copy && slot->copy->in_memory())
      self.memory_in_use_ -= slot->copy->size();
    slot.reset();
    const bool fits = self.memory_in_use_ + raw_bytes <= self.options_.memory_limit;
    auto copy = version_copy::make(raw_bytes, fits, self.options_.scratch_dir);
    if (!copy) {
      self.runs_.erase(key);
      return std::move(copy).error();
    }
    if (fits)
      self.memory_in_use_ += raw_bytes;
    target = std::make_shared<run_state>();
    target->tensors = tensors;
    uint64_t at = 0;
    for (const auto& t : tensors) {
      target->offsets.push_back(at);
      at += t.size;
    }
    target->copy = std::move(*copy);
    slot = target;
  }
  // Until this publish succeeds the copy holds neither version for sure.
  target->valid = false;
  return {};
}

status publisher::pass::take_buffers() {
  old = plan.read_remembered ? prev.get() : nullptr;
  auto work = self.take_work_buffers();
  if (!work)
    return std::move(work).error();
  // Back to the idle set whatever happens below.
  held = std::shared_ptr<work_buffers>{work->release(), [p = &self](work_buffers* w) {
                                         p->give_back(std::unique_ptr<work_buffers>{w});
                                       }};
  fresh = held->fresh.bytes();
  scratch = held->old.bytes();
  if (plan.mode == publish_mode::anchor)
    return open_anchor();
  if (plan.mode == publish_mode::delta) {
    if (!held->encoder) {
      auto e = frame_encoder::start(chunk, self.options_.scratch_dir);
      if (!e)
        return std::move(e).error();
      held->encoder = std::move(*e);
    }
    held->encoder->reset(raw_bytes, self.options_.zstd_level, self.options_.delta_format);
    delta_pays = true;
  }
  encoder = held->encoder.get();
  return {};
}

status publisher::pass::open_anchor() {
  if (!anchor_shards) {
    auto planned = shard_streamer::plan(anchor_items(tensors), self.options_.max_shard_bytes,
                                        {{"format", "pt"}});
    if (!planned)
      return std::move(planned).error();
    anchor_shards = std::move(*planned);
  }
  if (request.dry_run)
    return {};
  auto w = self.store_.begin_version(request.pool, ref);
  if (!w)
    return std::move(w).error();
  writer = std::move(*w);
  auto p = buffer_pipeline::start(3, chunk, [this](std::span<const std::byte> bytes) {
    return anchor_shards->write(*writer, bytes);
  });
  if (!p)
    return std::move(p).error();
  to_store = std::move(*p);
  return {};
}

/// Ends the anchor's stream and stores it.
status publisher::pass::commit_anchor(const manifest& m) {
  if (auto ok = to_store->finish(); !ok)
    return ok;
  if (auto ok = anchor_shards->finish(*writer); !ok)
    return ok;
  if (auto ok = add_files(*writer, file_bytes); !ok)
    return ok;
  return writer->commit(m);
}

status publisher::pass::stream() {
  for (size_t i = 0; i < tensors.size(); ++i)
    if (auto ok = stream_tensor(i); !ok)
      return ok;
  if (plan.mode != publish_mode::delta)
    return {};
  if (auto ok = encoder->finish(); !ok)
    return ok;
  delta_pays = !encoder->gave_up();
  return {};
}

status publisher::pass::encode(size_t i, const delta_effect& e, std::span<const std::byte> before,
                               std::span<const std::byte> now) {
  switch (e.what) {
    case delta_effect::kind::begin: return encoder->begin(i);
    case delta_effect::kind::zeros: return encoder->zeros(e.bytes);
    case delta_effect::kind::xor_bytes: {
      auto x = encoder->acquire();
      if (!x)
        return std::move(x).error();
      if (auto ok = delta::xor_encode(before, now, x->first(now.size())); !ok)
        return ok;
      return encoder->submit(now.size());
    }
    case delta_effect::kind::end: return encoder->end(i);
  }
  return {};
}

status publisher::pass::stream_tensor(size_t i) {
  const auto& t = tensors[i];
  const bool compare_only = plan.mode == publish_mode::verify && plan.read_remembered;
  checksum::tree_hasher hasher;
  delta_tensor_coder coder;
  for (uint64_t off = 0; off < t.size;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, t.size - off));
    // Bytes the source already holds in memory (a client's pieces) are
    // hashed, compared and stored where they lie; others are read into a
    // buffer first.
    auto lent = source.borrow(i, off, n);
    if (!lent)
      return std::move(lent).error();
    std::span<const std::byte> now;
    if (!lent->bytes.empty()) {
      now = lent->bytes;
      n = now.size();
    } else {
      std::span<std::byte> into = fresh.first(n);
      if (to_store) {
        auto buffer = to_store->acquire();
        if (!buffer)
          return std::move(buffer).error();
        into = buffer->first(n);
      }
      if (auto ok = source.read(i, off, into); !ok)
        return ok;
      now = into;
    }
    hasher.update(now);
    bool same = false;
    // Not smaller than the weights: stop encoding, stream on.
    if (delta_pays && encoder->gave_up())
      delta_pays = false;
    if (old && (delta_pays || compare_only)) {
      auto before = old->copy->read(old->offsets[i] + off, n, scratch);
      if (!before)
        return std::move(before).error();
      same = std::memcmp(before->data(), now.data(), n) == 0;
      identical = identical && same;
      if (delta_pays)
        for (const auto& e : coder.chunk(n, same))
          if (auto ok = encode(i, e, *before, now); !ok)
            return ok;
    }
    if (plan.rewrite_remembered && !same)
      if (auto ok = target->copy->write(target->offsets[i] + off, now); !ok)
        return ok;
    if (to_store) {
      auto ok =
        lent->owner ? to_store->submit_external(now, std::move(lent->owner)) : to_store->submit(n);
      if (!ok)
        return ok;
    }
    off += n;
  }
  sums[t.name] = hasher.digest();
  if (delta_pays)
    for (const auto& e : coder.finish())
      if (auto ok = encode(i, e, {}, {}); !ok)
        return ok;
  return {};
}

result<manifest> publisher::pass::store_delta() {
  spill_buffer& frames = encoder->frames();
  const auto& frame_refs = encoder->refs();
  std::vector<shard_streamer::item> items;
  for (const auto& f : frame_refs)
    items.push_back({tensors[f.tensor].name, safetensors::dtype::u8, {f.size}, f.size});
  auto shards = shard_streamer::plan(items, self.options_.max_shard_bytes, {});
  if (!shards)
    return std::move(shards).error();
  manifest m;
  m.ref = ref;
  m.kind = version_kind::delta;
  m.base_version = request.version - 1;
  m.encoding = self.options_.delta_format;
  m.comp = compression::zstd;
  shards->describe(m);
  m.checksums = sums;
  for (const auto& f : frame_refs)
    m.touched.push_back(tensors[f.tensor].name);
  m.files = files;
  std::unique_ptr<version_writer> w;
  if (!request.dry_run) {
    auto begun = self.store_.begin_version(request.pool, ref);
    if (!begun)
      return std::move(begun).error();
    w = std::move(*begun);
  }
  // Peers are lent the stored frames themselves (DESIGN §4): a copy of them
  // when a watcher lends and they fit the publisher's memory.
  uint64_t frame_total = 0;
  for (const auto& f : frame_refs)
    frame_total += f.size;
  std::shared_ptr<std::vector<std::byte>> lent_frames;
  if (watcher && w && frame_total > 0 && frame_total <= self.options_.memory_limit)
    lent_frames = std::make_shared<std::vector<std::byte>>(frame_total);
  uint64_t at = 0;
  for (const auto& f : frame_refs) {
    checksum::tree_hasher hasher;
    for (uint64_t off = 0; off < f.size; off += chunk) {
      auto piece = fresh.first(std::min<uint64_t>(chunk, f.size - off));
      if (auto ok = frames.read(f.at + off, piece); !ok)
        return ok.error();
      hasher.update(piece);
      if (lent_frames)
        std::memcpy(lent_frames->data() + at + off, piece.data(), piece.size());
      if (w)
        if (auto ok = shards->write(*w, piece); !ok)
          return ok.error();
    }
    m.frames[tensors[f.tensor].name] = file_entry{f.size, hasher.digest()};
    at += f.size;
  }
  if (!w)
    return m;
  if (lent_frames) {
    host_weights lent{ref, {}, lent_frames};
    uint64_t offset = 0;
    for (const auto& f : frame_refs) {
      lent.tensors.push_back(
        {tensors[f.tensor].name, std::span<const std::byte>{*lent_frames}.subspan(offset, f.size)});
      offset += f.size;
    }
    frames_to_lend = std::move(lent);
  }
  if (auto ok = shards->finish(*w); !ok)
    return ok.error();
  if (auto ok = add_files(*w, file_bytes); !ok)
    return ok.error();
  if (auto ok = w->commit(m); !ok)
    return ok.error();
  return m;
}

result<manifest> publisher::pass::store_anchor() {
  if (plan.mode == publish_mode::delta) {
    plan.reason = "the delta's bytes are not smaller than the full weights' "
                  + std::to_string(raw_bytes) + " bytes";
    // The second pass: the new bytes are in the remembered copy by now.
    if (auto ok = open_anchor(); !ok)
      return ok.error();
    for (size_t i = 0; to_store && i < tensors.size(); ++i)
      for (uint64_t off = 0; off < tensors[i].size; off += chunk) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, tensors[i].size - off));
        auto buffer = to_store->acquire();
        if (!buffer)
          return std::move(buffer).error();
        auto bytes = target->copy->read(target->offsets[i] + off, n, *buffer);
        if (!bytes)
          return std::move(bytes).error();
        if (bytes->data() != buffer->data())
          std::memcpy(buffer->data(), bytes->data(), n);
        if (auto ok = to_store->submit(n); !ok)
          return ok.error();
      }
  }
  manifest m = anchor_manifest(ref, tensors, *anchor_shards, sums);
  m.files = files;
  if (writer)
    if (auto ok = commit_anchor(m); !ok)
      return ok.error();
  return m;
}

/// The version's manifest once its bytes are checked or stored.
result<manifest> publisher::pass::finish_bytes(publish_report& report) {
  if (plan.mode != publish_mode::verify)
    return plan.mode == publish_mode::delta && delta_pays ? store_delta() : store_anchor();
  const manifest& expected = plan.against_remembered ? prev->published : *existing;
  if (sums != expected.checksums || !identical || expected.files != files)
    return make_error(errc::version_exists, to_string(ref) + " is already stored in pool "
                                              + in_quotes(request.pool)
                                              + " with different content");
  report.idempotent = true;
  return expected;
}

/// The copy holds this version now: lend it before the pointer moves, so
/// that replicas the move wakes find the publisher among its holders.
void publisher::pass::lend() {
  if (!watcher)
    return;
  if (plan.rewrite_remembered && target->copy->in_memory()) {
    host_weights w;
    w.version = ref;
    auto bytes = target->copy->memory();
    for (size_t i = 0; i < target->tensors.size(); ++i)
      w.tensors.push_back(
        {target->tensors[i].name, bytes.subspan(target->offsets[i], target->tensors[i].size)});
    w.keep = target->copy;
    watcher->remembered(request.pool, std::move(w));
  }
  if (frames_to_lend)
    watcher->delta_stored(request.pool, std::move(*frames_to_lend));
}

/// Durable first, then visible: moves the pointer.
status publisher::pass::move_pointer(const manifest& m, publish_report& report) {
  const std::optional<version_ref> seen =
    pointer ? std::optional<version_ref>{pointer->latest} : std::nullopt;
  auto advance = [&]() -> status {
    auto moved = self.store_.compare_and_advance_pointer(request.pool, seen, ref);
    if (!moved)
      return std::move(moved).error();
    report.pointer = *moved;
    return {};
  };
  switch (decide_pointer_step(seen, ref, prev != nullptr, m.is_full())) {
    case pointer_step::none: report.pointer = *pointer; return {};
    case pointer_step::advance: return advance();
    case pointer_step::claim: {
      auto claimed = self.store_.claim(request.pool, ref);
      if (claimed) {
        report.claimed = true;
        report.pointer = *claimed;
        return {};
      }
      // The run was claimed here before at another boot: switch back to it.
      if (claimed.error().code == errc::version_exists)
        return advance();
      return std::move(claimed).error();
    }
  }
  return {};
}

/// Remembers this version for the next delta.
void publisher::pass::remember(const manifest& m) {
  if (!plan.rewrite_remembered)
    return;
  target->version = request.version;
  target->published = m;
  target->last_anchor = last_anchor_after(request.version, m.is_full(), remembered);
  std::lock_guard guard{self.mutex_};
  target->valid = true;
}

result<publish_report> publisher::publish(const publish_request& request, tensor_stream& source) {
  pass p{*this, request, source};
  if (auto ok = p.validate(); !ok)
    return std::move(ok).error();
  if (auto ok = p.read_store(); !ok)
    return std::move(ok).error();
  p.decide();
  if (auto ok = p.take_copy(); !ok)
    return std::move(ok).error();
  // From here on a failure leaves the remembered copy undefined: forget it.
  auto failed = [&](stitch::error err) -> result<publish_report> {
    if (p.plan.rewrite_remembered)
      forget(p.key);
    return err;
  };
  if (auto ok = p.take_buffers(); !ok)
    return failed(std::move(ok).error());
  if (auto ok = p.stream(); !ok)
    return failed(std::move(ok).error());
  publish_report report;
  report.raw_bytes = p.raw_bytes;
  auto stored = p.finish_bytes(report);
  if (!stored)
    return failed(std::move(stored).error());
  const manifest& m = *stored;
  report.kind = m.kind;
  report.touched = m.touched;
  report.stored_bytes = m.total_size;
  report.encoded_bytes = m.total_size;
  if (!m.is_full()) {
    report.encoded_bytes = 0;
    for (const auto& t : p.tensors)
      if (std::binary_search(m.touched.begin(), m.touched.end(), t.name))
        report.encoded_bytes += t.size;
  }
  report.reason_for_anchor = m.is_full() && !report.idempotent ? p.plan.reason : std::string{};
  report.published = m;
  if (request.dry_run)
    return report;
  p.lend();
  if (auto ok = p.move_pointer(m, report); !ok)
    return failed(std::move(ok).error());
  p.remember(m);
  return report;
}

} // namespace stitch::pipeline
