#include "runtime/core/pointer_rules.hpp"

namespace stitch {

namespace {

std::string describe_optional(const std::optional<version_ref>& ref) {
  return ref ? to_string(*ref) : std::string{"(none)"};
}

result<pointer_decision> claim_run(const version_ref& target, bool is_full_anchor,
                                   std::optional<uint64_t> known_run_boot) {
  if (known_run_boot) {
    if (target.version < *known_run_boot)
      return make_error(errc::rewind, to_string(target) + " is below the boot version "
                                        + std::to_string(*known_run_boot) + " of run '"
                                        + target.run_id + "'");
    return pointer_decision{pointer_move::claim, pointer_record{target, *known_run_boot}};
  }
  if (!is_full_anchor)
    return make_error(errc::invalid_argument, "the first version of run '" + target.run_id
                                                + "' must be a full anchor, but "
                                                + to_string(target) + " is a delta");
  return pointer_decision{pointer_move::claim, pointer_record{target, target.version}};
}

} // namespace

result<pointer_decision> decide_pointer_move(const std::optional<pointer_record>& current,
                                             const pointer_proposal& proposal) {
  const auto& target = proposal.target;
  if (auto ok = validate_run_id(target.run_id); !ok)
    return std::move(ok).error();
  if (!current || current->latest.run_id != target.run_id)
    return claim_run(target, proposal.is_full_anchor, proposal.known_run_boot);
  const auto& latest = current->latest;
  if (target.version < latest.version)
    return make_error(errc::rewind, "refusing to rewind the pointer from " + to_string(latest)
                                      + " to " + to_string(target));
  if (target.version == latest.version) {
    if (proposal.stored_content_identical.value_or(false))
      return pointer_decision{pointer_move::unchanged, *current};
    return make_error(errc::version_exists,
                      to_string(target) + " is already published with different content");
  }
  return pointer_decision{pointer_move::advance, pointer_record{target, current->boot_version}};
}

result<pointer_decision> decide_claim(const std::optional<pointer_record>& current,
                                      const version_ref& boot, bool is_full_anchor,
                                      std::optional<uint64_t> known_run_boot) {
  if (auto ok = validate_run_id(boot.run_id); !ok)
    return std::move(ok).error();
  if (!is_full_anchor)
    return make_error(errc::invalid_argument,
                      "a claim must name a full anchor, but " + to_string(boot) + " is a delta");
  if (known_run_boot && *known_run_boot != boot.version)
    return make_error(errc::version_exists, "run '" + boot.run_id + "' is already claimed at boot "
                                              + std::to_string(*known_run_boot) + ", not "
                                              + std::to_string(boot.version));
  if (current && current->latest.run_id == boot.run_id)
    return pointer_decision{pointer_move::unchanged, *current};
  return pointer_decision{pointer_move::claim, pointer_record{boot, boot.version}};
}

status check_compare_and_swap(const std::optional<version_ref>& expected,
                              const std::optional<version_ref>& actual,
                              const version_ref& proposed) {
  if (expected == actual)
    return {};
  return make_error(errc::conflict, describe(cas_conflict{expected, actual, proposed}));
}

std::string describe(const cas_conflict& conflict) {
  return "pointer moved concurrently: expected " + describe_optional(conflict.expected) + ", found "
         + describe_optional(conflict.actual) + ", proposing " + to_string(conflict.proposed);
}

} // namespace stitch
