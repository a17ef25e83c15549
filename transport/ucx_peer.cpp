#include "transport/ucx_peer.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <thread>

#include "runtime/core/checksum.hpp"
#include "runtime/core/fanout.hpp"

namespace stitch::transport::ucx {

// -- holder -------------------------------------------------------------------

struct holder::exposure {
  host_weights weights;
  /// Per offered tensor (null for an empty one), shared with the next
  /// exposure when it offers the same buffer.
  std::vector<std::shared_ptr<region>> regions;
  /// Where each tensor's bytes are: its index in `proto.tensors`.
  std::map<const std::byte*, size_t> by_address;
  offer proto;
  /// A staged exposure's progress words (one per offered tensor) and their
  /// registration.
  std::unique_ptr<uint64_t[]> words;
  std::shared_ptr<region> words_region;
};

namespace {

/// What a staged exposure keeps alive: its fetch targets' destinations.
struct kept_destinations {
  std::vector<std::shared_ptr<const void>> keep;
};

class staged_relay final : public holder::relay {
public:
  staged_relay(std::shared_ptr<const void> exposure, uint64_t* words, std::vector<int64_t> slots)
      : exposure_(std::move(exposure)), words_(words), slots_(std::move(slots)) {}
  void verified(size_t t, uint64_t bytes) override { set(t, bytes); }
  void abandon(size_t t) override { set(t, abandoned_progress); }

private:
  void set(size_t t, uint64_t value) {
    if (t < slots_.size() && slots_[t] >= 0)
      std::atomic_ref<uint64_t>{words_[slots_[t]]}.store(value, std::memory_order_release);
  }
  std::shared_ptr<const void> exposure_;
  uint64_t* words_;
  std::vector<int64_t> slots_;
};

} // namespace

holder::holder(std::shared_ptr<worker> w, std::string source, std::chrono::milliseconds lease_ttl)
    : worker_(std::move(w)), source_(std::move(source)), ttl_(lease_ttl) {}

holder::~holder() = default;

status holder::expose(host_weights weights) {
  // A buffer the exposure before offered too (a tensor the last delta did
  // not touch: engines share it between versions, and host weights never
  // change while exposed) keeps its registration and digests.
  std::shared_ptr<const exposure> before, staged;
  {
    std::lock_guard lock{mutex_};
    before = current_;
    staged = staging_;
  }
  auto e = std::make_shared<exposure>();
  size_t fresh = 0;
  e->proto.source = source_;
  e->proto.version = weights.version;
  e->proto.worker_address = worker_->address();
  for (const auto& t : weights.tensors) {
    offered_tensor o;
    o.name = t.name;
    o.size = t.bytes.size();
    std::shared_ptr<region> r;
    // The version before, or the fetch that brought these buffers.
    for (const auto* was : {before.get(), staged.get()})
      if (was && !r && !t.bytes.empty())
        if (auto it = was->by_address.find(t.bytes.data());
            it != was->by_address.end() && was->proto.tensors[it->second].size == t.bytes.size()
            && was->regions[it->second]) {
          const auto& same = was->proto.tensors[it->second];
          o.address = same.address;
          o.rkey = same.rkey;
          o.leaves = same.leaves;
          r = was->regions[it->second];
        }
    if (!r && !t.bytes.empty()) {
      o.leaves.reserve(checksum::chunk_count(t.bytes.size()));
      for (size_t at = 0; at < t.bytes.size(); at += checksum::chunk_size)
        o.leaves.push_back(checksum::chunk_digest(
          t.bytes.subspan(at, std::min(checksum::chunk_size, t.bytes.size() - at))));
      auto mapped = region::map(worker_->ctx(), t.bytes);
      if (!mapped)
        return make_error(mapped.error().code, "exposing tensor '" + t.name + "' of "
                                                 + to_string(weights.version) + ": "
                                                 + mapped.error().message);
      r = std::move(*mapped);
      ++fresh;
      auto d = worker_->describe(*r);
      o.address = d.address;
      o.rkey = std::move(d.rkey);
    }
    if (!t.bytes.empty())
      e->by_address.emplace(t.bytes.data(), e->proto.tensors.size());
    e->regions.push_back(std::move(r));
    e->proto.tensors.push_back(std::move(o));
  }
  e->weights = std::move(weights);
  std::lock_guard lock{mutex_};
  if (staging_ && staging_->proto.version == e->proto.version)
    staging_.reset(); // served now in full (leases keep the staged one)
  current_ = std::move(e);
  registered_ += fresh;
  return {};
}

result<std::shared_ptr<holder::relay>>
holder::stage(const version_ref& ref, std::span<const fetch_target> targets,
              std::span<const std::vector<uint64_t>> leaves) {
  auto e = std::make_shared<exposure>();
  e->proto.source = source_;
  e->proto.version = ref;
  e->proto.worker_address = worker_->address();
  e->proto.partial = true;
  size_t n = std::max<size_t>(targets.size(), 1);
  e->words = std::make_unique<uint64_t[]>(n);
  std::fill_n(e->words.get(), n, uint64_t{0});
  auto words = region::map(worker_->ctx(), std::as_bytes(std::span{e->words.get(), n}));
  if (!words)
    return std::move(words).error();
  e->words_region = std::move(*words);
  auto wd = worker_->describe(*e->words_region);
  e->proto.progress_address = wd.address;
  e->proto.progress_rkey = std::move(wd.rkey);
  auto kept = std::make_shared<kept_destinations>();
  std::vector<int64_t> slots(targets.size(), -1);
  for (size_t t = 0; t < targets.size(); ++t) {
    const auto& target = targets[t];
    if (t >= leaves.size() || leaves[t].empty() || target.destination.empty())
      continue;
    auto mapped = region::map(worker_->ctx(), target.destination);
    if (!mapped)
      return make_error(mapped.error().code, "offering tensor '" + target.name + "' of "
                                               + to_string(ref)
                                               + " while fetching it: " + mapped.error().message);
    auto d = worker_->describe(**mapped);
    slots[t] = static_cast<int64_t>(t);
    e->by_address.emplace(target.destination.data(), e->proto.tensors.size());
    e->proto.tensors.push_back({target.name, d.address, target.destination.size(),
                                std::move(d.rkey), leaves[t], static_cast<uint32_t>(t)});
    e->regions.push_back(std::move(*mapped));
    kept->keep.push_back(target.keep);
  }
  e->weights.version = ref;
  e->weights.keep = kept;
  auto relay = std::make_shared<staged_relay>(e, e->words.get(), std::move(slots));
  std::lock_guard lock{mutex_};
  staging_ = std::move(e);
  return std::shared_ptr<holder::relay>{std::move(relay)};
}

size_t holder::registered_total() const {
  std::lock_guard lock{mutex_};
  return registered_;
}

void holder::withdraw() {
  std::shared_ptr<exposure> dropped, staged;
  std::lock_guard lock{mutex_};
  dropped.swap(current_);
  staged.swap(staging_);
}

void holder::sweep_locked(std::chrono::steady_clock::time_point now) {
  std::erase_if(leases_, [&](const auto& kv) { return kv.second.until <= now; });
}

result<offer> holder::lease(const version_ref& version) {
  std::lock_guard lock{mutex_};
  auto now = std::chrono::steady_clock::now();
  sweep_locked(now);
  const auto& what = current_ && current_->proto.version == version ? current_ : staging_;
  if (!what || what->proto.version != version)
    return make_error(errc::not_found, source_ + " does not hold " + to_string(version));
  // Unique in the process: a holder_set releases by id alone.
  static std::atomic<uint64_t> next_lease{1};
  uint64_t id = next_lease++;
  leases_[id] = {what, now + ttl_};
  offer o = what->proto;
  o.lease = id;
  return o;
}

void holder::release(uint64_t lease) {
  std::shared_ptr<exposure> dropped;
  std::lock_guard lock{mutex_};
  if (auto it = leases_.find(lease); it != leases_.end()) {
    dropped = std::move(it->second.what);
    leases_.erase(it);
  }
  sweep_locked(std::chrono::steady_clock::now());
}

std::optional<version_ref> holder::exposed() const {
  std::lock_guard lock{mutex_};
  if (!current_)
    return std::nullopt;
  return current_->proto.version;
}

size_t holder::leases() const {
  std::lock_guard lock{mutex_};
  return leases_.size();
}

size_t holder::leases_taken_after(std::chrono::steady_clock::time_point since) const {
  std::lock_guard lock{mutex_};
  size_t n = 0;
  for (const auto& [id, l] : leases_)
    if (l.until - ttl_ > since)
      ++n;
  return n;
}

// -- holder_set ---------------------------------------------------------------

holder_set::holder_set(std::shared_ptr<worker> w, std::chrono::milliseconds lease_ttl,
                       std::chrono::milliseconds drain)
    : worker_(std::move(w)), ttl_(lease_ttl), drain_(drain) {}

status holder_set::expose(const std::string& key, const std::string& source, host_weights weights) {
  std::shared_ptr<holder> h;
  {
    std::lock_guard lock{mutex_};
    auto& slot = holders_[key];
    if (!slot)
      slot = std::make_shared<holder>(worker_, source, ttl_);
    h = slot;
  }
  return h->expose(std::move(weights));
}

bool holder_set::withdraw(const std::string& key) {
  std::shared_ptr<holder> h;
  {
    std::lock_guard lock{mutex_};
    auto it = holders_.find(key);
    if (it == holders_.end())
      return true;
    h = it->second;
  }
  h->withdraw();
  auto now = std::chrono::steady_clock::now();
  auto until = now + drain_;
  while (h->leases_taken_after(now - drain_) > 0) {
    if (std::chrono::steady_clock::now() >= until)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds{5});
  }
  return true;
}

