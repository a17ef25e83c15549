#include "node/peer_source.hpp"

#include <caf/all.hpp>

#include <thread>

#include "actors/log.hpp"
#include "actors/peer_offer.hpp"
#include "node/remote.hpp"

namespace stitch::node {

peer_source::peer_source(caf::actor_system& sys, coordinator_actor coordinator,
                         std::shared_ptr<tensor_source> store,
                         std::shared_ptr<transport::ucx::worker> worker, peer_source_options opts)
    : sys_(sys), coordinator_(std::move(coordinator)), store_(std::move(store)),
      worker_(std::move(worker)), opts_(std::move(opts)) {}

result<manifest> peer_source::manifest_of(const version_ref& ref) {
  return store_->manifest_of(ref);
}

status peer_source::read(const version_ref& ref, std::string_view tensor, uint64_t offset,
                         std::span<std::byte> out) {
  return store_->read(ref, tensor, offset, out);
}

fetch_report peer_source::fetch(const version_ref& ref, std::span<const fetch_target> targets,
                                const std::function<void(const transfer_progress&)>& progress) {
  return fetch_from(ref, targets, progress, false);
}

fetch_report
peer_source::fetch_frames(const version_ref& ref, std::span<const fetch_target> targets,
                          const std::function<void(const transfer_progress&)>& progress) {
  return fetch_from(ref, targets, progress, true);
}

fetch_report peer_source::fetch_from(const version_ref& ref, std::span<const fetch_target> targets,
                                     const std::function<void(const transfer_progress&)>& progress,
                                     bool frames) {
  fetch_report none;
  none.frames = frames;
  none.fetched.assign(targets.size(), false);
  auto holders = ask_actor<std::vector<holder_entry>>(
    sys_, coordinator_, opts_.ask_timeout, atom::lookup_v, opts_.pool, ref, opts_.replica_id,
    opts_.node, frames, opts_.member_token);
  if (!holders) {
    none.problems.push_back("the coordinator's directory did not answer: "
                            + holders.error().message);
    return none;
  }
  // Leases from every holder that still holds the version.
  std::vector<transport::ucx::offer> offers;
  std::vector<peer_holder_actor> leased;
  // std::vector<bool> has no contiguous storage to span.
  std::unique_ptr<bool[]> backup{new bool[holders->size() + 1]};
  for (const auto& h : *holders) {
    if (h.replica_id == opts_.replica_id)
      continue;
    auto o = ask_actor<peer_offer>(sys_, h.handle, opts_.ask_timeout, atom::offer_v, ref, frames,
                                   opts_.member_token);
    // A holder that began fetching just before this receiver offers what it
    // fetches once its own sources answered it: a moment later.
    for (auto until = std::chrono::steady_clock::now() + opts_.relay_wait;
         !o && h.partial && std::chrono::steady_clock::now() < until;) {
      std::this_thread::sleep_for(std::chrono::milliseconds{10});
      o = ask_actor<peer_offer>(sys_, h.handle, opts_.ask_timeout, atom::offer_v, ref, frames,
                                opts_.member_token);
    }
    if (!o) {
      none.problems.push_back(h.replica_id + " offers nothing: " + o.error().message);
      continue;
    }
    backup[offers.size()] = h.backup;
    offers.push_back(from_peer_offer(*o));
    leased.push_back(h.handle);
  }
  auto ended = [&](const fetch_report& r) {
    caf::anon_send(coordinator_, atom::done_v, opts_.pool, ref, opts_.replica_id, r.complete(),
                   frames, opts_.member_token);
  };
  if (offers.empty()) {
    ended(none);
    return none;
  }
  // A backup is asked only when every primary failed: with no primary left
  // (it did not answer), the backups are the primaries.
  bool any_primary = false;
  for (size_t i = 0; i < offers.size(); ++i)
    any_primary = any_primary || !backup[i];
  if (!any_primary)
    std::fill_n(backup.get(), offers.size(), false);
  auto* relay = frames ? opts_.frames_relay.get() : opts_.relay.get();
  auto report =
    transport::ucx::fetch(*worker_, ref, offers, targets, frames ? opts_.frames_fetch : opts_.fetch,
                          progress, std::span<const bool>{backup.get(), offers.size()}, relay);
  report.frames = frames;
  for (size_t i = 0; i < offers.size(); ++i)
    caf::anon_send(leased[i], atom::release_v, offers[i].lease);
  ended(report);
  report.problems.insert(report.problems.begin(), none.problems.begin(), none.problems.end());
  return report;
}

} // namespace stitch::node
