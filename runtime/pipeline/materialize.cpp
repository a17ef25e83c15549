#include "runtime/pipeline/materialize.hpp"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <variant>

#include "gpu/checksum.hpp"
#include "gpu/host_buffer.hpp"
#include "runtime/core/chain_planner.hpp"
#include "runtime/core/delta_codec.hpp"
#include "runtime/core/version_ref.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/pipeline.hpp"
#include "runtime/pipeline/publisher.hpp"
#include "runtime/pipeline/stage_meter.hpp"

namespace stitch::pipeline {

namespace {

uint64_t load_le64(std::span<const std::byte, 8> bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < 8; ++i)
    value |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  return value;
}

/// Compressed bytes pulled from the store per read.
constexpr size_t input_piece = size_t{1} << 20;
/// Decoded run-list bytes an `xor-sparse` delta's applier holds at once.
constexpr size_t sparse_buffer = size_t{256} << 10;

} // namespace

result<std::vector<safetensors::tensor_info>> read_tensor_specs(const manifest& anchor) {
  if (!anchor.is_full())
    return make_error(errc::invalid_argument, to_string(anchor.ref) + " is not a full anchor");
  if (anchor.tensor_specs.empty() && !anchor.weight_map.empty())
    return make_error(errc::corrupt_data, to_string(anchor.ref)
                                            + " carries no metadata.tensor_specs; it was not "
                                              "published by a Stitch publisher");
  // `validate` (run on every parsed manifest) checked that the specs cover
  // exactly the stored tensors and add up to total_size.
  std::vector<safetensors::tensor_info> specs;
  for (const auto& [name, spec] : anchor.tensor_specs) {
    auto type = safetensors::parse_dtype(spec.dtype);
    auto size = type ? safetensors::byte_length(*type, spec.shape) : result<uint64_t>{type.error()};
    if (!type || !size)
      return make_error(errc::corrupt_data, "the tensor specs of " + to_string(anchor.ref)
                                              + " describe " + in_quotes(name) + " badly");
    specs.push_back({name, *type, spec.shape, 0, *size});
  }
  return specs;
}

/// The payload bytes of one delta frame, read from the store piece by piece.
struct delta_cursor::source {
  range_reader read;
  version_ref ref;
  std::string tensor;
  uint64_t next = delta_frame_prefix;
  uint64_t end = 0;

  result<size_t> pull(std::span<std::byte> into) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(into.size(), end - next));
    if (n == 0)
      return size_t{0};
    if (auto ok = read(ref, tensor, next, into.first(n)); !ok)
      return std::move(ok).error();
    next += n;
    return n;
  }
};

status delta_cursor::failed(const stitch::error& e) const {
  if (e.code != errc::decode_failure)
    return e;
  return make_error(errc::decode_failure, "cannot apply the delta of tensor " + in_quotes(tensor_)
                                            + " in " + to_string(ref_) + ": " + e.message);
}

result<delta_cursor> delta_cursor::open(range_reader read, const manifest& delta,
                                        std::string_view tensor, uint64_t tensor_size) {
  delta_cursor c;
  c.tensor_ = std::string{tensor};
  c.ref_ = delta.ref;
  c.encoding_ = delta.encoding;
  if (c.encoding_ == delta_encoding::none)
    return make_error(errc::decode_failure, "cannot apply the delta of tensor " + in_quotes(tensor)
                                              + " in " + to_string(delta.ref)
                                              + ": a delta without an encoding");
  std::array<std::byte, delta_frame_prefix> prefix{};
  if (auto ok = read(delta.ref, tensor, 0, prefix); !ok)
    return std::move(ok).error();
  const uint64_t length = load_le64(prefix);
  if (delta.total_size < delta_frame_prefix || length > delta.total_size - delta_frame_prefix)
    return make_error(errc::corrupt_data, "the delta frame of tensor " + in_quotes(tensor) + " in "
                                            + to_string(delta.ref) + " claims "
                                            + std::to_string(length)
                                            + " bytes, more than the version stores");
  c.src_ = std::make_shared<source>(source{std::move(read), delta.ref, std::string{tensor},
                                           delta_frame_prefix, delta_frame_prefix + length});
  if (c.encoding_ == delta_encoding::xor_sparse) {
    // The run list's size is not recorded: the applier bounds what it reads
    // (every run covers at least one byte of the tensor).
    delta::compressed_input runs;
    if (delta.comp == compression::zstd) {
      auto src = c.src_;
      auto z = delta::stream_decompressor::start(
        std::numeric_limits<uint64_t>::max(),
        [src](std::span<std::byte> into) { return src->pull(into); }, input_piece);
      if (!z)
        return std::move(z).error();
      auto zstd = std::make_shared<delta::stream_decompressor>(std::move(*z));
      runs = [zstd](std::span<std::byte> into) { return zstd->read_some(into); };
    } else if (delta.comp == compression::none) {
      runs = [src = c.src_](std::span<std::byte> into) { return src->pull(into); };
    } else {
      return make_error(errc::decode_failure, "the delta of tensor " + in_quotes(tensor) + " in "
                                                + to_string(delta.ref)
                                                + " has an unknown compression");
    }
    c.sparse_.emplace(tensor_size, std::move(runs), sparse_buffer);
  } else if (delta.comp == compression::zstd) {
    auto src = c.src_;
    auto z = delta::stream_decompressor::start(
      tensor_size, [src](std::span<std::byte> into) { return src->pull(into); }, input_piece);
    if (!z)
      return std::move(z).error();
    c.zstd_ = std::move(*z);
  } else if (delta.comp != compression::none) {
    return make_error(errc::decode_failure, "the delta of tensor " + in_quotes(tensor) + " in "
                                              + to_string(delta.ref)
                                              + " has an unknown compression");
  } else if (length != tensor_size) {
    return make_error(errc::decode_failure, "cannot apply the delta of tensor " + in_quotes(tensor)
                                              + " in " + to_string(delta.ref) + ": it holds "
                                              + std::to_string(length) + " bytes for a tensor of "
                                              + std::to_string(tensor_size));
  }
  return c;
}