result<offer> holder_set::lease(const version_ref& version) {
  std::vector<std::shared_ptr<holder>> all;
  {
    std::lock_guard lock{mutex_};
    for (const auto& [key, h] : holders_)
      all.push_back(h);
  }
  for (const auto& h : all)
    if (h->exposed() == version)
      if (auto o = h->lease(version))
        return o;
  return make_error(errc::not_found, "this publisher does not lend " + to_string(version));
}

void holder_set::release(uint64_t lease) {
  std::vector<std::shared_ptr<holder>> all;
  {
    std::lock_guard lock{mutex_};
    for (const auto& [key, h] : holders_)
      all.push_back(h);
  }
  for (const auto& h : all)
    h->release(lease);
}

// -- fetch --------------------------------------------------------------------

namespace {

/// True when `o` may be trusted for `target`: the same size, and chunk
/// digests that combine to the manifest's checksum.
bool offers_the_manifests_bytes(const offered_tensor& o, const fetch_target& target) {
  return o.size == target.destination.size() && o.leaves.size() == checksum::chunk_count(o.size)
         && checksum::combine(o.leaves) == target.expected_checksum;
}

/// Waits until partial source `src` has verified `tensor`'s bytes up to
/// `needed` (its progress word, read over UCX). `known` caches the last
/// value read. `abandoned` when the source gave the tensor up.
status wait_for_relay(worker& w, const offer& src, const offered_tensor& tensor, uint64_t needed,
                      uint64_t& known, const fetch_options& opts,
                      std::chrono::steady_clock::time_point deadline, bool& abandoned) {
  if (known >= needed && known != abandoned_progress)
    return {};
  uint32_t slots = 0;
  for (const auto& t : src.tensors)
    slots = std::max(slots, t.progress_slot + 1);
  region_descriptor words{src.worker_address, src.progress_address, uint64_t{8} * slots,
                          src.progress_rkey};
  auto last_move = std::chrono::steady_clock::now();
  for (;;) {
    uint64_t value = 0;
    auto ro = opts.read;
    auto now = std::chrono::steady_clock::now();
    ro.deadline = std::max(
      std::chrono::milliseconds{1},
      std::min(ro.deadline, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now)));
    if (auto ok = w.read(words, uint64_t{8} * tensor.progress_slot,
                         std::as_writable_bytes(std::span{&value, 1}), ro);
        !ok)
      return ok;
    if (value == abandoned_progress) {
      abandoned = true;
      return make_error(errc::not_found, src.source + " gave up fetching tensor '" + tensor.name
                                           + "' from its peers");
    }
    now = std::chrono::steady_clock::now();
    if (value != known) {
      known = value;
      last_move = now;
    }
    if (known >= needed)
      return {};
    if (now - last_move >= opts.stall)
      return make_error(errc::backend_failure,
                        src.source + " has verified only " + std::to_string(known) + " of "
                          + std::to_string(tensor.size) + " bytes of tensor '" + tensor.name
                          + "' and made no progress for " + std::to_string(opts.stall.count())
                          + " ms");
    if (now >= deadline)
      return make_error(errc::backend_failure, "deadline passed waiting for " + src.source);
    std::this_thread::sleep_for(opts.poll);
  }
}

} // namespace

