#include "runtime/store/materialize.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>

#include "gpu/checksum.hpp"
#include "runtime/core/chain_planner.hpp"
#include "runtime/core/delta_codec.hpp"
#include "runtime/store/hf_directory.hpp"
#include "runtime/store/publisher.hpp"
#include "runtime/store/version_layout.hpp"

namespace stitch::store {

namespace {

stitch::error fail(errc code, std::string message) {
  return make_error(code, std::move(message));
}

std::string quote(std::string_view text) {
  return "'" + std::string{text} + "'";
}

/// Largest single `read_range`, so one call never holds a backend for long.
constexpr uint64_t read_chunk = uint64_t{64} << 20;

status read_all(const range_reader& read, const version_ref& ref, std::string_view tensor,
                uint64_t offset, std::span<std::byte> out) {
  for (uint64_t done = 0; done < out.size();) {
    uint64_t n = std::min<uint64_t>(read_chunk, out.size() - done);
    if (auto ok = read(ref, tensor, offset + done, out.subspan(done, n)); !ok)
      return ok;
    done += n;
  }
  return {};
}

uint64_t load_le64(std::span<const std::byte, 8> bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < 8; ++i)
    value |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  return value;
}

std::string mismatch(std::string_view tensor, const version_ref& ref, uint64_t got,
                     uint64_t expected) {
  return "tensor " + quote(tensor) + " of " + to_string(ref) + " has checksum "
         + checksum::to_hex(got) + " but the manifest says " + checksum::to_hex(expected);
}

} // namespace

result<std::vector<safetensors::tensor_info>> read_tensor_specs(const manifest& anchor) {
  if (!anchor.is_full())
    return fail(errc::invalid_argument, to_string(anchor.ref) + " is not a full anchor");
  if (anchor.tensor_specs.empty() && !anchor.weight_map.empty())
    return fail(errc::corrupt_data, to_string(anchor.ref)
                                      + " carries no metadata.tensor_specs; it was not "
                                        "published by a Stitch publisher");
  // `validate` (run on every parsed manifest) checked that the specs cover
  // exactly the stored tensors and add up to total_size.
  std::vector<safetensors::tensor_info> specs;
  for (const auto& [name, spec] : anchor.tensor_specs) {
    auto type = safetensors::parse_dtype(spec.dtype);
    auto size = type ? safetensors::byte_length(*type, spec.shape) : result<uint64_t>{type.error()};
    if (!type || !size)
      return fail(errc::corrupt_data, "the tensor specs of " + to_string(anchor.ref) + " describe "
                                        + quote(name) + " badly");
    specs.push_back({name, *type, spec.shape, 0, *size});
  }
  return specs;
}

result<std::vector<std::byte>> read_delta_payload(const range_reader& read, const manifest& delta,
                                                  std::string_view tensor) {
  std::array<std::byte, delta_frame_prefix> prefix{};
  if (auto ok = read(delta.ref, tensor, 0, prefix); !ok)
    return std::move(ok).error();
  uint64_t length = load_le64(prefix);
  if (delta.total_size < delta_frame_prefix || length > delta.total_size - delta_frame_prefix)
    return fail(errc::corrupt_data, "the delta frame of tensor " + quote(tensor) + " in "
                                      + to_string(delta.ref) + " claims " + std::to_string(length)
                                      + " bytes, more than the version stores");
  std::vector<std::byte> payload(length);
  if (auto ok = read_all(read, delta.ref, tensor, delta_frame_prefix, payload); !ok)
    return std::move(ok).error();
  return payload;
}

status apply_delta_payload(const manifest& delta, std::string_view tensor,
                           std::span<const std::byte> payload, std::span<std::byte> base) {
  auto failed = [&](const std::string& why) {
    return fail(errc::decode_failure, "cannot apply the delta of tensor " + quote(tensor) + " in "
                                        + to_string(delta.ref) + ": " + why);
  };
  std::vector<std::byte> decoded;
  std::span<const std::byte> bytes = payload;
  if (delta.comp == compression::zstd) {
    if (delta.encoding == delta_encoding::overwrite) {
      // Straight into place: nothing of the old bytes is needed.
      if (auto ok = delta::decompress_into(payload, base); !ok)
        return failed(ok.error().message);
      return {};
    }
    auto out = delta::decompress(payload, base.size());
    if (!out)
      return failed(out.error().message);
    decoded = std::move(*out);
    bytes = decoded;
  } else if (delta.comp != compression::none) {
    return failed("unknown compression");
  }
  status ok;
  switch (delta.encoding) {
    case delta_encoding::xor_bytes: ok = gpu::parallel_xor_apply(base, bytes); break;
    case delta_encoding::overwrite: ok = delta::overwrite_apply(base, bytes); break;
    case delta_encoding::none: return failed("a delta without an encoding");
  }
  if (!ok)
    return failed(ok.error().message);
  return {};
}

