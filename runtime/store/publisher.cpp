#include "runtime/store/publisher.hpp"

#include <algorithm>
#include <cstring>
#include <memory>

#include "gpu/checksum.hpp"
#include "gpu/cpu_parallel.hpp"
#include "runtime/core/checksum.hpp"
#include "runtime/core/delta_codec.hpp"
#include "runtime/store/version_layout.hpp"

namespace stitch::store {

namespace {

stitch::error fail(errc code, std::string message) {
  return make_error(code, std::move(message));
}

std::string quote(std::string_view text) {
  return "'" + std::string{text} + "'";
}

status validate_weights(const tensor_set& weights) {
  if (weights.empty())
    return fail(errc::invalid_argument, "no tensors to publish");
  for (const auto& [key, t] : weights) {
    if (key != t.name)
      return fail(errc::invalid_argument,
                  "tensor " + quote(t.name) + " is stored under the key " + quote(key));
    if (auto ok = validate_tensor_name(t.name); !ok)
      return ok;
    auto size = safetensors::byte_length(t.type, t.shape);
    if (!size)
      return fail(errc::invalid_argument, "tensor " + quote(t.name) + ": " + size.error().message);
    if (*size != t.bytes.size())
      return fail(errc::invalid_argument,
                  "tensor " + quote(t.name) + " holds " + std::to_string(t.bytes.size())
                    + " bytes but its dtype and shape need " + std::to_string(*size));
  }
  return {};
}

bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

bool same_content(const tensor_set& a, const tensor_set& b) {
  return a == b;
}

/// Why two tensor sets cannot be related by a delta, or nullopt when they can.
std::optional<std::string> layout_difference(const tensor_set& before, const tensor_set& after) {
  auto b = before.begin();
  auto a = after.begin();
  for (; b != before.end() && a != after.end(); ++a, ++b) {
    if (a->first != b->first) {
      const auto& gone = std::min(a->first, b->first);
      return "tensor " + quote(gone) + (after.contains(gone) ? " was added" : " was removed");
    }
    if (a->second.type != b->second.type)
      return "tensor " + quote(a->first) + " changed dtype from "
             + std::string{safetensors::to_string(b->second.type)} + " to "
             + std::string{safetensors::to_string(a->second.type)};
    if (a->second.shape != b->second.shape)
      return "tensor " + quote(a->first) + " changed shape";
  }
  if (a != after.end())
    return "tensor " + quote(a->first) + " was added";
  if (b != before.end())
    return "tensor " + quote(b->first) + " was removed";
  return std::nullopt;
}

/// One stored tensor of a version being prepared.
struct stored_tensor {
  std::string name;
  safetensors::dtype type = safetensors::dtype::u8;
  std::vector<uint64_t> shape;
  std::span<const std::byte> bytes;
};

} // namespace

std::vector<std::byte> encode_delta_frame(std::span<const std::byte> payload) {
  std::vector<std::byte> frame(delta_frame_prefix + payload.size());
  uint64_t length = payload.size();
  for (size_t i = 0; i < delta_frame_prefix; ++i)
    frame[i] = static_cast<std::byte>((length >> (8 * i)) & 0xff);
  if (!payload.empty())
    std::memcpy(frame.data() + delta_frame_prefix, payload.data(), payload.size());
  return frame;
}

std::vector<uint64_t> tensor_checksums(std::span<const std::span<const std::byte>> tensors,
                                       parallel_for* runner) {
  parallel_for& pool = runner ? *runner : gpu::shared_pool();
  std::vector<uint64_t> sums(tensors.size());
  std::vector<size_t> small;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].size() >= gpu::parallel_threshold)
      sums[i] = checksum::tree_checksum(tensors[i], pool);
    else
      small.push_back(i);
  }
  pool.run(small.size(),
           [&](size_t k) { sums[small[k]] = checksum::tree_checksum(tensors[small[k]]); });
  return sums;
}

memory_source::memory_source(std::vector<std::span<const std::byte>> pieces)
    : pieces_(std::move(pieces)) {
  for (const auto& p : pieces_)
    size_ += p.size();
}

result<size_t> memory_source::read(std::span<std::byte> out) {
  size_t done = 0;
  while (done < out.size() && piece_ < pieces_.size()) {
    const auto& piece = pieces_[piece_];
    size_t n = std::min(out.size() - done, piece.size() - offset_);
    if (n > 0)
      std::memcpy(out.data() + done, piece.data() + offset_, n);
    done += n;
    offset_ += n;
    if (offset_ == piece.size()) {
      ++piece_;
      offset_ = 0;
    }
  }
  return done;
}

