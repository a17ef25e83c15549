#pragma once

// Deltas over peers (DESIGN §4): a stage that builds on the weights it holds
// fetches each delta's stored frames from peers instead of the touched
// tensors whole, then decodes them exactly as it decodes frames read from
// the store. Frames no peer gave are read from the store.

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "runtime/core/engine_port.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/core/stage_plan.hpp"
#include "runtime/pipeline/materialize.hpp"

namespace stitch::engine {

/// The frames of a chain's deltas fetched from peers, in host memory, each
/// verified against its delta's `manifest::frames` checksum chunk by chunk
/// as it landed (a frame whose bytes fail is not kept: the store gives it).
class peer_frames {
public:
  peer_frames() = default;

  /// Fetches the frames of every delta in `deltas` (manifests listing their
  /// frames) through `peers`, one delta after another.
  static peer_frames fetch(transfer& peers, std::span<const manifest> deltas);

  /// Reads stored bytes: from a fetched frame when one was fetched, else
  /// through `fallback` (the store).
  pipeline::range_reader reader(pipeline::range_reader fallback) const;

  /// The touched tensors of `deltas` some of whose frames were not fetched
  /// (a stage asks holders for them whole, else the store gives the frames).
  std::set<std::string> missing(std::span<const manifest> deltas) const;

  /// Frames fetched, and their bytes.
  size_t count() const noexcept { return count_; }
  uint64_t bytes() const noexcept { return bytes_; }
  /// Frames asked for in all.
  size_t asked() const noexcept { return asked_; }

private:
  using by_tensor =
    std::map<std::string, std::shared_ptr<const std::vector<std::byte>>, std::less<>>;
  std::map<version_ref, by_tensor> frames_;
  size_t count_ = 0;
  uint64_t bytes_ = 0;
  size_t asked_ = 0;
};

/// The way a stage building on `base_sizes` (tensor name -> bytes) asks
/// peers for what `plan` changes: its deltas' manifests read through
/// `source` (none read for a seeding plan). `deltas` receives them.
peer_fetch_choice choose_for_stage(const chain_plan& plan, tensor_source& source,
                                   const std::map<std::string, uint64_t, std::less<>>& base_sizes,
                                   std::vector<manifest>& deltas);

} // namespace stitch::engine
