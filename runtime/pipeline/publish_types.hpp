#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/manifest.hpp"
#include "runtime/core/pointer_rules.hpp"

/// What a publish asks for and what it did: the one set of publish types,
/// used by the pipeline's publisher, the publisher actor's messages
/// (`actors/publisher_actor.hpp` adds only the caller's token), the CLI and
/// the HTTP publish surface.
namespace stitch::pipeline {

/// One version to publish.
struct publish_request {
  std::string pool = "default";
  std::string run_id;
  uint64_t version = 0;
  /// Publish a full anchor whatever the delta would cost (`--anchor`).
  bool force_anchor = false;
  /// Compute everything, touch neither the store nor the remembered version.
  bool dry_run = false;
  /// The checkpoint's small non-tensor files (`config.json`, tokenizer
  /// files), by file name, kept byte-identical with the version
  /// (`manifest::files`; limits in runtime/core/manifest.hpp).
  std::map<std::string, std::string> files = {};
};

/// What a publish did.
struct publish_report {
  version_kind kind = version_kind::full;
  /// The manifest's `touched`: every tensor for
  /// an anchor, the changed ones for a delta.
  std::vector<std::string> touched;
  /// Bytes of the full weights.
  uint64_t raw_bytes = 0;
  /// Bytes of the stored tensors before compression (for an anchor, the
  /// stored bytes; for a delta, the bytes of the touched tensors).
  uint64_t encoded_bytes = 0;
  /// Bytes of tensor data the version stores, after compression (the
  /// manifest's `total_size`).
  uint64_t stored_bytes = 0;
  /// The store already held this version with identical content.
  bool idempotent = false;
  /// The version claimed its run (first version of the run in this pool).
  bool claimed = false;
  /// The pool's pointer after publishing; nullopt for a dry run.
  std::optional<pointer_record> pointer;
  /// Why this version is a full anchor; empty for a delta.
  std::string reason_for_anchor;
  /// The manifest published (or that a dry run would publish). In-process
  /// only: a publisher actor answers without it (`without_manifest`), since
  /// its clients print the figures above and replicas read manifests from
  /// the store.
  manifest published;
};

/// `report` as a publisher actor answers it: the manifest left out.
inline publish_report without_manifest(publish_report report) {
  manifest none;
  std::swap(report.published, none);
  return report;
}

} // namespace stitch::pipeline
