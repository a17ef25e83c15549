#pragma once

// A store backend that forwards to another and can hide its pointer moves
// from its observers for a while: a test's way to "lose" a wake (a
// notification that never arrives) while the pointer really moves.

#include <atomic>
#include <memory>

#include "runtime/core/store_port.hpp"

namespace stitch::testing {

class mutable_backend final : public store_backend {
public:
  explicit mutable_backend(std::shared_ptr<store_backend> real) : real_(std::move(real)) {}
  ~mutable_backend() override {
    for (auto id : ids_)
      real_->unobserve_pointers(id);
  }

  /// While set, pointer moves reach no observer of this backend.
  void mute(bool on) { muted_->store(on); }

  uint64_t observe_pointers(pointer_observer observer) override {
    auto id = real_->observe_pointers([muted = muted_, observer = std::move(observer)](
                                        const std::string& pool, const pointer_record& now) {
      if (!muted->load())
        observer(pool, now);
    });
    ids_.push_back(id);
    return id;
  }
  void unobserve_pointers(uint64_t id) override {
    std::erase(ids_, id);
    real_->unobserve_pointers(id);
  }
  result<std::optional<pointer_record>> read_pointer(std::string_view pool) override {
    return real_->read_pointer(pool);
  }
  std::optional<pointer_record> pointer_without_io(std::string_view pool) override {
    return real_->pointer_without_io(pool);
  }
  result<pointer_record> claim(std::string_view pool, const version_ref& boot) override {
    return real_->claim(pool, boot);
  }
  result<pointer_record> compare_and_advance_pointer(std::string_view pool,
                                                     const std::optional<version_ref>& expected,
                                                     const version_ref& proposed) override {
    return real_->compare_and_advance_pointer(pool, expected, proposed);
  }
  result<std::unique_ptr<version_writer>> begin_version(std::string_view pool,
                                                        const version_ref& ref) override {
    return real_->begin_version(pool, ref);
  }
  result<manifest> read_manifest(std::string_view pool, const version_ref& ref) override {
    return real_->read_manifest(pool, ref);
  }
  status read_range(std::string_view pool, const version_ref& ref, std::string_view tensor,
                    uint64_t offset, std::span<std::byte> out) override {
    return real_->read_range(pool, ref, tensor, offset, out);
  }
  result<std::vector<version_ref>> list_versions(std::string_view pool,
                                                 std::string_view run_id) override {
    return real_->list_versions(pool, run_id);
  }
  result<std::vector<std::string>> list_pools() override { return real_->list_pools(); }
  result<retention_report> retain(std::string_view pool,
                                  const retention_request& request) override {
    return real_->retain(pool, request);
  }

private:
  std::shared_ptr<store_backend> real_;
  std::shared_ptr<std::atomic<bool>> muted_ = std::make_shared<std::atomic<bool>>(false);
  std::vector<uint64_t> ids_;
};

} // namespace stitch::testing
