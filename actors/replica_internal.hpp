#pragma once

// Internal to the replica actor's files: replica.cpp (requests, reconcile
// effects, the behaviour) and replica_profile.cpp (the `stitch profile`
// driver). Included only by them, after <caf/all.hpp>.

#include <chrono>
#include <string>
#include <vector>

#include "actors/replica.hpp"

namespace stitch::replica_detail {

using self_ptr = replica_actor::stateful_pointer<replica_state>;

// --- replica.cpp ---

/// Carries out what the reconciler decided, then tells subscribers.
void apply(self_ptr self, std::vector<reconcile_effect> effects);
/// Tells subscribers when what routing depends on changed.
void publish_state(self_ptr self);
std::chrono::nanoseconds since(std::chrono::steady_clock::time_point t0);
/// Where the bytes between two snapshots came from.
fetch_summary fetched_between(const counting_source::counts& before,
                              const counting_source::counts& after);

// --- replica_profile.cpp: the replica's side of `stitch profile` ---

/// Moves a profile on whenever the replica may have become quiet: the
/// begin once nothing runs, a step once its pass ended, the way home.
void profile_progress(self_ptr self);
/// Renews the profile's lease: it runs out `profile_lease` from now unless
/// a step renews it again.
void renew_lease(self_ptr self);
/// Takes the replica out of rotation to follow scratch pool `pool` once it
/// is quiet (answered then).
caf::result<replica_info> begin_profile(self_ptr self, const std::string& pool, bool take_out);
/// One profile step: a pass to `target`, answered when it ended and was
/// judged.
caf::result<profile_step> begin_step(self_ptr self, const version_ref& target);
/// The worker judged step `step`: its answer goes out, the lease renewed.
void step_judged(self_ptr self, uint64_t step, profile_step& out);
/// No step came for `profile_lease`: the profile is abandoned, the replica
/// goes home.
void lease_ran_out(self_ptr self, uint64_t lease);
/// Ends a profile: back to the home pool, answered once there.
caf::result<replica_info> end_profile(self_ptr self);

} // namespace stitch::replica_detail