status delta_cursor::apply(std::span<std::byte> base, std::span<std::byte> scratch,
                           const decoded_sink* sink) {
  if (sparse_) {
    if (!sink) {
      if (auto ok = sparse_->apply(base); !ok)
        return failed(ok.error());
      return {};
    }
    // The sink gets plain XOR pieces, as from an `xor` delta.
    for (size_t done = 0; done < base.size();) {
      const size_t n = std::min(base.size() - done, scratch.size());
      if (auto ok = sparse_->apply(base.subspan(done, n), scratch.first(n)); !ok)
        return failed(ok.error());
      if (auto told = sink->piece(done, scratch.first(n), delta_encoding::xor_bytes); !told)
        return told;
      done += n;
    }
    return {};
  }
  for (size_t done = 0; done < base.size();) {
    const size_t n = std::min(base.size() - done, scratch.size());
    auto into = base.subspan(done, n);
    auto decoded = encoding_ == delta_encoding::overwrite ? into : scratch.first(n);
    status got;
    if (zstd_) {
      got = zstd_->read(decoded);
    } else {
      auto pulled = src_->pull(decoded);
      if (!pulled)
        got = std::move(pulled).error();
      else if (*pulled != n)
        got = make_error(errc::decode_failure, "the payload is short");
    }
    if (!got)
      return failed(got.error());
    if (sink)
      if (auto told = sink->piece(done, decoded, encoding_); !told)
        return told;
    if (encoding_ == delta_encoding::xor_bytes)
      if (auto ok = gpu::parallel_xor_apply(into, decoded); !ok)
        return failed(ok.error());
    done += n;
  }
  return {};
}

status delta_cursor::finish() {
  if (sparse_) {
    if (auto ok = sparse_->finish(); !ok)
      return failed(ok.error());
    return {};
  }
  if (zstd_) {
    if (auto ok = zstd_->finish(); !ok)
      return failed(ok.error());
    return {};
  }
  if (src_->next != src_->end)
    return failed(make_error(errc::decode_failure, "the payload is longer than the tensor"));
  return {};
}

status apply_delta(const range_reader& read, const manifest& delta, std::string_view name,
                   std::span<std::byte> bytes, std::span<std::byte> scratch,
                   const decoded_sink* sink) {
  phase_scope decoding{stage_phase::decode};
  auto cursor = delta_cursor::open(read, delta, name, bytes.size());
  if (!cursor)
    return std::move(cursor).error();
  if (auto ok = cursor->apply(bytes, scratch, sink); !ok)
    return ok;
  return cursor->finish();
}

