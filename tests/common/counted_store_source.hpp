#pragma once

// A tensor source over a store's pool that counts the bytes read from the
// store, tensor by tensor: the base of test sources whose peers stand in
// for UCX holders, so a test tells what came from the store.

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "runtime/core/checksum.hpp"
#include "runtime/core/engine_port.hpp"
#include "runtime/core/transfer_port.hpp"
#include "runtime/pipeline/store_tensor_source.hpp"

namespace stitch::testing {

class counted_store_source : public tensor_source {
public:
  explicit counted_store_source(store_backend& db, std::string pool = "default")
      : store_(db, std::move(pool)) {}
  result<manifest> manifest_of(const version_ref& ref) override { return store_.manifest_of(ref); }
  status read(const version_ref& ref, std::string_view tensor, uint64_t offset,
              std::span<std::byte> out) override {
    stored_reads[std::string{tensor}] += out.size();
    return store_.read(ref, tensor, offset, out);
  }

  /// Bytes read from the store, by tensor.
  std::map<std::string, uint64_t> stored_reads;
  /// Frame bytes `frames_from_store` gave (verified).
  uint64_t frame_bytes = 0;
  /// A frame `frames_from_store` does not give, and one whose bytes it
  /// flips in transit (its digest then fails).
  std::string withheld;
  std::string corrupt_frame;

  /// What a holder of the stored frames gives (`transfer::fetch_frames`):
  /// their bytes as the store keeps them, uncounted, verified against the
  /// manifest's checksum as the UCX fetch verifies them.
  fetch_report frames_from_store(const version_ref& ref, std::span<const fetch_target> targets) {
    fetch_report r;
    r.frames = true;
    r.fetched.assign(targets.size(), false);
    for (size_t i = 0; i < targets.size(); ++i) {
      auto dest = targets[i].destination;
      if (targets[i].name == withheld || !store_.read(ref, targets[i].name, 0, dest))
        continue;
      if (targets[i].name == corrupt_frame && !dest.empty())
        dest[dest.size() / 2] ^= std::byte{1};
      r.fetched[i] = checksum::tree_checksum(dest) == targets[i].expected_checksum;
      if (r.fetched[i]) {
        r.bytes_by_source["holder"] += dest.size();
        frame_bytes += dest.size();
      }
    }
    return r;
  }

protected:
  /// The store itself, uncounted (what the stand-in peers read).
  pipeline::store_tensor_source store_;
};

} // namespace stitch::testing
