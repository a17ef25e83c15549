#pragma once

#include <memory>
#include <string_view>

#include "runtime/core/error.hpp"
#include "runtime/core/store_port.hpp"

namespace stitch::store {

/// Opens the backend a `store.uri` names: `rocksdb:PATH` (the embedded
/// default) or `s3://bucket/prefix` (endpoint, region and credentials from the
/// usual `AWS_*` variables). Anything else is `invalid_argument`.
result<std::unique_ptr<store_backend>> open_store(std::string_view uri);

} // namespace stitch::store