/// A version ready to put: its manifest and the bytes of its shards.
struct publisher::prepared {
  struct shard {
    std::string name;
    std::vector<std::byte> header;
    std::vector<std::span<const std::byte>> data;
  };

  manifest m;
  std::vector<shard> shards;
  /// Bytes the shards point into besides the caller's tensors (delta
  /// frames); moving a vector keeps its buffer in place.
  std::vector<std::vector<std::byte>> owned;
  uint64_t raw_bytes = 0;
  uint64_t encoded_bytes = 0;
  std::string reason;
  /// The remembered version again with identical weights: `m` is its
  /// manifest and there are no shards.
  bool reused = false;
};

namespace {

/// Lays `tensors` out in HF shards and fills the manifest's shard fields.
status lay_out(std::vector<stored_tensor>& tensors, uint64_t max_shard_bytes,
               const safetensors::metadata_map& metadata, manifest& m,
               std::vector<std::string>& shard_names, std::vector<std::vector<std::byte>>& headers,
               std::vector<std::vector<std::span<const std::byte>>>& data) {
  std::vector<shard_input> inputs;
  std::map<std::string, const stored_tensor*> by_name;
  for (const auto& t : tensors) {
    inputs.push_back({t.name, t.bytes.size()});
    by_name.emplace(t.name, &t);
  }
  auto plan = plan_shards(inputs, max_shard_bytes);
  if (!plan)
    return std::move(plan).error();
  for (size_t i = 0; i < plan->shards.size(); ++i) {
    std::vector<safetensors::tensor_spec> specs;
    std::vector<std::span<const std::byte>> pieces;
    for (const auto& name : plan->shard_tensors[i]) {
      const stored_tensor& t = *by_name.at(name);
      specs.push_back({t.name, t.type, t.shape});
      pieces.push_back(t.bytes);
    }
    auto header = safetensors::serialize_header(specs, metadata);
    if (!header)
      return std::move(header).error();
    shard_names.push_back(plan->shards[i]);
    headers.push_back(std::move(header->bytes));
    data.push_back(std::move(pieces));
  }
  m.shards = plan->shards;
  m.weight_map = plan->weight_map;
  m.total_size = plan->total_size;
  return {};
}

} // namespace

publisher::publisher(store_backend& store, publisher_options options)
    : store_(store), options_(options) {}

std::optional<uint64_t> publisher::last_version(std::string_view pool,
                                                std::string_view run_id) const {
  auto it = runs_.find({std::string{pool}, std::string{run_id}});
  if (it == runs_.end())
    return std::nullopt;
  return it->second.version;
}

result<publisher::prepared> publisher::prepare_anchor(const publish_request& request,
                                                      const tensor_set& weights,
                                                      std::string reason) const {
  prepared out;
  out.reason = std::move(reason);
  std::vector<stored_tensor> tensors;
  for (const auto& [name, t] : weights) {
    tensors.push_back({name, t.type, t.shape, t.bytes});
    out.raw_bytes += t.bytes.size();
  }

  manifest& m = out.m;
  m.ref = {request.run_id, request.version};
  m.kind = version_kind::full;
  std::vector<std::string> names;
  std::vector<std::vector<std::byte>> headers;
  std::vector<std::vector<std::span<const std::byte>>> data;
  if (auto ok =
        lay_out(tensors, options_.max_shard_bytes, {{"format", "pt"}}, m, names, headers, data);
      !ok)
    return std::move(ok).error();
  for (size_t i = 0; i < names.size(); ++i)
    out.shards.push_back({std::move(names[i]), std::move(headers[i]), std::move(data[i])});
  std::vector<std::span<const std::byte>> spans;
  for (const auto& t : tensors)
    spans.push_back(t.bytes);
  auto sums = tensor_checksums(spans);
  for (size_t i = 0; i < tensors.size(); ++i) {
    m.touched.push_back(tensors[i].name);
    m.checksums[tensors[i].name] = sums[i];
  }
  std::sort(m.touched.begin(), m.touched.end());
  for (const auto& [name, t] : weights)
    m.tensor_specs[name] = {std::string{safetensors::to_string(t.type)}, t.shape};
  out.encoded_bytes = m.total_size;
  return out;
}

