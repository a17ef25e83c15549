#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/chain_planner.hpp"
#include "runtime/core/manifest.hpp"

/// The per-tensor decisions of one stage (DESIGN §2 "activation"), apart
/// from the bytes: where each tensor of the target comes from, which a delta
/// must still patch and which must be verified before the shadow may be
/// activated. An engine's stage (`runtime/engine/builtin_engine`) carries
/// them out and tells the ledger what arrived how.
namespace stitch {

/// How a staged tensor's bytes came to be.
enum class tensor_arrival : uint8_t {
  /// Shared with the weights the plan builds on, unchanged (no anchor, not
  /// touched by the chain).
  shared_with_base,
  /// Read afresh from the plan's anchor in the store.
  read_from_anchor,
  /// Copied from the base, then patched by the plan's deltas.
  patched,
  /// Given whole by a holder of the target, every chunk verified against the
  /// target's manifest as it landed.
  whole_from_holder,
  /// Taken whole from another GPU of this process that staged the target.
  from_local_gpu,
};

std::string to_string(tensor_arrival a);

/// What must happen to a tensor before activation.
enum class tensor_check : uint8_t {
  /// Nothing: bytes already verified (when they were staged, or on arrival).
  none,
  /// Its checksum computed and compared with the target's manifest.
  checksum,
};

/// How a stage that builds on weights it holds asks peers for what the
/// chain changes (DESIGN §4, deltas over peers).
enum class peer_fetch : uint8_t {
  /// The touched tensors whole (a seeding stage always: it has no base).
  whole,
  /// Each delta's stored frames, decoded into the staged tensors as the
  /// store path decodes them.
  frames,
};

std::string to_string(peer_fetch f);

/// The choice and the sizes it was made from.
struct peer_fetch_choice {
  peer_fetch how = peer_fetch::whole;
  /// The frames of every delta of the chain, summed (when all are listed).
  uint64_t frame_bytes = 0;
  /// The touched tensors' full bytes.
  uint64_t whole_bytes = 0;
  /// Why `whole`, for the log (empty for `frames`).
  std::string why;
};

/// Frames when every delta of `plan` lists its stored frames
/// (`manifest::frames`; `deltas` are their manifests, in the plan's order)
/// and they add up to fewer bytes than the tensors they touch would take
/// whole (`tensor_bytes` of a name: its size in the base; nullopt for a
/// tensor the base lacks, which makes the stage fail later whichever way),
/// else whole tensors. A seeding plan (an anchor) fetches whole.
peer_fetch_choice
choose_peer_fetch(const chain_plan& plan, std::span<const manifest> deltas,
                  const std::function<std::optional<uint64_t>(std::string_view)>& tensor_bytes);

/// One stage's ledger. Pure: the executor asks and reports; nothing here
/// touches bytes.
class stage_ledger {
public:
  explicit stage_ledger(const chain_plan& plan);

  /// The tensors worth asking holders (or another local GPU) for whole,
  /// among `candidates` (the tensors being staged, in their order): every
  /// one when seeding from an anchor, else those the chain touches; never
  /// one that already arrived whole.
  std::vector<std::string> wanted_whole(const std::vector<std::string>& candidates) const;
  /// `name` arrived as `how` (whole from a holder or a local GPU).
  void arrived(const std::string& name, tensor_arrival how);
  /// How `name` stands now.
  tensor_arrival arrival(std::string_view name) const;
  /// Whether a delta of the plan must still patch `name` (it is not whole
  /// already).
  bool needs_patch(std::string_view name) const;
  /// Whether `name` arrived whole from a holder (its bytes need no further
  /// reading from the store).
  bool whole(std::string_view name) const;
  /// A delta patched `name` (kept for the record).
  void patched(const std::string& name);
  /// The check `name` needs before activation.
  tensor_check check(std::string_view name) const;
  /// Tensors that arrived whole from holders, in name order.
  std::vector<std::string> from_holders() const;

private:
  bool seeding_;
  std::set<std::string, std::less<>> touched_;
  std::map<std::string, tensor_arrival, std::less<>> arrived_;
};

} // namespace stitch