namespace {

/// Reads manifests from the store as the planner asks for them.
result<chain_plan> plan_from_store(store_backend& store, std::string_view pool,
                                   const version_ref& ref, uint64_t boot,
                                   std::map<uint64_t, manifest>& cache) {
  std::set<uint64_t> missing;
  manifest_lookup lookup = [&](const version_ref& r) -> manifest_lookup_result {
    if (auto it = cache.find(r.version); it != cache.end())
      return manifest_found{&it->second};
    if (missing.contains(r.version))
      return manifest_missing{};
    return manifest_pending{};
  };
  for (;;) {
    auto outcome = plan_chain(std::nullopt, ref, boot, lookup);
    if (!outcome)
      return std::move(outcome).error();
    if (auto* plan = std::get_if<chain_plan>(&*outcome))
      return std::move(*plan);
    const version_ref need = std::get<needs_manifest>(*outcome).ref;
    auto m = store.read_manifest(pool, need);
    if (m)
      cache.emplace(need.version, std::move(*m));
    else if (m.error().code == errc::not_found)
      missing.insert(need.version);
    else
      return std::move(m).error();
  }
}

} // namespace

result<tensor_set> materialize(store_backend& store, std::string_view pool, const version_ref& ref,
                               parallel_for* runner) {
  if (auto ok = validate_pool(pool); !ok)
    return std::move(ok).error();
  if (auto ok = validate_run_id(ref.run_id); !ok)
    return std::move(ok).error();
  auto pointer = store.read_pointer(pool);
  if (!pointer)
    return std::move(pointer).error();
  uint64_t boot = 0;
  if (*pointer && (*pointer)->latest.run_id == ref.run_id
      && (*pointer)->boot_version <= ref.version)
    boot = (*pointer)->boot_version;

  std::map<uint64_t, manifest> cache;
  auto target = store.read_manifest(pool, ref);
  if (!target) {
    if (target.error().code == errc::not_found)
      return fail(errc::not_found, "pool " + quote(pool) + " holds no version " + to_string(ref));
    return std::move(target).error();
  }
  cache.emplace(ref.version, std::move(*target));
  auto plan = plan_from_store(store, pool, ref, boot, cache);
  if (!plan)
    return std::move(plan).error();
  if (!plan->anchor)
    return fail(errc::missing_link, "no full anchor found for " + to_string(ref));

  range_reader read = [&](const version_ref& r, std::string_view tensor, uint64_t offset,
                          std::span<std::byte> out) {
    return store.read_range(pool, r, tensor, offset, out);
  };
  const manifest& anchor = cache.at(plan->anchor->version);
  auto specs = read_tensor_specs(anchor);
  if (!specs)
    return std::move(specs).error();
  tensor_set weights;
  for (auto& info : *specs) {
    host_tensor t{info.name, info.type, std::move(info.shape), {}};
    t.bytes.resize(info.byte_size());
    if (auto ok = read_all(read, anchor.ref, t.name, 0, t.bytes); !ok)
      return std::move(ok).error();
    weights.emplace(info.name, std::move(t));
  }

  for (const auto& delta_ref : plan->deltas) {
    const manifest& delta = cache.at(delta_ref.version);
    for (const auto& name : delta.touched) {
      auto it = weights.find(name);
      if (it == weights.end())
        return fail(errc::corrupt_data, to_string(delta.ref) + " changes tensor " + quote(name)
                                          + ", which its anchor " + to_string(anchor.ref)
                                          + " does not have");
      auto payload = read_delta_payload(read, delta, name);
      if (!payload)
        return std::move(payload).error();
      if (auto ok = apply_delta_payload(delta, name, *payload, it->second.bytes); !ok)
        return std::move(ok).error();
    }
  }

  // Every tensor must be exactly what the target's manifest promises.
  const manifest& m = cache.at(ref.version);
  for (const auto& [name, sum] : m.checksums)
    if (!weights.contains(name))
      return fail(errc::corrupt_data, "the manifest of " + to_string(ref) + " has a checksum for "
                                        + quote(name) + ", which its chain does not build");
  std::vector<host_tensor*> tensors;
  for (auto& [name, t] : weights) {
    if (!m.checksums.contains(name))
      return fail(errc::invalid_manifest, "the manifest of " + to_string(ref)
                                            + " has no checksum for tensor " + quote(name));
    tensors.push_back(&t);
  }
  std::vector<std::span<const std::byte>> spans;
  for (const auto* t : tensors)
    spans.push_back(t->bytes);
  auto sums = tensor_checksums(spans, runner);
  for (size_t i = 0; i < tensors.size(); ++i) {
    uint64_t expected = m.checksums.at(tensors[i]->name);
    if (sums[i] != expected)
      return fail(errc::checksum_mismatch, mismatch(tensors[i]->name, ref, sums[i], expected));
  }
  return weights;
}

status export_version(store_backend& store, std::string_view pool, const version_ref& ref,
                      const std::filesystem::path& out_dir, uint64_t max_shard_bytes) {
  auto weights = materialize(store, pool, ref);
  if (!weights)
    return std::move(weights).error();
  return write_hf_directory(out_dir, *weights, max_shard_bytes);
}

} // namespace stitch::store