result<publisher::prepared> publisher::prepare(const publish_request& request,
                                               const tensor_set& weights,
                                               const run_state* previous) const {
  const uint64_t version = request.version;
  if (request.force_anchor)
    return prepare_anchor(request, weights, "requested (--anchor)");
  if (!previous)
    return prepare_anchor(request, weights,
                          "first version of run " + quote(request.run_id) + " in pool "
                            + quote(request.pool) + " this publisher has seen");
  if (previous->version == version && same_content(previous->weights, weights)) {
    prepared out;
    out.m = previous->published;
    out.reused = true;
    out.reason = "re-publish of the remembered version " + std::to_string(version);
    for (const auto& [name, t] : weights)
      out.raw_bytes += t.bytes.size();
    out.encoded_bytes = previous->published.total_size;
    return out;
  }
  if (previous->version + 1 != version)
    return prepare_anchor(request, weights,
                          "the previous version in memory is " + std::to_string(previous->version)
                            + ", not " + std::to_string(version - 1));
  if (auto diff = layout_difference(previous->weights, weights))
    return prepare_anchor(request, weights, "the tensor set changed: " + *diff);
  if (!previous->last_anchor)
    return prepare_anchor(request, weights, "the run's last anchor is unknown");
  if (options_.anchor_every != 0 && version - *previous->last_anchor >= options_.anchor_every)
    return prepare_anchor(request, weights,
                          std::to_string(version - *previous->last_anchor)
                            + " versions since anchor " + std::to_string(*previous->last_anchor)
                            + " (anchor_every = " + std::to_string(options_.anchor_every) + ")");

  prepared out;
  std::vector<const host_tensor*> changed;
  for (const auto& [name, t] : weights) {
    out.raw_bytes += t.bytes.size();
    if (!same_bytes(previous->weights.at(name).bytes, t.bytes))
      changed.push_back(&t);
  }

  // Encode the changed tensors in parallel: XOR, compress, frame, checksum.
  std::vector<std::vector<std::byte>> frames(changed.size());
  std::vector<uint64_t> sums(changed.size());
  std::vector<std::optional<stitch::error>> errors(changed.size());
  gpu::shared_pool().run(changed.size(), [&](size_t i) {
    const host_tensor& t = *changed[i];
    std::vector<std::byte> xored(t.bytes.size());
    if (auto ok = delta::xor_encode(previous->weights.at(t.name).bytes, t.bytes, xored); !ok) {
      errors[i] = ok.error();
      return;
    }
    auto packed = delta::compress(xored, options_.zstd_level);
    if (!packed) {
      errors[i] = packed.error();
      return;
    }
    frames[i] = encode_delta_frame(*packed);
    sums[i] = checksum::tree_checksum(t.bytes);
  });
  for (size_t i = 0; i < changed.size(); ++i)
    if (errors[i])
      return fail(errors[i]->code,
                  "encoding tensor " + quote(changed[i]->name) + ": " + errors[i]->message);

  uint64_t delta_bytes = 0;
  for (size_t i = 0; i < changed.size(); ++i) {
    delta_bytes += frames[i].size();
    out.encoded_bytes += changed[i]->bytes.size();
  }
  if (delta_bytes >= out.raw_bytes)
    return prepare_anchor(request, weights,
                          "the delta's " + std::to_string(delta_bytes)
                            + " bytes are not smaller than the full weights' "
                            + std::to_string(out.raw_bytes) + " bytes");

  std::vector<stored_tensor> tensors;
  for (size_t i = 0; i < changed.size(); ++i) {
    out.owned.push_back(std::move(frames[i]));
    const auto& frame = out.owned.back();
    tensors.push_back({changed[i]->name, safetensors::dtype::u8, {frame.size()}, frame});
  }
  manifest& m = out.m;
  m.ref = {request.run_id, version};
  m.kind = version_kind::delta;
  m.base_version = version - 1;
  m.encoding = delta_encoding::xor_bytes;
  m.comp = compression::zstd;
  std::vector<std::string> names;
  std::vector<std::vector<std::byte>> headers;
  std::vector<std::vector<std::span<const std::byte>>> data;
  if (auto ok = lay_out(tensors, options_.max_shard_bytes, {}, m, names, headers, data); !ok)
    return std::move(ok).error();
  for (size_t i = 0; i < names.size(); ++i)
    out.shards.push_back({std::move(names[i]), std::move(headers[i]), std::move(data[i])});
  // Untouched tensors keep their checksums: the bytes are the same.
  m.checksums = previous->published.checksums;
  for (size_t i = 0; i < changed.size(); ++i) {
    m.touched.push_back(changed[i]->name);
    m.checksums[changed[i]->name] = sums[i];
  }
  return out;
}

