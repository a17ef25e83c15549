#include "runtime/core/stage_plan.hpp"

namespace stitch {

std::string to_string(tensor_arrival a) {
  switch (a) {
    case tensor_arrival::shared_with_base: return "shared_with_base";
    case tensor_arrival::read_from_anchor: return "read_from_anchor";
    case tensor_arrival::patched: return "patched";
    case tensor_arrival::whole_from_holder: return "whole_from_holder";
    case tensor_arrival::from_local_gpu: return "from_local_gpu";
  }
  return "unknown";
}

std::string to_string(peer_fetch f) {
  return f == peer_fetch::frames ? "frames" : "whole";
}

peer_fetch_choice
choose_peer_fetch(const chain_plan& plan, std::span<const manifest> deltas,
                  const std::function<std::optional<uint64_t>(std::string_view)>& tensor_bytes) {
  peer_fetch_choice c;
  for (const auto& name : plan.touched)
    c.whole_bytes += tensor_bytes(name).value_or(0);
  if (plan.anchor) {
    c.why = "seeding from an anchor";
    return c;
  }
  if (deltas.size() != plan.deltas.size()) {
    c.why = "the chain's manifests are not all known";
    return c;
  }
  for (size_t i = 0; i < deltas.size(); ++i) {
    const auto& d = deltas[i];
    if (d.ref != plan.deltas[i] || d.is_full()) {
      c.why = to_string(plan.deltas[i]) + " is not the delta the chain folds";
      return c;
    }
    if (d.frames.size() != d.touched.size()) {
      c.why = to_string(d.ref) + " lists no frames (written before deltas moved over peers)";
      return c;
    }
    for (const auto& [name, frame] : d.frames)
      c.frame_bytes += frame.size;
  }
  if (c.frame_bytes >= c.whole_bytes) {
    c.why = "the chain's frames (" + std::to_string(c.frame_bytes)
            + " bytes) are not smaller than the touched tensors (" + std::to_string(c.whole_bytes)
            + " bytes)";
    return c;
  }
  c.how = peer_fetch::frames;
  return c;
}

stage_ledger::stage_ledger(const chain_plan& plan)
    : seeding_(plan.anchor.has_value()), touched_(plan.touched.begin(), plan.touched.end()) {}

std::vector<std::string>
stage_ledger::wanted_whole(const std::vector<std::string>& candidates) const {
  std::vector<std::string> out;
  for (const auto& name : candidates)
    if ((seeding_ || touched_.contains(name)) && !arrived_.contains(name))
      out.push_back(name);
  return out;
}

void stage_ledger::arrived(const std::string& name, tensor_arrival how) {
  arrived_[name] = how;
}

tensor_arrival stage_ledger::arrival(std::string_view name) const {
  if (auto it = arrived_.find(name); it != arrived_.end())
    return it->second;
  return seeding_ ? tensor_arrival::read_from_anchor : tensor_arrival::shared_with_base;
}

bool stage_ledger::needs_patch(std::string_view name) const {
  auto a = arrival(name);
  return a != tensor_arrival::whole_from_holder && a != tensor_arrival::from_local_gpu;
}

bool stage_ledger::whole(std::string_view name) const {
  return arrival(name) == tensor_arrival::whole_from_holder;
}

void stage_ledger::patched(const std::string& name) {
  arrived_[name] = tensor_arrival::patched;
}

tensor_check stage_ledger::check(std::string_view name) const {
  switch (arrival(name)) {
    case tensor_arrival::shared_with_base:
      // Unchanged bytes, verified when they were staged; a tensor the chain
      // touches yet no delta rewrote (an empty delta of it) is checked anyway.
      return touched_.contains(name) ? tensor_check::checksum : tensor_check::none;
    case tensor_arrival::whole_from_holder:
      return tensor_check::none; // every chunk verified as it landed
    case tensor_arrival::read_from_anchor:
    case tensor_arrival::patched:
    case tensor_arrival::from_local_gpu: return tensor_check::checksum;
  }
  return tensor_check::checksum;
}

std::vector<std::string> stage_ledger::from_holders() const {
  std::vector<std::string> out;
  for (const auto& [name, how] : arrived_)
    if (how == tensor_arrival::whole_from_holder)
      out.push_back(name);
  return out;
}

} // namespace stitch
