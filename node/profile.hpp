#pragma once

#include <caf/fwd.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

#include "node/cli.hpp"
#include "runtime/core/error.hpp"

namespace stitch::node {

struct profile_command {
  host_port coordinator;
  std::string replica;
  /// Take a replica in rotation out for the profile (and put it back).
  bool take_out = false;
  bool json = false;
  /// Also write the JSON here, and the chart next to it (`.svg`).
  std::string out;
  /// Versions the folded catch-up moves across at once (1..6: the chain
  /// stays within the publisher's anchor interval).
  uint32_t folded = 4;
  /// About one element in `stride` of every tensor changes in each delta
  /// (scattered, as an RL step's changes are).
  uint32_t stride = 8;
  /// Where the copy of the replica's weights is kept meanwhile (default: a
  /// fresh directory under the system's temporary directory).
  std::string work_dir;
  std::string token;
};

/// `stitch profile`: publishes scratch versions of the replica's own
/// weights into the scratch pool `profile-<replica>` and drives the replica
/// (any engine, through the Engine port) through a cold start from the
/// anchor, one delta, a delta of two tensors, a folded catch-up, an empty
/// delta and a run switch; prints each step's preparation (fetch, decode,
/// verify, the rest of the stage), drain, pause and total, the bytes moved,
/// how an external engine loaded the weights (partial or full, and why) and
/// the checksum verdict;
/// then returns the replica to its pool and back into rotation.
status run_profile(caf::actor_system& sys, const profile_command& cmd, std::FILE* out);

} // namespace stitch::node
