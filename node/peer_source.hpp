#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <caf/fwd.hpp>

#include "actors/coordinator_actor.hpp"
#include "runtime/core/engine_port.hpp"
#include "transport/ucx_peer.hpp"

namespace stitch::node {

struct peer_source_options {
  std::string pool;
  /// The receiving replica and its node (source choice prefers holders on
  /// the same node and never picks the receiver).
  std::string replica_id;
  std::string node;
  transport::ucx::fetch_options fetch;
  /// The same for a delta's frames (`fetch_frames`).
  transport::ucx::fetch_options frames_fetch = transport::ucx::frames_fetch_options();
  /// The replica's own holder: it offers what it has fetched to other
  /// receivers while it fetches (a relay). Null: it does not.
  std::shared_ptr<transport::ucx::holder> relay;
  /// The same for delta frames: it offers the frames it fetches while it
  /// fetches them, and keeps offering them afterwards (until the next).
  std::shared_ptr<transport::ucx::holder> frames_relay;
  /// How long the coordinator and each holder may take to answer.
  std::chrono::milliseconds ask_timeout{3000};
  /// How long a relay (a holder still fetching) may take to offer anything.
  std::chrono::milliseconds relay_wait{2000};
  /// The member capability the directory's lookups and ends carry.
  std::string member_token;
};

/// A replica's tensor source: stored bytes and manifests from `store`, and
/// the full tensors of a version from the holders the coordinator's
/// directory chooses (a primary, backups), leased, read over UCX, released;
/// the coordinator hears when the fetch ends. A holder that does not answer
/// or refuses is skipped; whatever no holder gave is built from the store
/// by the engine.
class peer_source final : public tensor_source, public transfer {
public:
  peer_source(caf::actor_system& sys, coordinator_actor coordinator,
              std::shared_ptr<tensor_source> store, std::shared_ptr<transport::ucx::worker> worker,
              peer_source_options opts);

  result<manifest> manifest_of(const version_ref& ref) override;
  status read(const version_ref& ref, std::string_view tensor, uint64_t offset,
              std::span<std::byte> out) override;
  transfer* peers() override { return this; }
  fetch_report fetch(const version_ref& ref, std::span<const fetch_target> targets,
                     const std::function<void(const transfer_progress&)>& progress) override;
  fetch_report fetch_frames(const version_ref& ref, std::span<const fetch_target> targets,
                            const std::function<void(const transfer_progress&)>& progress) override;

private:
  fetch_report fetch_from(const version_ref& ref, std::span<const fetch_target> targets,
                          const std::function<void(const transfer_progress&)>& progress,
                          bool frames);

  caf::actor_system& sys_;
  coordinator_actor coordinator_;
  std::shared_ptr<tensor_source> store_;
  std::shared_ptr<transport::ucx::worker> worker_;
  peer_source_options opts_;
};

} // namespace stitch::node
