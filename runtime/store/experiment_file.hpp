#pragma once

// The coordinator's durable state: the active experiments (spec as scaled,
// whether the trainer ended, the replica-name counter), so that a restarted
// coordinator recovers them and adopts the replicas that kept serving
// (`cluster_plan::restore`). One msgpack record in one file, replaced
// atomically (write a temporary beside it, fsync, rename, fsync the
// directory): a crash leaves the old record or the new one, never half.

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/cluster_plan.hpp"
#include "runtime/core/error.hpp"

namespace stitch::store {

std::string encode_experiments(const std::vector<experiment_record>& records);
/// Refuses a record that is not one (corrupt_data, naming the problem).
result<std::vector<experiment_record>> decode_experiments(std::string_view bytes);

/// Writes the record to `path` atomically and durably.
status save_experiments(const std::filesystem::path& path,
                        const std::vector<experiment_record>& records);
/// The record at `path`; none when the file does not exist (a first start).
result<std::vector<experiment_record>> load_experiments(const std::filesystem::path& path);

} // namespace stitch::store
