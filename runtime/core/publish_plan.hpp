#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "runtime/core/version_ref.hpp"

/// The decisions of one publish (DESIGN §2, §7 `stitch publish`), apart from
/// the bytes: whether a version is verified, stored as a full anchor or as a
/// delta; what each chunk of a tensor tells the delta's encoder; how the
/// pool's pointer then moves; what the publisher remembers afterwards. The
/// publisher (`runtime/pipeline/publisher`) carries these out.
namespace stitch {

/// How one publish treats its bytes.
enum class publish_mode : uint8_t {
  /// The version is stored already (or, for a dry run, is the remembered
  /// copy): the bytes are checked against it and nothing is written.
  verify,
  /// Every tensor stored whole.
  anchor,
  /// The XOR against the remembered previous version, if it turns out
  /// smaller than the weights (else the publisher falls back to an anchor).
  delta,
};

std::string to_string(publish_mode m);

/// The run's last version the publisher remembers (its bytes and manifest).
struct remembered_version {
  uint64_t version = 0;
  /// The run's newest full anchor at or below `version`, when known.
  std::optional<uint64_t> last_anchor;
  /// Why the tensor list of the publish cannot be related to the remembered
  /// one by a delta (names, dtypes, shapes differ), or nullopt when it can.
  std::optional<std::string> layout_change;
};

/// What the publisher knows before it reads a byte.
struct publish_facts {
  std::string pool;
  version_ref ref;
  /// The store holds `ref` already (its manifest was found).
  bool stored = false;
  bool dry_run = false;
  /// `--anchor`.
  bool force_anchor = false;
  std::optional<remembered_version> remembered;
  /// `publisher.anchor_every` (0: no cadence).
  uint32_t anchor_every = 0;
};

struct publish_decision {
  publish_mode mode = publish_mode::anchor;
  /// Why a full anchor (empty unless `mode` is anchor).
  std::string reason;
  /// Verify against the remembered copy's manifest (a dry run of the
  /// remembered version), not the store's.
  bool against_remembered = false;
  /// The remembered copy is read chunk by chunk: the base of a delta, or the
  /// bytes a verification compares with.
  bool read_remembered = false;
  /// The remembered copy is rewritten with the published bytes (every
  /// publish but a dry run and a re-publish of the remembered version).
  bool rewrite_remembered = false;

  friend bool operator==(const publish_decision&, const publish_decision&) = default;
};

/// Verify what is stored; otherwise a delta against the remembered version
/// when it is the previous one, the tensor list is unchanged, the run's last
/// anchor is known and the anchor cadence is not due; otherwise an anchor,
/// with the first of those reasons that applies.
publish_decision decide_publish(const publish_facts& facts);

/// What a delta's encoder does with one tensor's chunks.
struct delta_effect {
  enum class kind : uint8_t {
    /// The tensor's frame starts (its first changed chunk showed up).
    begin,
    /// `bytes` zeros: unchanged bytes inside a changed tensor.
    zeros,
    /// `bytes` of the chunk's XOR.
    xor_bytes,
    /// The tensor's frame ends.
    end,
  };
  kind what = kind::zeros;
  uint64_t bytes = 0;

  friend bool operator==(const delta_effect&, const delta_effect&) = default;
};

/// At most three effects answer one event.
struct delta_effects {
  std::array<delta_effect, 3> items{};
  size_t count = 0;

  const delta_effect* begin() const noexcept { return items.data(); }
  const delta_effect* end() const noexcept { return items.data() + count; }
  void push(delta_effect e) noexcept { items[count++] = e; }
};

/// One tensor of a delta, chunk by chunk. An unchanged tensor stores nothing
/// (it is not touched); a changed one stores a frame from its start, where
/// the unchanged chunks before the first change are zeros in the XOR.
class delta_tensor_coder {
public:
  /// The next `bytes` of the tensor compared with the remembered version.
  delta_effects chunk(uint64_t bytes, bool same);
  /// The tensor's bytes are all seen: its frame ends, if it began.
  delta_effects finish();
  /// Some chunk differed.
  bool touched() const noexcept { return begun_; }

private:
  bool begun_ = false;
  uint64_t zeros_pending_ = 0;
};

/// How the pool's pointer moves once the version is stored.
enum class pointer_step : uint8_t {
  /// It names the version already.
  none,
  /// Compare-and-advance from what the publish read.
  advance,
  /// Claim the run at this version (a full anchor, a run this publisher has
  /// not published before). A claim refused with `version_exists` means the
  /// run was claimed here at an earlier boot: advance instead.
  claim,
};

std::string to_string(pointer_step s);

/// `latest`: the pointer as the publish read it; `remembered`: the publisher
/// held a previous version of the run; `full`: the stored version is an
/// anchor.
pointer_step decide_pointer_step(const std::optional<version_ref>& latest, const version_ref& ref,
                                 bool remembered, bool full);

/// The run's last anchor the publisher remembers after storing `version`:
/// itself for an anchor; for a delta on the remembered previous version,
/// that version's last anchor; otherwise unknown.
std::optional<uint64_t> last_anchor_after(uint64_t version, bool full,
                                          const std::optional<remembered_version>& before);

} // namespace stitch