result<version_reader> version_reader::open(const manifest_reader& manifests, range_reader read,
                                            const version_ref& target, uint64_t boot) {
  if (auto ok = validate_run_id(target.run_id); !ok)
    return std::move(ok).error();
  std::map<uint64_t, manifest> cache;
  std::set<uint64_t> missing;
  auto first = manifests(target);
  if (!first)
    return std::move(first).error();
  cache.emplace(target.version, std::move(*first));
  manifest_lookup lookup = [&](const version_ref& r) -> manifest_lookup_result {
    if (auto it = cache.find(r.version); it != cache.end())
      return manifest_found{&it->second};
    if (missing.contains(r.version))
      return manifest_missing{};
    return manifest_pending{};
  };
  chain_plan plan;
  for (;;) {
    auto outcome = plan_chain(std::nullopt, target, boot, lookup);
    if (!outcome)
      return std::move(outcome).error();
    if (auto* p = std::get_if<chain_plan>(&*outcome)) {
      plan = std::move(*p);
      break;
    }
    const version_ref need = std::get<needs_manifest>(*outcome).ref;
    auto m = manifests(need);
    if (m)
      cache.emplace(need.version, std::move(*m));
    else if (m.error().code == errc::not_found)
      missing.insert(need.version);
    else
      return std::move(m).error();
  }
  if (!plan.anchor)
    return make_error(errc::missing_link, "no full anchor found for " + to_string(target));
  version_reader r;
  r.read_ = std::move(read);
  r.target_ = cache.at(target.version);
  r.anchor_ = cache.at(plan.anchor->version);
  for (const auto& d : plan.deltas)
    r.deltas_.push_back(cache.at(d.version));
  auto specs = read_tensor_specs(r.anchor_);
  if (!specs)
    return std::move(specs).error();
  r.tensors_ = std::move(*specs);
  // Every tensor must be exactly what the target's manifest promises.
  std::set<std::string> names;
  for (const auto& t : r.tensors_) {
    names.insert(t.name);
    if (!r.target_.checksums.contains(t.name))
      return make_error(errc::invalid_manifest, "the manifest of " + to_string(target)
                                                  + " has no checksum for tensor "
                                                  + in_quotes(t.name));
  }
  for (const auto& [name, sum] : r.target_.checksums)
    if (!names.contains(name))
      return make_error(errc::corrupt_data, "the manifest of " + to_string(target)
                                              + " has a checksum for " + in_quotes(name)
                                              + ", which its chain does not build");
  for (const auto& d : r.deltas_)
    for (const auto& name : d.touched)
      if (!names.contains(name))
        return make_error(errc::corrupt_data, to_string(d.ref) + " changes tensor "
                                                + in_quotes(name) + ", which its anchor "
                                                + to_string(r.anchor_.ref) + " does not have");
  return r;
}

result<version_reader> version_reader::open(store_backend& store, std::string_view pool,
                                            const version_ref& target) {
  if (auto ok = validate_pool(pool); !ok)
    return std::move(ok).error();
  if (auto ok = validate_run_id(target.run_id); !ok)
    return std::move(ok).error();
  auto pointer = store.read_pointer(pool);
  if (!pointer)
    return std::move(pointer).error();
  uint64_t boot = 0;
  if (*pointer && (*pointer)->latest.run_id == target.run_id
      && (*pointer)->boot_version <= target.version)
    boot = (*pointer)->boot_version;
  const std::string p{pool};
  auto opened = open(
    [&store, p](const version_ref& r) { return store.read_manifest(p, r); },
    [&store, p](const version_ref& r, std::string_view tensor, uint64_t offset,
                std::span<std::byte> out) { return store.read_range(p, r, tensor, offset, out); },
    target, boot);
  if (!opened && opened.error().code == errc::not_found)
    return make_error(errc::not_found,
                      "pool " + in_quotes(pool) + " holds no version " + to_string(target));
  return opened;
}

status version_reader::verify(const safetensors::tensor_info& t, uint64_t got) const {
  const uint64_t expected = target_.checksums.at(t.name);
  if (got != expected)
    return make_error(errc::checksum_mismatch, "tensor " + in_quotes(t.name) + " of "
                                                 + to_string(target_.ref) + " has checksum "
                                                 + checksum::to_hex(got) + " but the manifest says "
                                                 + checksum::to_hex(expected));
  return {};
}

status version_reader::read_into(const safetensors::tensor_info& t, std::span<std::byte> out,
                                 std::span<std::byte> scratch, parallel_for* runner) const {
  if (out.size() != t.byte_size())
    return make_error(errc::invalid_argument, "tensor " + in_quotes(t.name) + " is "
                                                + std::to_string(t.byte_size()) + " bytes, not "
                                                + std::to_string(out.size()));
  if (auto ok = read_(anchor_.ref, t.name, 0, out); !ok)
    return ok;
  for (const auto& d : deltas_)
    if (std::binary_search(d.touched.begin(), d.touched.end(), t.name))
      if (auto ok = apply_delta(read_, d, t.name, out, scratch); !ok)
        return ok;
  phase_scope verifying{stage_phase::verify};
  return verify(t,
                runner ? checksum::tree_checksum(out, *runner) : gpu::parallel_tree_checksum(out));
}