result<publish_report> publisher::publish(const publish_request& request,
                                          const tensor_set& full_weights) {
  if (auto ok = validate_pool(request.pool); !ok)
    return std::move(ok).error();
  if (auto ok = validate_run_id(request.run_id); !ok)
    return std::move(ok).error();
  if (auto ok = validate_weights(full_weights); !ok)
    return std::move(ok).error();

  const auto key = std::make_pair(request.pool, request.run_id);
  auto held = runs_.find(key);
  const run_state* previous = held == runs_.end() ? nullptr : &held->second;
  auto prep = prepare(request, full_weights, previous);
  if (!prep)
    return std::move(prep).error();

  publish_report report;
  auto fill = [&](const prepared& p) {
    report.kind = p.m.kind;
    report.touched = p.m.touched;
    report.raw_bytes = p.raw_bytes;
    report.encoded_bytes = p.encoded_bytes;
    report.stored_bytes = p.m.total_size;
    report.reason_for_anchor = p.m.is_full() ? p.reason : std::string{};
    report.published = p.m;
  };
  fill(*prep);
  if (request.dry_run) {
    report.idempotent = prep->reused;
    return report;
  }

  const version_ref ref{request.run_id, request.version};
  auto pointer = store_.read_pointer(request.pool);
  if (!pointer)
    return std::move(pointer).error();

  // The same weights already stored (a retry after a lost acknowledgement, or
  // a restarted publisher) succeed without storing anything again.
  auto existing = store_.read_manifest(request.pool, ref);
  bool adopted = false;
  bool differs = false;
  if (existing) {
    if (existing->checksums == prep->m.checksums) {
      report.idempotent = true;
      adopted = !(*existing == prep->m);
      prep->m = *existing;
      fill(*prep);
    } else {
      differs = true;
    }
  } else if (existing.error().code != errc::not_found) {
    return std::move(existing).error();
  } else if (prep->reused) {
    auto fresh =
      prepare_anchor(request, full_weights, "the store no longer holds the remembered version");
    if (!fresh)
      return std::move(fresh).error();
    prep = std::move(fresh);
    fill(*prep);
  }
  // A rewind fails before anything is stored (other content fails in the store).
  if (!report.idempotent && !differs && *pointer && (*pointer)->latest.run_id == ref.run_id
      && ref.version < (*pointer)->latest.version) {
    auto decision = decide_pointer_move(
      *pointer, pointer_proposal{ref, prep->m.is_full(), (*pointer)->boot_version, std::nullopt});
    if (!decision)
      return std::move(decision).error();
  }
  if (!report.idempotent) {
    std::vector<std::unique_ptr<memory_source>> sources;
    std::vector<shard_upload> uploads;
    for (const auto& s : prep->shards) {
      std::vector<std::span<const std::byte>> pieces{s.header};
      pieces.insert(pieces.end(), s.data.begin(), s.data.end());
      sources.push_back(std::make_unique<memory_source>(std::move(pieces)));
      uploads.push_back({s.name, sources.back().get()});
    }
    if (auto ok = put_version(store_, request.pool, prep->m, uploads); !ok)
      return std::move(ok).error();
  }

  // Durable first, then visible: move the pointer.
  const std::optional<version_ref> expected =
    *pointer ? std::optional<version_ref>{(*pointer)->latest} : std::nullopt;
  auto advance = [&] { return store_.compare_and_advance_pointer(request.pool, expected, ref); };
  if (*pointer && (*pointer)->latest == ref) {
    report.pointer = **pointer;
  } else if (previous || !prep->m.is_full()
             || (*pointer && (*pointer)->latest.run_id == ref.run_id)) {
    auto moved = advance();
    if (!moved)
      return std::move(moved).error();
    report.pointer = *moved;
  } else {
    auto claimed = store_.claim(request.pool, ref);
    if (claimed) {
      report.claimed = true;
      report.pointer = *claimed;
    } else if (claimed.error().code == errc::version_exists) {
      // The run was claimed here before at another boot: switch back to it.
      auto moved = advance();
      if (!moved)
        return std::move(moved).error();
      report.pointer = *moved;
    } else {
      return std::move(claimed).error();
    }
  }

  // Remember the published weights for the next delta.
  if (prep->reused)
    return report;
  const manifest& m = prep->m;
  std::optional<uint64_t> anchor;
  if (m.is_full())
    anchor = ref.version;
  else if (previous && previous->version + 1 == ref.version)
    anchor = previous->last_anchor;
  run_state& state = runs_[key];
  if (!adopted && !m.is_full() && previous) {
    for (const auto& name : m.touched)
      state.weights[name] = full_weights.at(name);
  } else {
    state.weights = full_weights;
  }
  state.version = ref.version;
  state.last_anchor = anchor;
  state.published = m;
  return report;
}

} // namespace stitch::store