fetch_report fetch(worker& w, const version_ref& ref, std::span<const offer> all_sources,
                   std::span<const fetch_target> targets, const fetch_options& opts,
                   const std::function<void(const transfer_progress&)>& progress,
                   std::span<const bool> backup, holder* relay) {
  auto sources = all_sources.subspan(0, std::min(all_sources.size(), stripe_schedule::max_sources));
  auto deadline = std::chrono::steady_clock::now() + opts.deadline;
  uint64_t stripe_size =
    std::max<uint64_t>(1, opts.stripe / checksum::chunk_size) * checksum::chunk_size;
  fetch_report report;
  report.fetched.assign(targets.size(), false);
  std::vector<std::string> names;
  std::vector<uint64_t> sizes;
  for (const auto& t : targets) {
    names.push_back(t.name);
    sizes.push_back(t.destination.size());
  }
  stripe_schedule sched{names, sizes, stripe_size, sources.size()};
  // index[t][s]: target t's tensor in source s's offer, when s may serve it.
  std::vector<std::vector<std::optional<size_t>>> index(
    targets.size(), std::vector<std::optional<size_t>>(sources.size()));
  std::vector<std::map<std::string_view, size_t>> by_name(sources.size());
  for (size_t s = 0; s < sources.size(); ++s) {
    if (s < backup.size() && backup[s])
      sched.set_backup(s);
    if (sources[s].version != ref) {
      report.problems.push_back(sources[s].source + " offers " + to_string(sources[s].version)
                                + ", not " + to_string(ref));
      continue;
    }
    for (size_t i = 0; i < sources[s].tensors.size(); ++i)
      by_name[s].emplace(sources[s].tensors[i].name, i);
  }
  // What this receiver offers while it fetches: each target's digests as a
  // trusted source gave them.
  std::vector<std::vector<uint64_t>> leaves(targets.size());
  for (size_t t = 0; t < targets.size(); ++t) {
    const auto& target = targets[t];
    if (target.destination.empty()) {
      report.fetched[t] = checksum::tree_checksum({}) == target.expected_checksum;
      continue;
    }
    for (size_t s = 0; s < sources.size(); ++s) {
      auto it = by_name[s].find(target.name);
      if (it == by_name[s].end())
        continue;
      const auto& o = sources[s].tensors[it->second];
      if (!offers_the_manifests_bytes(o, target)) {
        report.problems.push_back(sources[s].source + " offers tensor '" + target.name
                                  + "' with other bytes than the manifest's");
        continue;
      }
      index[t][s] = it->second;
      sched.usable(t, s);
      if (leaves[t].empty())
        leaves[t] = o.leaves;
    }
  }
  sched.start();
  std::shared_ptr<holder::relay> relayed;
  if (relay && sched.bytes_total() > 0) {
    if (auto r = relay->stage(ref, targets, leaves))
      relayed = std::move(*r);
    else
      report.problems.push_back("cannot offer " + to_string(ref)
                                + " to peers while fetching it: " + r.error().message);
  }
  std::vector<verified_prefix> verified(targets.size());

  std::mutex mutex;
  std::condition_variable changed;
  auto serve = [&](size_t s) {
    const auto& src = sources[s];
    std::vector<uint64_t> known(targets.size(), 0);
    std::unique_lock lock{mutex};
    for (;;) {
      if (std::chrono::steady_clock::now() >= deadline)
        break;
      auto taken = sched.take(s);
      if (!taken) {
        if (sched.finished_for(s))
          break;
        changed.wait_until(lock, deadline);
        continue;
      }
      stripe p = *taken;
      lock.unlock();
      const auto& target = targets[p.target];
      const auto& tensor = src.tensors[*index[p.target][s]];
      bool abandoned = false;
      status got;
      if (src.partial)
        got = wait_for_relay(w, src, tensor, p.offset + p.size, known[p.target], opts, deadline,
                             abandoned);
      auto out = target.destination.subspan(p.offset, p.size);
      if (got) {
        region_descriptor from{src.worker_address, tensor.address, tensor.size, tensor.rkey};
        auto ro = opts.read;
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
        ro.deadline = std::max(std::chrono::milliseconds{1}, std::min(ro.deadline, left));
        got = w.read(from, p.offset, out, ro);
      }
      // Verify each chunk as it landed; a bad one goes back for another source.
      std::vector<stripe> bad;
      std::vector<std::pair<uint64_t, uint64_t>> good;
      if (got)
        for (uint64_t at = 0; at < p.size; at += checksum::chunk_size) {
          uint64_t n = std::min<uint64_t>(checksum::chunk_size, p.size - at);
          uint64_t leaf = (p.offset + at) / checksum::chunk_size;
          if (checksum::chunk_digest(out.subspan(at, n)) == tensor.leaves[leaf])
            good.emplace_back(p.offset + at, n);
          else
            bad.push_back({p.target, p.offset + at, n, 0});
        }
      lock.lock();
      if (!got && abandoned) {
        report.problems.push_back(got.error().message + "; reading it elsewhere");
        sched.refused(s, p);
        changed.notify_all();
        continue;
      }
      if (!got) {
        report.problems.push_back(src.source + ": " + got.error().message + " (tensor '"
                                  + target.name + "'); finishing from the others");
        sched.failed(s, p);
        changed.notify_all();
        break;
      }
      for (const auto& b : bad)
        report.problems.push_back("chunk " + std::to_string(b.offset / checksum::chunk_size)
                                  + " of tensor '" + target.name + "' from " + src.source
                                  + " failed its digest; fetching it elsewhere");
      report.bytes_by_source[src.source] += sched.landed(s, p, bad);
      if (sched.done(p.target) == target.destination.size())
        report.fetched[p.target] = true;
      if (relayed) {
        uint64_t prefix = 0;
        for (const auto& [at, n] : good)
          prefix = verified[p.target].add(at, n);
        if (!good.empty())
          relayed->verified(p.target, prefix);
      }
      if (progress)
        progress({sched.done_total(), sched.bytes_total()});
      changed.notify_all();
    }
    changed.notify_all();
  };

  std::vector<std::thread> threads;
  for (size_t s = 0; s < sources.size(); ++s) {
    bool serves = false;
    for (size_t t = 0; t < targets.size() && !serves; ++t)
      serves = sched.is_usable(t, s);
    // Two readers per source: one verifies the stripe it read while the
    // other's reads are in flight, so the link never idles for hashing.
    for (size_t i = 0; serves && i < std::max<size_t>(opts.readers_per_source, 1); ++i)
      threads.emplace_back(serve, s);
  }
  for (auto& t : threads)
    t.join();
  if (relayed)
    for (size_t t = 0; t < targets.size(); ++t)
      if (!report.fetched[t])
        relayed->abandon(t);
  if (auto left = sched.left(); left > 0)
    report.problems.push_back(
      std::to_string(left) + " bytes of " + to_string(ref) + " could not be fetched from "
      + std::to_string(sources.size()) + " holder(s)"
      + (std::chrono::steady_clock::now() >= deadline ? " before the deadline" : ""));
  return report;
}

} // namespace stitch::transport::ucx
