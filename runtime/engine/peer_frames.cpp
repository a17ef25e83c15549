#include "runtime/engine/peer_frames.hpp"

#include <algorithm>
#include <cstring>

namespace stitch::engine {

peer_frames peer_frames::fetch(transfer& peers, std::span<const manifest> deltas) {
  peer_frames out;
  for (const auto& d : deltas) {
    if (d.frames.empty())
      continue;
    std::vector<std::shared_ptr<std::vector<std::byte>>> buffers;
    std::vector<fetch_target> targets;
    buffers.reserve(d.frames.size());
    targets.reserve(d.frames.size());
    for (const auto& [name, frame] : d.frames) {
      // The size comes from the manifest, never from a holder's offer.
      auto buf = std::make_shared<std::vector<std::byte>>(frame.size);
      targets.push_back({name, std::span<std::byte>{*buf}, frame.checksum, buf});
      buffers.push_back(std::move(buf));
    }
    out.asked_ += targets.size();
    auto report = peers.fetch_frames(d.ref, targets, {});
    for (size_t i = 0; i < targets.size(); ++i)
      if (i < report.fetched.size() && report.fetched[i]) {
        out.bytes_ += buffers[i]->size();
        ++out.count_;
        out.frames_[d.ref].emplace(targets[i].name, std::move(buffers[i]));
      }
  }
  return out;
}

std::set<std::string> peer_frames::missing(std::span<const manifest> deltas) const {
  std::set<std::string> out;
  for (const auto& d : deltas) {
    auto of_version = frames_.find(d.ref);
    for (const auto& name : d.touched)
      if (of_version == frames_.end() || !of_version->second.contains(name))
        out.insert(name);
  }
  return out;
}

pipeline::range_reader peer_frames::reader(pipeline::range_reader fallback) const {
  return [frames = frames_,
          fallback = std::move(fallback)](const version_ref& ref, std::string_view tensor,
                                          uint64_t offset, std::span<std::byte> out) -> status {
    auto of_version = frames.find(ref);
    if (of_version == frames.end())
      return fallback(ref, tensor, offset, out);
    auto it = of_version->second.find(tensor);
    if (it == of_version->second.end())
      return fallback(ref, tensor, offset, out);
    const auto& bytes = *it->second;
    if (offset > bytes.size() || out.size() > bytes.size() - offset)
      return make_error(errc::corrupt_data, "a read of " + std::to_string(out.size()) + " bytes at "
                                              + std::to_string(offset) + " runs past the "
                                              + std::to_string(bytes.size()) + "-byte frame of '"
                                              + std::string{tensor} + "' of " + to_string(ref));
    if (!out.empty())
      std::memcpy(out.data(), bytes.data() + offset, out.size());
    return {};
  };
}

peer_fetch_choice choose_for_stage(const chain_plan& plan, tensor_source& source,
                                   const std::map<std::string, uint64_t, std::less<>>& base_sizes,
                                   std::vector<manifest>& deltas) {
  deltas.clear();
  if (!plan.anchor)
    for (const auto& ref : plan.deltas) {
      auto m = source.manifest_of(ref);
      if (!m)
        break;
      deltas.push_back(std::move(*m));
    }
  return choose_peer_fetch(plan, deltas, [&](std::string_view name) -> std::optional<uint64_t> {
    auto it = base_sizes.find(name);
    if (it == base_sizes.end())
      return std::nullopt;
    return it->second;
  });
}

} // namespace stitch::engine
