#pragma once

#include <string>

#include "runtime/core/engine_port.hpp"
#include "runtime/core/store_port.hpp"

namespace stitch::pipeline {

/// An engine's tensor source over a store backend (the store itself, or a
/// `remote_store` on another node): manifests and stored bytes of one pool.
class store_tensor_source final : public tensor_source {
public:
  store_tensor_source(store_backend& store, std::string pool)
      : store_(store), pool_(std::move(pool)) {}

  result<manifest> manifest_of(const version_ref& ref) override {
    return store_.read_manifest(pool_, ref);
  }
  status read(const version_ref& ref, std::string_view tensor, uint64_t offset,
              std::span<std::byte> out) override {
    return store_.read_range(pool_, ref, tensor, offset, out);
  }

private:
  store_backend& store_;
  std::string pool_;
};

} // namespace stitch::pipeline
