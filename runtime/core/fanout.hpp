#pragma once

// Fan-out of a version's bytes to many replicas (DESIGN §6): who a receiver
// fetches from, and in which order it asks its holders for stripes. Pure:
// the coordinator keeps a `holder_directory`, the UCX fetch runs a
// `stripe_schedule`, and `bench/fanout_bench` drives both for thousands of
// simulated replicas.
//
// The shape is a relay chain pipelined by stripe. Every holder serves
// `readers_per_holder` receivers at a time (one by default: a holder's
// uplink then feeds one receiver at full rate), and a receiver that has just
// begun fetching is itself a holder of what it has verified so far. So when
// N replicas ask at once, the first reads from the publisher, the second
// from the first while the first is still fetching, and so on: every link
// runs at full rate and the publish-to-converged time is about
// S/B + N x (one stripe's time + a poll), against N x S/B with everyone on
// the publisher. Complete holders that are idle are preferred, so replicas
// that join later spread over everything that holds the version.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/core/version_ref.hpp"

namespace stitch {

struct fanout_options {
  /// Receivers one holder serves at once before others are preferred.
  size_t readers_per_holder = 1;
  /// Sources handed to a receiver in all: its primary and the backups it
  /// turns to when the primary fails.
  size_t max_sources = 4;
};

/// One source chosen for a receiver.
struct source_pick {
  std::string holder;
  std::string node;
  /// Used only when every primary failed (it serves someone else already).
  bool backup = false;
  /// Still fetching the version itself: serves what it has verified so far.
  bool partial = false;
};

/// Who holds which version of which pool, in full or while still fetching
/// it, and how many receivers each serves now. The coordinator's directory.
class holder_directory {
public:
  explicit holder_directory(fanout_options options = {});

  /// `holder` (a replica, or a publisher) on `node` holds `version` of `pool`
  /// in full, or nothing (nullopt). Replaces what it held before; a holder
  /// that now holds the version it was fetching is a complete holder of it.
  /// A `publisher` comes after replicas among otherwise equal holders: its
  /// node's network is the trainer's.
  void holds(const std::string& holder, const std::string& node, const std::string& pool,
             const std::optional<version_ref>& version, bool publisher = false);
  /// `holder` is gone: it serves nobody, and its own fetch ends.
  void forget(const std::string& holder);

  /// `receiver` starts fetching `version`: chooses its sources (primary
  /// first, then backups; never itself), counts it as a reader of its
  /// primary, and lists it as a partial holder of `version` from now on.
  /// A receiver that got no source at all is not listed (it reads the
  /// store, and offers nothing until it holds the version).
  std::vector<source_pick> begin_fetch(const std::string& receiver, const std::string& node,
                                       const std::string& pool, const version_ref& version);
  /// `receiver`'s fetch ended: its primary serves one reader fewer. When
  /// `all_fetched`, what it offers is complete.
  void end_fetch(const std::string& receiver, bool all_fetched);

  /// Receivers `holder` serves now.
  size_t readers(const std::string& holder) const;
  /// Holders known.
  size_t size() const { return entries_.size(); }

private:
  struct entry {
    std::string node;
    std::string pool;
    std::optional<version_ref> full;
    /// The version it is fetching (or fetched and has not applied yet).
    std::optional<version_ref> staging;
    /// When its fetch began (lower: further along).
    uint64_t staging_seq = 0;
    bool staging_complete = false;
    size_t readers = 0;
    bool publisher = false;
    /// The primary it reads from while fetching.
    std::optional<std::string> reading_from;
  };
  void stop_reading(entry& e);

  fanout_options options_;
  std::map<std::string, entry> entries_;
  uint64_t seq_ = 0;
};

/// The bytes of a fetch target verified so far, from its start: chunks land
/// out of order (several readers, refetched chunks); the prefix moves when
/// the gap before them closes. What a relay offers of a tensor.
struct verified_prefix {
  uint64_t prefix = 0;
  std::map<uint64_t, uint64_t> beyond;

  /// Records `size` verified bytes at `offset`; answers the prefix.
  uint64_t add(uint64_t offset, uint64_t size);
};

/// A byte range of one fetch target that one source is asked for at once.
struct stripe {
  size_t target = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  /// Sources (bits) not to ask for it again.
  uint64_t excluded = 0;
};

/// The order in which a receiver asks its sources for stripes. Stripes go
/// in order of tensor name, then offset, so that a receiver reading from a
/// holder that is itself still fetching asks for bytes in the order that
/// holder gets them. A primary takes the next stripe it can serve; a backup
/// only what no live primary can; a source whose read failed takes nothing
/// more and its stripe goes back to the front for the others. Not
/// thread-safe: the fetch guards it with its mutex.
class stripe_schedule {
public:
  /// At most this many sources (bit masks).
  static constexpr size_t max_sources = 64;

  /// `names[t]` and `sizes[t]`: fetch target t's tensor and bytes; stripes
  /// of `stripe_size` bytes.
  stripe_schedule(std::span<const std::string> names, std::span<const uint64_t> sizes,
                  uint64_t stripe_size, size_t sources);

  /// Source `s` offers target `t`'s bytes. Call before the first `take`.
  void usable(size_t t, size_t s);
  bool is_usable(size_t t, size_t s) const;
  void set_backup(size_t s);
  /// Queues every stripe some source can serve; the others are left to the
  /// store. Call once, after `usable`.
  void start();

  /// The next stripe `s` should read, or nullopt for none now.
  std::optional<stripe> take(size_t s);
  /// True when `s` will never be given another stripe (it is dead, or
  /// nothing it could serve is queued or in flight).
  bool finished_for(size_t s) const;
  /// A stripe `s` read: `bad` are the parts (whole 1 MiB chunks) that failed
  /// their digest, queued again for the other sources. Answers the verified
  /// bytes.
  uint64_t landed(size_t s, const stripe& p, std::span<const stripe> bad);
  /// `s` failed reading `p`: it takes nothing more, `p` goes to the others.
  void failed(size_t s, stripe p);
  /// `s` turns out not to offer `p`'s target after all (a relay whose own
  /// fetch gave it up): the others serve that target, `p` first.
  void refused(size_t s, stripe p);

  bool dead(size_t s) const { return dead_[s]; }
  /// Verified bytes of target `t`.
  uint64_t done(size_t t) const { return done_[t]; }
  uint64_t done_total() const { return done_total_; }
  /// Bytes the sources were asked for in all.
  uint64_t bytes_total() const { return bytes_total_; }
  /// Bytes queued and not yet read when the fetch gave up.
  uint64_t left() const;
  size_t in_flight() const { return in_flight_; }

private:
  bool primary_can_serve(const stripe& p) const;

  std::vector<uint64_t> sizes_;
  std::vector<size_t> order_;
  uint64_t stripe_size_;
  size_t sources_;
  std::vector<std::vector<bool>> usable_;
  std::vector<bool> backup_;
  std::vector<bool> dead_;
  std::deque<stripe> queue_;
  size_t in_flight_ = 0;
  std::vector<uint64_t> done_;
  uint64_t done_total_ = 0;
  uint64_t bytes_total_ = 0;
};

} // namespace stitch
