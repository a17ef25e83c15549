#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "runtime/core/chain_planner.hpp"

namespace stitch::testing {

/// Manifests a test has read, by pool and version.
using manifest_cache = std::map<std::pair<std::string, version_ref>, manifest>;

/// The chain from `applied` to `to` over the manifests `db` (any store with
/// `read_manifest(pool, ref)`) holds for `pool`, each read once into `cache`.
template <class Store>
result<plan_outcome> plan_over(Store& db, manifest_cache& cache,
                               const std::optional<applied_state>& applied, const version_ref& to,
                               const std::string& pool = "default") {
  return plan_chain(applied, to, 0, [&](const version_ref& ref) -> manifest_lookup_result {
    auto key = std::make_pair(pool, ref);
    auto it = cache.find(key);
    if (it == cache.end()) {
      auto m = db.read_manifest(pool, ref);
      if (!m)
        return manifest_missing{};
      it = cache.emplace(std::move(key), *m).first;
    }
    return manifest_found{&it->second};
  });
}

} // namespace stitch::testing
