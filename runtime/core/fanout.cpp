#include "runtime/core/fanout.hpp"

#include <algorithm>
#include <numeric>
#include <tuple>

namespace stitch {

// -- holder_directory ---------------------------------------------------------

holder_directory::holder_directory(fanout_options options) : options_(options) {}

void holder_directory::stop_reading(entry& e) {
  if (!e.reading_from)
    return;
  if (auto it = entries_.find(*e.reading_from); it != entries_.end() && it->second.readers > 0)
    --it->second.readers;
  e.reading_from.reset();
}

void holder_directory::holds(const std::string& holder, const std::string& node,
                             const std::string& pool, const std::optional<version_ref>& version,
                             bool publisher) {
  auto& e = entries_[holder];
  e.node = node;
  e.publisher = publisher;
  if (e.pool != pool) {
    e.staging.reset();
    e.pool = pool;
  }
  e.full = version;
  if (version && e.staging == version) {
    stop_reading(e);
    e.staging.reset();
  }
  if (!e.full && !e.staging && e.readers == 0 && !e.reading_from)
    entries_.erase(holder);
}

void holder_directory::forget(const std::string& holder) {
  auto it = entries_.find(holder);
  if (it == entries_.end())
    return;
  stop_reading(it->second);
  entries_.erase(it);
}

std::vector<source_pick> holder_directory::begin_fetch(const std::string& receiver,
                                                       const std::string& node,
                                                       const std::string& pool,
                                                       const version_ref& version) {
  if (auto it = entries_.find(receiver); it != entries_.end()) {
    stop_reading(it->second);
    it->second.staging.reset();
  }
  struct candidate {
    const std::string* name;
    entry* e;
    bool complete;
  };
  std::vector<candidate> all;
  for (auto& [name, e] : entries_) {
    if (name == receiver || e.pool != pool)
      continue;
    bool full = e.full == version;
    bool staging = e.staging == version;
    if (full || staging)
      all.push_back({&name, &e, full || e.staging_complete});
  }
  // Complete before partial; a partial one that began earlier is further
  // along; replicas before a publisher; the receiver's own node among
  // equals; then by name, stable.
  auto rank = [&](const candidate& c) {
    return std::tuple{
      !c.complete,    c.e->readers,      c.complete ? uint64_t{0} : c.e->staging_seq,
      c.e->publisher, c.e->node != node, *c.name};
  };
  auto by_rank = [&](const candidate& a, const candidate& b) { return rank(a) < rank(b); };
  std::sort(all.begin(), all.end(), by_rank);
  std::vector<source_pick> out;
  if (all.empty() || options_.max_sources == 0)
    return out;
  // The primary: the best holder with a free slot, else the least loaded.
  auto free = std::find_if(all.begin(), all.end(), [&](const candidate& c) {
    return c.e->readers < options_.readers_per_holder;
  });
  auto primary =
    free != all.end() ? free : std::min_element(all.begin(), all.end(), [&](auto& a, auto& b) {
      return std::tuple{a.e->readers, rank(a)} < std::tuple{b.e->readers, rank(b)};
    });
  out.push_back({*primary->name, primary->e->node, false, !primary->complete});
  for (const auto& c : all) {
    if (out.size() >= options_.max_sources)
      break;
    if (c.name != primary->name)
      out.push_back({*c.name, c.e->node, true, !c.complete});
  }
  ++primary->e->readers;
  auto& me = entries_[receiver];
  me.node = node;
  me.pool = pool;
  me.staging = version;
  me.staging_seq = ++seq_;
  me.staging_complete = false;
  me.reading_from = out.front().holder;
  return out;
}

void holder_directory::end_fetch(const std::string& receiver, bool all_fetched) {
  auto it = entries_.find(receiver);
  if (it == entries_.end())
    return;
  stop_reading(it->second);
  if (it->second.staging)
    it->second.staging_complete = all_fetched;
  if (!all_fetched)
    it->second.staging.reset();
  if (!it->second.full && !it->second.staging && it->second.readers == 0)
    entries_.erase(it);
}

size_t holder_directory::readers(const std::string& holder) const {
  auto it = entries_.find(holder);
  return it == entries_.end() ? 0 : it->second.readers;
}

uint64_t verified_prefix::add(uint64_t offset, uint64_t size) {
  if (offset + size <= prefix)
    return prefix;
  beyond.emplace(offset, size);
  for (auto it = beyond.begin(); it != beyond.end() && it->first <= prefix; it = beyond.erase(it))
    prefix = std::max(prefix, it->first + it->second);
  return prefix;
}

// -- stripe_schedule ----------------------------------------------------------

stripe_schedule::stripe_schedule(std::span<const std::string> names,
                                 std::span<const uint64_t> sizes, uint64_t stripe_size,
                                 size_t sources)
    : sizes_(sizes.begin(), sizes.end()), order_(sizes.size()),
      stripe_size_(std::max<uint64_t>(stripe_size, 1)), sources_(std::min(sources, max_sources)),
      usable_(sizes.size(), std::vector<bool>(sources_, false)), backup_(sources_, false),
      dead_(sources_, false), done_(sizes.size(), 0) {
  std::iota(order_.begin(), order_.end(), size_t{0});
  std::stable_sort(order_.begin(), order_.end(),
                   [&](size_t a, size_t b) { return names[a] < names[b]; });
}

void stripe_schedule::usable(size_t t, size_t s) {
  if (t < usable_.size() && s < sources_)
    usable_[t][s] = true;
}

bool stripe_schedule::is_usable(size_t t, size_t s) const {
  return t < usable_.size() && s < sources_ && usable_[t][s];
}

void stripe_schedule::set_backup(size_t s) {
  if (s < sources_)
    backup_[s] = true;
}

void stripe_schedule::start() {
  for (size_t t : order_) {
    if (std::none_of(usable_[t].begin(), usable_[t].end(), [](bool b) { return b; }))
      continue;
    bytes_total_ += sizes_[t];
    for (uint64_t at = 0; at < sizes_[t]; at += stripe_size_)
      queue_.push_back({t, at, std::min(stripe_size_, sizes_[t] - at), 0});
  }
}

bool stripe_schedule::primary_can_serve(const stripe& p) const {
  for (size_t s = 0; s < sources_; ++s)
    if (!backup_[s] && !dead_[s] && usable_[p.target][s] && (p.excluded & (uint64_t{1} << s)) == 0)
      return true;
  return false;
}

std::optional<stripe> stripe_schedule::take(size_t s) {
  if (s >= sources_ || dead_[s])
    return std::nullopt;
  uint64_t bit = uint64_t{1} << s;
  auto it = std::find_if(queue_.begin(), queue_.end(), [&](const stripe& p) {
    return (p.excluded & bit) == 0 && usable_[p.target][s]
           && (!backup_[s] || !primary_can_serve(p));
  });
  if (it == queue_.end())
    return std::nullopt;
  stripe p = *it;
  queue_.erase(it);
  ++in_flight_;
  return p;
}

bool stripe_schedule::finished_for(size_t s) const {
  if (s >= sources_ || dead_[s])
    return true;
  if (in_flight_ > 0)
    return false;
  uint64_t bit = uint64_t{1} << s;
  return std::none_of(queue_.begin(), queue_.end(), [&](const stripe& p) {
    return (p.excluded & bit) == 0 && usable_[p.target][s];
  });
}

uint64_t stripe_schedule::landed(size_t s, const stripe& p, std::span<const stripe> bad) {
  if (in_flight_ > 0)
    --in_flight_;
  uint64_t good = p.size;
  for (auto b : bad) {
    good -= std::min(good, b.size);
    b.excluded |= p.excluded | (uint64_t{1} << s);
    queue_.push_front(b);
  }
  done_[p.target] += good;
  done_total_ += good;
  return good;
}

void stripe_schedule::failed(size_t s, stripe p) {
  if (in_flight_ > 0)
    --in_flight_;
  if (s < sources_) {
    dead_[s] = true;
    p.excluded |= uint64_t{1} << s;
  }
  queue_.push_front(p);
}

void stripe_schedule::refused(size_t s, stripe p) {
  if (in_flight_ > 0)
    --in_flight_;
  if (s < sources_)
    usable_[p.target][s] = false;
  queue_.push_front(p);
}

uint64_t stripe_schedule::left() const {
  uint64_t n = 0;
  for (const auto& p : queue_)
    n += p.size;
  return n;
}

} // namespace stitch
