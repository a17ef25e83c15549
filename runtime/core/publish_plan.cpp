#include "runtime/core/publish_plan.hpp"

#include "runtime/core/error.hpp"

namespace stitch {

std::string to_string(publish_mode m) {
  switch (m) {
    case publish_mode::verify: return "verify";
    case publish_mode::anchor: return "anchor";
    case publish_mode::delta: return "delta";
  }
  return "unknown";
}

std::string to_string(pointer_step s) {
  switch (s) {
    case pointer_step::none: return "none";
    case pointer_step::advance: return "advance";
    case pointer_step::claim: return "claim";
  }
  return "unknown";
}

publish_decision decide_publish(const publish_facts& facts) {
  const auto& prev = facts.remembered;
  const uint64_t v = facts.ref.version;
  const bool copy_is_this_version = prev && prev->version == v;
  publish_decision d;
  std::string reason;
  if (facts.stored) {
    d.mode = publish_mode::verify;
  } else if (facts.dry_run && copy_is_this_version) {
    d.mode = publish_mode::verify;
    d.against_remembered = true;
  } else if (facts.force_anchor) {
    reason = "requested (--anchor)";
  } else if (!prev) {
    reason = "first version of run " + in_quotes(facts.ref.run_id) + " in pool "
             + in_quotes(facts.pool) + " this publisher has seen";
  } else if (copy_is_this_version) {
    reason = "the store no longer holds the remembered version";
  } else if (prev->version + 1 != v) {
    reason = "the previous version in memory is " + std::to_string(prev->version) + ", not "
             + std::to_string(v - 1);
  } else if (prev->layout_change) {
    reason = "the tensor set changed: " + *prev->layout_change;
  } else if (!prev->last_anchor) {
    reason = "the run's last anchor is unknown";
  } else if (facts.anchor_every != 0 && v - *prev->last_anchor >= facts.anchor_every) {
    reason = std::to_string(v - *prev->last_anchor) + " versions since anchor "
             + std::to_string(*prev->last_anchor)
             + " (anchor_every = " + std::to_string(facts.anchor_every) + ")";
  }
  if (d.mode != publish_mode::verify)
    d.mode = reason.empty() ? publish_mode::delta : publish_mode::anchor;
  d.reason = d.mode == publish_mode::anchor ? std::move(reason) : std::string{};
  const bool compare_only = d.mode == publish_mode::verify && copy_is_this_version;
  d.read_remembered = d.mode == publish_mode::delta || compare_only;
  d.rewrite_remembered = !facts.dry_run && !compare_only;
  return d;
}

delta_effects delta_tensor_coder::chunk(uint64_t bytes, bool same) {
  delta_effects out;
  if (same && !begun_) {
    zeros_pending_ += bytes;
    return out;
  }
  if (!begun_) {
    begun_ = true;
    out.push({delta_effect::kind::begin, 0});
    if (zeros_pending_ > 0)
      out.push({delta_effect::kind::zeros, zeros_pending_});
    zeros_pending_ = 0;
  }
  out.push({same ? delta_effect::kind::zeros : delta_effect::kind::xor_bytes, bytes});
  return out;
}

delta_effects delta_tensor_coder::finish() {
  delta_effects out;
  if (begun_)
    out.push({delta_effect::kind::end, 0});
  return out;
}

pointer_step decide_pointer_step(const std::optional<version_ref>& latest, const version_ref& ref,
                                 bool remembered, bool full) {
  if (latest && *latest == ref)
    return pointer_step::none;
  if (remembered || !full || (latest && latest->run_id == ref.run_id))
    return pointer_step::advance;
  return pointer_step::claim;
}

std::optional<uint64_t> last_anchor_after(uint64_t version, bool full,
                                          const std::optional<remembered_version>& before) {
  if (full)
    return version;
  if (before && before->version + 1 == version)
    return before->last_anchor;
  return std::nullopt;
}

} // namespace stitch