status version_reader::stream(const safetensors::tensor_info& t, std::span<std::byte> scratch,
                              const piece_sink& out, bool unverified) const {
  std::vector<delta_cursor> cursors;
  for (const auto& d : deltas_)
    if (std::binary_search(d.touched.begin(), d.touched.end(), t.name)) {
      auto c = delta_cursor::open(read_, d, t.name, t.byte_size());
      if (!c)
        return std::move(c).error();
      cursors.push_back(std::move(*c));
    }
  checksum::tree_hasher hasher;
  for (uint64_t off = 0; off < t.byte_size();) {
    auto buffer = out.next();
    if (!buffer)
      return std::move(buffer).error();
    const size_t n = static_cast<size_t>(
      std::min<uint64_t>({buffer->size(), scratch.size(), t.byte_size() - off}));
    auto bytes = buffer->first(n);
    if (auto ok = read_(anchor_.ref, t.name, off, bytes); !ok)
      return ok;
    if (!cursors.empty()) {
      phase_scope decoding{stage_phase::decode};
      for (auto& c : cursors)
        if (auto ok = c.apply(bytes, scratch); !ok)
          return ok;
    }
    if (!unverified) {
      phase_scope verifying{stage_phase::verify};
      hasher.update(bytes);
    }
    if (auto ok = out.done(n); !ok)
      return ok;
    off += n;
  }
  for (auto& c : cursors)
    if (auto ok = c.finish(); !ok)
      return ok;
  return unverified ? status{} : verify(t, hasher.digest());
}

status version_reader::stream(const safetensors::tensor_info& t, std::span<std::byte> piece,
                              std::span<std::byte> scratch,
                              const std::function<status(std::span<const std::byte>)>& sink) const {
  return stream(t, scratch,
                piece_sink{[piece]() -> result<std::span<std::byte>> { return piece; },
                           [&](size_t n) { return sink(piece.first(n)); }});
}

result<tensor_set> materialize(store_backend& store, std::string_view pool, const version_ref& ref,
                               parallel_for* runner) {
  auto reader = version_reader::open(store, pool, ref);
  if (!reader)
    return std::move(reader).error();
  std::vector<std::byte> scratch(size_t{8} << 20);
  tensor_set weights;
  for (const auto& info : reader->tensors()) {
    host_tensor t{info.name, info.type, info.shape, {}};
    t.bytes.resize(info.byte_size());
    if (auto ok = reader->read_into(info, t.bytes, scratch, runner); !ok)
      return std::move(ok).error();
    weights.emplace(info.name, std::move(t));
  }
  return weights;
}

namespace {

/// Reads and decodes a version's tensors ahead of the writer, on a thread of
/// its own and across tensor boundaries: `reader->stream` for each tensor in
/// turn, its pieces into a ring of buffers, each tensor's checksum verified
/// on that thread. The writer takes the pieces of one tensor at a time; a
/// tensor whose checksum does not match fails the export before its file
/// can appear. (Hashing on the writer instead measured no faster here.)
class read_ahead {
public:
  static result<std::unique_ptr<read_ahead>>
  start(const version_reader& reader, std::vector<const safetensors::tensor_info*> order,
        size_t buffers, size_t piece) {
    std::unique_ptr<read_ahead> r{new read_ahead(reader, std::move(order))};
    auto scratch = gpu::staging_allocator().allocate(piece);
    if (!scratch)
      return std::move(scratch).error();
    r->scratch_ = std::move(*scratch);
    for (size_t i = 0; i < std::max<size_t>(buffers, 2); ++i) {
      auto b = gpu::staging_allocator().allocate(piece);
      if (!b)
        return std::move(b).error();
      r->buffers_.push_back(std::move(*b));
      r->free_.push_back(i);
    }
    // The stage's phase meter, if any, times the read-ahead's work too.
    r->thread_ = std::thread{[raw = r.get(), meter = stage_meter::current()] {
      stage_meter::installed timed{meter};
      raw->run();
    }};
    return r;
  }

