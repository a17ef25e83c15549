#include "runtime/core/reconciler.hpp"

namespace stitch {

namespace fx = reconcile_effects;

std::string_view to_string(sync_state state) noexcept {
  switch (state) {
    case sync_state::idle: return "IDLE";
    case sync_state::fetching: return "FETCHING";
    case sync_state::staging: return "STAGING";
    case sync_state::committing: return "COMMITTING";
    case sync_state::error: return "ERROR";
  }
  return "ERROR";
}

std::vector<reconcile_effect> reconciler::on_trigger(trigger) {
  effects out;
  if (phase_ != phase::idle) {
    pending_ = true;
    return out;
  }
  if (terminal()) {
    // A failed rebuild is retried on the next trigger.
    phase_ = phase::rebuilding;
    awaited_op_ = next_op();
    out.emplace_back(fx::rebuild_engine{awaited_op_, applied_});
    return out;
  }
  begin_pass(out);
  return out;
}

void reconciler::begin_pass(effects& out) {
  ++metrics_.passes_total;
  phase_ = phase::reading_pointer;
  state_ = sync_state::fetching;
  manifests_.clear();
  missing_.clear();
  staged_.reset();
  stage_time_ = std::chrono::nanoseconds{0};
  awaited_op_ = next_op();
  out.emplace_back(fx::read_pointer{awaited_op_});
}

void reconciler::end_pass(effects& out) {
  phase_ = phase::idle;
  manifests_.clear();
  missing_.clear();
  if (pending_) {
    pending_ = false;
    begin_pass(out);
  }
}

void reconciler::fail_pass(std::string reason, effects& out) {
  reason_ = std::move(reason);
  state_ = sync_state::error;
  if (shadow_dirty_) {
    out.emplace_back(fx::discard_shadow{});
    shadow_dirty_ = false;
  }
  staged_.reset();
  end_pass(out);
}

void reconciler::leave(std::string reason, effects& out) {
  if (!in_rotation_ && rotation_reason_ == reason)
    return;
  in_rotation_ = false;
  rotation_reason_ = reason;
  out.emplace_back(fx::leave_rotation{std::move(reason)});
}

void reconciler::mark_caught_up(effects& out) {
  ready_ = true;
  reason_.clear();
  state_ = sync_state::idle;
  if (!in_rotation_ && applied_) {
    in_rotation_ = true;
    rotation_reason_.clear();
    out.emplace_back(fx::enter_rotation{*applied_});
  }
}

manifest_lookup_result reconciler::lookup(const version_ref& ref) const {
  if (auto it = manifests_.find(ref); it != manifests_.end())
    return manifest_found{&it->second};
  if (missing_.contains(ref))
    return manifest_missing{};
  return manifest_pending{};
}

std::vector<reconcile_effect>
reconciler::on_pointer_read(uint64_t op, result<std::optional<pointer_record>> pointer) {
  effects out;
  if (op != awaited_op_ || (phase_ != phase::reading_pointer && phase_ != phase::rechecking))
    return out;
  if (phase_ == phase::rechecking) {
    // The head is re-read once after staging; whatever it says, this pass
    // commits at most once. A failed read commits what is staged.
    if (!pointer) {
      start_commit(out);
      return out;
    }
    if (!pointer->has_value() || (*pointer)->latest.run_id != staged_->target.run_id) {
      // The run changed under us: the shadow is useless, start over.
      out.emplace_back(fx::discard_shadow{});
      shadow_dirty_ = false;
      staged_.reset();
      pending_ = true;
      state_ = sync_state::idle;
      end_pass(out);
      return out;
    }
    if ((*pointer)->latest.version <= staged_->target.version) {
      start_commit(out);
      return out;
    }
    pointer_ = **pointer;
    phase_ = phase::restaging_plan;
    plan_next(out);
    return out;
  }
  if (!pointer) {
    fail_pass("reading the pointer failed: " + to_string(pointer.error()), out);
    return out;
  }
  if (!pointer->has_value()) {
    pointer_.reset();
    ready_ = false;
    reason_ = "no run claimed";
    state_ = sync_state::idle;
    leave("no run claimed", out);
    end_pass(out);
    return out;
  }
  pointer_ = **pointer;
  phase_ = phase::planning;
  plan_next(out);
  return out;
}

std::vector<reconcile_effect> reconciler::on_manifest_read(uint64_t op, const version_ref& ref,
                                                           result<manifest> m) {
  effects out;
  if (op != awaited_op_ || (phase_ != phase::planning && phase_ != phase::restaging_plan))
    return out;
  if (m) {
    manifests_.insert_or_assign(ref, std::move(m).value());
  } else if (m.error().code == errc::not_found) {
    missing_.insert(ref);
  } else {
    fail_pass("reading the manifest of " + to_string(ref) + " failed: " + to_string(m.error()),
              out);
    return out;
  }
  plan_next(out);
  return out;
}

void reconciler::plan_next(effects& out) {
  const bool restage = phase_ == phase::restaging_plan;
  std::optional<applied_state> from;
  if (restage)
    from = applied_state{staged_->target, true};
  else if (applied_)
    from = applied_state{*applied_, true};
  auto outcome = plan_chain(from, pointer_->latest, pointer_->boot_version,
                            [this](const version_ref& ref) { return lookup(ref); });
  if (!outcome) {
    fail_pass("planning " + to_string(pointer_->latest) + " failed: " + to_string(outcome.error()),
              out);
    return;
  }
  if (auto* need = std::get_if<needs_manifest>(&*outcome)) {
    state_ = sync_state::fetching;
    awaited_op_ = next_op();
    out.emplace_back(fx::read_manifest{awaited_op_, need->ref});
    return;
  }
  auto plan = std::get<chain_plan>(std::move(*outcome));
  if (restage) {
    if (plan.folded_versions() == 0) {
      start_commit(out);
      return;
    }
    chain_plan merged = plan.anchor ? plan : *staged_;
    merged.reset_to_boot = staged_->reset_to_boot;
    if (!plan.anchor) {
      merged.target = plan.target;
      merged.deltas.insert(merged.deltas.end(), plan.deltas.begin(), plan.deltas.end());
      merged.touched.insert(plan.touched.begin(), plan.touched.end());
    }
    merged.activation_needed = true;
    staged_ = std::move(merged);
    phase_ = phase::restaging;
    state_ = sync_state::staging;
    awaited_op_ = next_op();
    out.emplace_back(fx::stage{awaited_op_, std::move(plan), true});
    return;
  }
  if (plan.folded_versions() == 0 && !plan.reset_to_boot) {
    mark_caught_up(out);
    end_pass(out);
    return;
  }
  if (!plan.activation_needed) {
    applied_ = plan.target;
    ++metrics_.skipped_activations_total;
    metrics_.folded_versions_total += plan.folded_versions();
    metrics_.last_folded = plan.folded_versions();
    out.emplace_back(fx::advance{plan.target});
    mark_caught_up(out);
    end_pass(out);
    return;
  }
  staged_ = plan;
  shadow_dirty_ = true;
  phase_ = phase::staging;
  state_ = sync_state::staging;
  awaited_op_ = next_op();
  out.emplace_back(fx::stage{awaited_op_, std::move(plan), false});
}

std::vector<reconcile_effect> reconciler::on_staged(uint64_t op, status outcome,
                                                    std::chrono::nanoseconds took) {
  effects out;
  if (op != awaited_op_ || (phase_ != phase::staging && phase_ != phase::restaging))
    return out;
  if (!outcome) {
    ++metrics_.stage_failures_total;
    fail_pass("staging " + to_string(staged_->target) + " failed: " + to_string(outcome.error()),
              out);
    return out;
  }
  ++metrics_.stages_total;
  stage_time_ += took;
  metrics_.last_stage = stage_time_;
  if (phase_ == phase::restaging) {
    start_commit(out);
    return out;
  }
  phase_ = phase::rechecking;
  awaited_op_ = next_op();
  out.emplace_back(fx::read_pointer{awaited_op_});
  return out;
}

void reconciler::start_commit(effects& out) {
  phase_ = phase::committing;
  state_ = sync_state::committing;
  awaited_op_ = next_op();
  out.emplace_back(
    fx::commit{awaited_op_, staged_->target, staged_->reset_to_boot, staged_->reset_to_boot});
}

std::vector<reconcile_effect> reconciler::on_committed(uint64_t op, status outcome,
                                                       std::chrono::nanoseconds took) {
  effects out;
  if (op != awaited_op_ || phase_ != phase::committing)
    return out;
  shadow_dirty_ = false;
  if (!outcome) {
    ++metrics_.activation_failures_total;
    ready_ = false;
    terminal_error_ =
      "activating " + to_string(staged_->target) + " failed: " + to_string(outcome.error());
    reason_ = terminal_error_;
    state_ = sync_state::error;
    staged_.reset();
    leave(terminal_error_, out);
    phase_ = phase::rebuilding;
    awaited_op_ = next_op();
    out.emplace_back(fx::rebuild_engine{awaited_op_, applied_});
    return out;
  }
  applied_ = staged_->target;
  ++metrics_.commits_total;
  metrics_.last_commit = took;
  metrics_.folded_versions_total += staged_->folded_versions();
  metrics_.last_folded = staged_->folded_versions();
  staged_.reset();
  mark_caught_up(out);
  end_pass(out);
  return out;
}

std::vector<reconcile_effect> reconciler::on_rebuilt(uint64_t op, result<version_ref> version) {
  effects out;
  if (op != awaited_op_ || phase_ != phase::rebuilding)
    return out;
  phase_ = phase::idle;
  pending_ = false;
  if (!version) {
    terminal_error_ = "rebuilding the engine failed: " + to_string(version.error());
    reason_ = terminal_error_;
    state_ = sync_state::error;
    return out;
  }
  applied_ = std::move(version).value();
  terminal_error_.clear();
  reason_ = "engine rebuilt; catching up";
  begin_pass(out);
  return out;
}

status reconciler::retarget(bool forget_applied) {
  if (phase_ != phase::idle)
    return make_error(errc::conflict, "a reconcile pass is running");
  pointer_.reset();
  pending_ = false;
  ready_ = false;
  in_rotation_ = false;
  rotation_reason_.clear();
  state_ = sync_state::idle;
  reason_ = "following another pool; not caught up yet";
  if (forget_applied)
    applied_.reset();
  return {};
}

reconcile_status reconciler::snapshot() const {
  reconcile_status s;
  s.ready = ready_;
  s.applied = applied_;
  if (pointer_)
    s.pointer = pointer_->latest;
  s.state = state_;
  s.reason = reason_;
  s.terminal_error = terminal_error_;
  s.metrics = metrics_;
  return s;
}

} // namespace stitch
