#include "transport/ucx_peer.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <thread>

#include "runtime/core/checksum.hpp"

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
};

holder::holder(std::shared_ptr<worker> w, std::string source, std::chrono::milliseconds lease_ttl)
    : worker_(std::move(w)), source_(std::move(source)), ttl_(lease_ttl) {}

holder::~holder() = default;

status holder::expose(host_weights weights) {
  // A buffer the exposure before offered too (a tensor the last delta did
  // not touch: engines share it between versions, and host weights never
  // change while exposed) keeps its registration and digests.
  std::shared_ptr<const exposure> before;
  {
    std::lock_guard lock{mutex_};
    before = current_;
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
    if (before && !t.bytes.empty())
      if (auto it = before->by_address.find(t.bytes.data());
          it != before->by_address.end()
          && before->proto.tensors[it->second].size == t.bytes.size()) {
        const auto& same = before->proto.tensors[it->second];
        o.address = same.address;
        o.rkey = same.rkey;
        o.leaves = same.leaves;
        r = before->regions[it->second];
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
  current_ = std::move(e);
  registered_ += fresh;
  return {};
}

size_t holder::registered_total() const {
  std::lock_guard lock{mutex_};
  return registered_;
}

void holder::withdraw() {
  std::shared_ptr<exposure> dropped;
  std::lock_guard lock{mutex_};
  dropped.swap(current_);
}

void holder::sweep_locked(std::chrono::steady_clock::time_point now) {
  std::erase_if(leases_, [&](const auto& kv) { return kv.second.until <= now; });
}

result<offer> holder::lease(const version_ref& version) {
  std::lock_guard lock{mutex_};
  auto now = std::chrono::steady_clock::now();
  sweep_locked(now);
  if (!current_ || current_->proto.version != version)
    return make_error(errc::not_found, source_ + " does not hold " + to_string(version));
  uint64_t id = next_lease_++;
  leases_[id] = {current_, now + ttl_};
  offer o = current_->proto;
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

// -- fetch --------------------------------------------------------------------

namespace {

constexpr size_t max_sources = 64;

struct stripe {
  size_t target = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  /// Sources (bits) not to ask for it again.
  uint64_t excluded = 0;
};

/// One fetch's shared state; every member is guarded by `mutex`.
struct fetch_run {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<stripe> queue;
  size_t in_flight = 0;
  std::vector<uint64_t> done_bytes;
  uint64_t done_total = 0;
  uint64_t bytes_total = 0;
  fetch_report report;
};

} // namespace

fetch_report fetch(worker& w, const version_ref& ref, std::span<const offer> all_sources,
                   std::span<const fetch_target> targets, const fetch_options& opts,
                   const std::function<void(const transfer_progress&)>& progress) {
  auto sources = all_sources.subspan(0, std::min(all_sources.size(), max_sources));
  auto deadline = std::chrono::steady_clock::now() + opts.deadline;
  uint64_t stripe_size =
    std::max<uint64_t>(1, opts.stripe / checksum::chunk_size) * checksum::chunk_size;
  fetch_run run;
  run.report.fetched.assign(targets.size(), false);
  run.done_bytes.assign(targets.size(), 0);
  // usable[t][s]: the index of target t's tensor in source s's offer, when
  // that source may be asked for it.
  std::vector<std::vector<std::optional<size_t>>> usable(
    targets.size(), std::vector<std::optional<size_t>>(sources.size()));
  std::vector<std::map<std::string_view, size_t>> by_name(sources.size());
  for (size_t s = 0; s < sources.size(); ++s) {
    if (sources[s].version != ref) {
      run.report.problems.push_back(sources[s].source + " offers " + to_string(sources[s].version)
                                    + ", not " + to_string(ref));
      continue;
    }
    for (size_t i = 0; i < sources[s].tensors.size(); ++i)
      by_name[s].emplace(sources[s].tensors[i].name, i);
  }
  for (size_t t = 0; t < targets.size(); ++t) {
    const auto& target = targets[t];
    if (target.destination.empty()) {
      run.report.fetched[t] = checksum::tree_checksum({}) == target.expected_checksum;
      continue;
    }
    bool any = false;
    for (size_t s = 0; s < sources.size(); ++s) {
      auto it = by_name[s].find(target.name);
      if (it == by_name[s].end())
        continue;
      const auto& o = sources[s].tensors[it->second];
      if (o.size != target.destination.size() || o.leaves.size() != checksum::chunk_count(o.size)
          || checksum::combine(o.leaves) != target.expected_checksum) {
        run.report.problems.push_back(sources[s].source + " offers tensor '" + target.name
                                      + "' with other bytes than the manifest's");
        continue;
      }
      usable[t][s] = it->second;
      any = true;
    }
    if (!any)
      continue;
    run.bytes_total += target.destination.size();
    for (uint64_t at = 0; at < target.destination.size(); at += stripe_size)
      run.queue.push_back({t, at, std::min<uint64_t>(stripe_size, target.destination.size() - at)});
  }

  // Sources whose read failed: none of their threads takes another stripe.
  std::vector<bool> dead(sources.size(), false);
  auto serve = [&](size_t s) {
    const auto& src = sources[s];
    uint64_t bit = uint64_t{1} << s;
    std::unique_lock lock{run.mutex};
    for (;;) {
      if (dead[s] || std::chrono::steady_clock::now() >= deadline)
        break;
      auto it = std::find_if(run.queue.begin(), run.queue.end(), [&](const stripe& p) {
        return (p.excluded & bit) == 0 && usable[p.target][s].has_value();
      });
      if (it == run.queue.end()) {
        if (run.in_flight == 0)
          break;
        run.changed.wait_until(lock, deadline);
        continue;
      }
      stripe p = *it;
      run.queue.erase(it);
      ++run.in_flight;
      lock.unlock();
      const auto& target = targets[p.target];
      const auto& tensor = src.tensors[*usable[p.target][s]];
      region_descriptor from{src.worker_address, tensor.address, tensor.size, tensor.rkey};
      auto ro = opts.read;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
      ro.deadline = std::max(std::chrono::milliseconds{1}, std::min(ro.deadline, left));
      auto out = target.destination.subspan(p.offset, p.size);
      auto got = w.read(from, p.offset, out, ro);
      // Verify each chunk as it landed; a bad one goes back for another source.
      std::vector<stripe> bad;
      uint64_t good = 0;
      if (got) {
        for (uint64_t at = 0; at < p.size; at += checksum::chunk_size) {
          uint64_t n = std::min<uint64_t>(checksum::chunk_size, p.size - at);
          uint64_t leaf = (p.offset + at) / checksum::chunk_size;
          if (checksum::chunk_digest(out.subspan(at, n)) == tensor.leaves[leaf])
            good += n;
          else
            bad.push_back({p.target, p.offset + at, n, p.excluded | bit});
        }
      }
      lock.lock();
      --run.in_flight;
      if (!got) {
        dead[s] = true;
        run.report.problems.push_back(src.source + ": " + got.error().message + " (tensor '"
                                      + target.name + "'); finishing from the others");
        p.excluded |= bit;
        run.queue.push_front(p);
        run.changed.notify_all();
        break;
      }
      for (auto& b : bad) {
        run.report.problems.push_back("chunk " + std::to_string(b.offset / checksum::chunk_size)
                                      + " of tensor '" + target.name + "' from " + src.source
                                      + " failed its digest; fetching it elsewhere");
        run.queue.push_front(b);
      }
      run.report.bytes_by_source[src.source] += good;
      run.done_bytes[p.target] += good;
      run.done_total += good;
      if (run.done_bytes[p.target] == target.destination.size())
        run.report.fetched[p.target] = true;
      if (progress)
        progress({run.done_total, run.bytes_total});
      run.changed.notify_all();
    }
    run.changed.notify_all();
  };

  std::vector<std::thread> threads;
  for (size_t s = 0; s < sources.size(); ++s) {
    bool serves = false;
    for (size_t t = 0; t < targets.size() && !serves; ++t)
      serves = usable[t][s].has_value();
    // Two readers per source: one verifies the stripe it read while the
    // other's reads are in flight, so the link never idles for hashing.
    for (size_t i = 0; serves && i < std::max<size_t>(opts.readers_per_source, 1); ++i)
      threads.emplace_back(serve, s);
  }
  for (auto& t : threads)
    t.join();
  if (!run.queue.empty()) {
    uint64_t left = 0;
    for (const auto& p : run.queue)
      left += p.size;
    run.report.problems.push_back(
      std::to_string(left) + " bytes of " + to_string(ref) + " could not be fetched from "
      + std::to_string(sources.size()) + " holder(s)"
      + (std::chrono::steady_clock::now() >= deadline ? " before the deadline" : ""));
  }
  return std::move(run.report);
}

} // namespace stitch::transport::ucx
