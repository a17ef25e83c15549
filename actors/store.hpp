#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/store_actor.hpp"
#include "runtime/core/store_port.hpp"

namespace stitch {

struct store_state {
  static inline const char* name = "store";

  /// A version being uploaded: each shard spools to a file until `put_end`.
  struct upload {
    std::string pool;
    manifest m;
    std::map<std::string, std::filesystem::path> shard_files;
    uint64_t bytes = 0;
  };

  std::shared_ptr<store_backend> backend;
  std::filesystem::path spool_dir;
  std::map<std::string, std::vector<caf::actor>> subscribers;
  std::map<uint64_t, upload> uploads;
  uint64_t next_upload = 1;
};

/// Hosts `backend`. Backend calls block, so spawn it `caf::detached`.
/// `spool_dir` holds shards of uploads in progress.
store_actor::behavior_type store_service(store_actor::stateful_pointer<store_state> self,
                                         std::shared_ptr<store_backend> backend,
                                         std::filesystem::path spool_dir);

} // namespace stitch