  ~read_ahead() {
    {
      std::lock_guard lock{mutex_};
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  read_ahead(const read_ahead&) = delete;
  read_ahead& operator=(const read_ahead&) = delete;

  /// Hands tensor `name`'s bytes to `sink`, piece by piece as they are read
  /// and decoded; verifies its checksum after the last.
  status take(const std::string& name, const safetensors::byte_sink& sink) {
    const size_t index = next_++;
    if (index >= order_.size() || order_[index]->name != name)
      return make_error(errc::invalid_argument, "the export asked for tensor '" + name
                                                  + "' out of the order it reads them in");
    for (;;) {
      item it;
      {
        std::unique_lock lock{mutex_};
        changed_.wait(lock, [&] { return !ready_.empty(); });
        it = std::move(ready_.front());
        ready_.pop_front();
      }
      if (it.end) {
        if (it.tensor != index)
          return make_error(errc::backend_failure, "export: the read-ahead lost its place");
        // The pieces went out already; a checksum failure fails the export.
        return it.outcome;
      }
      auto written = sink(buffers_[it.buffer].bytes().first(it.bytes));
      {
        std::lock_guard lock{mutex_};
        free_.push_back(it.buffer);
      }
      changed_.notify_all();
      if (!written)
        return written;
    }
  }

private:
  struct item {
    size_t tensor = 0;
    bool end = false;
    size_t buffer = 0;
    size_t bytes = 0;
    status outcome;
  };

  read_ahead(const version_reader& reader, std::vector<const safetensors::tensor_info*> order)
      : reader_(reader), order_(std::move(order)) {}

  void push(item it) {
    {
      std::lock_guard lock{mutex_};
      ready_.push_back(std::move(it));
    }
    changed_.notify_all();
  }

  void run() {
    for (size_t i = 0; i < order_.size(); ++i) {
      std::optional<size_t> held;
      auto next = [&]() -> result<std::span<std::byte>> {
        std::unique_lock lock{mutex_};
        changed_.wait(lock, [&] { return stopping_ || !free_.empty(); });
        if (stopping_)
          return make_error(errc::invalid_argument, "the export stopped");
        held = free_.front();
        free_.pop_front();
        return buffers_[*held].bytes();
      };
      auto done = [&, i](size_t n) -> status {
        push(item{i, false, *held, n, {}});
        held.reset();
        return {};
      };
      auto outcome =
        reader_.stream(*order_[i], scratch_.bytes(), version_reader::piece_sink{next, done});
      if (held) {
        std::lock_guard lock{mutex_};
        free_.push_back(*held);
      }
      push(item{i, true, 0, 0, outcome});
      if (!outcome)
        return;
      std::lock_guard lock{mutex_};
      if (stopping_)
        return;
    }
  }

  const version_reader& reader_;
  std::vector<const safetensors::tensor_info*> order_;
  size_t next_ = 0;
  gpu::host_buffer scratch_;
  std::vector<gpu::host_buffer> buffers_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<size_t> free_;
  std::deque<item> ready_;
  bool stopping_ = false;
  std::thread thread_;
};

} // namespace

status export_version(const version_reader& reader, const range_reader& read,
                      const std::filesystem::path& out_dir, const export_options& options) {
  // The buffer: a quarter decodes deltas, the rest rotates between the
  // reading thread (read, decode, verify) and the writer (this thread).
  const size_t piece = static_cast<size_t>(
    std::clamp<uint64_t>(options.buffer_bytes / 4, size_t{1} << 20, size_t{256} << 20));
  std::vector<safetensors::tensor_spec> specs;
  std::vector<const safetensors::tensor_info*> order;
  for (const auto& t : reader.tensors()) {
    specs.push_back({t.name, t.type, t.shape});
    order.push_back(&t);
  }
  // The files are written in name order, shard after shard: read in that order.
  std::sort(order.begin(), order.end(),
            [](const auto* a, const auto* b) { return a->name < b->name; });
  // The version's non-tensor files (config.json, ...), checked against their
  // checksums, go next to the shards byte for byte.
  std::map<std::string, std::string> files;
  for (const auto& [name, entry] : reader.target().files) {
    auto bytes = read_version_file(reader.target(), name, read);
    if (!bytes)
      return std::move(bytes).error();
    files.emplace(name, std::move(*bytes));
  }
  auto ahead = read_ahead::start(reader, std::move(order), 3, piece);
  if (!ahead)
    return std::move(ahead).error();
  tensor_filler fill = [&](const std::string& name, const safetensors::byte_sink& sink) {
    return (*ahead)->take(name, sink);
  };
  return write_hf_directory(out_dir, specs, fill, options.max_shard_bytes, options.sync, files);
}

status export_version(store_backend& store, std::string_view pool, const version_ref& ref,
                      const std::filesystem::path& out_dir, const export_options& options) {
  auto reader = version_reader::open(store, pool, ref);
  if (!reader)
    return std::move(reader).error();
  range_reader read = [&store, pool](const version_ref& r, std::string_view tensor, uint64_t offset,
                                     std::span<std::byte> out) {
    return store.read_range(pool, r, tensor, offset, out);
  };
  return export_version(*reader, read, out_dir, options);
}

} // namespace stitch::pipeline
