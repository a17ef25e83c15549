// Fan-out at cluster scale, simulated: the publisher holds a new version of
// S bytes and N replicas ask for it at once. Every replica's sources come
// from the coordinator's real `holder_directory`, and every replica's reads
// follow the real `stripe_schedule` and `verified_prefix` that the UCX fetch
// runs (two readers per source, 16 MiB stripes, relays read only as far as
// they have verified, polled). Only the network is modelled: every node has
// B up and B down, and each transfer gets min(B / the sender's transfers,
// B / the receiver's transfers). Reports publish-to-converged time against
// the S/B lower bound (target: at most 1.5x at every size).
//
// Then deltas: the version is a delta whose stored frames are `--deltas`
// (0.01, 0.05) of the model. The receivers, all at the version before, ask
// the real `choose_peer_fetch` what to fetch (it must answer frames) and
// fetch the frames as targets of the same schedule, with the stripe and poll
// a frames fetch uses (`peer_source_options::frames_fetch`: 1 MiB, 50 us).
// Reports converged / (delta bytes / B) at every size (target <= 1.5,
// report-only: the exit status is the full version's verdict).
//
//   fanout_bench [--sizes 16,64,...] [--gbps 400] [--tb 1] [--deltas 0.01,0.05]
//                [--frame-stripe-kb 1024] [--json]

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <vector>

#include "runtime/core/fanout.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/core/stage_plan.hpp"

namespace {

using namespace stitch;

struct settings {
  std::vector<size_t> sizes{16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
  double gbps = 400;
  double tb = 1;
  size_t tensors = 1024;
  uint64_t stripe = uint64_t{16} << 20;
  size_t readers_per_source = 2;
  /// A reader waiting on a relay reads its progress this often.
  double poll_s = 200e-6;
  /// Round trip of a progress read and of starting a stripe's read.
  double rtt_s = 10e-6;
  /// Stored delta bytes as fractions of the model (the delta rows).
  std::vector<double> deltas{0.01, 0.05};
  /// A frames fetch's stripe and poll (`peer_source_options::frames_fetch`).
  uint64_t frame_stripe = uint64_t{1} << 20;
  double frame_poll_s = 50e-6;
  bool json = false;
};

/// What every receiver fetches: target sizes, the stripe and the poll.
struct fetch_shape {
  std::vector<uint64_t> sizes;
  uint64_t stripe = 0;
  double poll_s = 0;
};

struct reader {
  size_t node = 0;
  size_t source = 0; // index into the node's sources
  stripe p;
  bool busy = false;
};

struct flow {
  size_t reader = 0;
  size_t from = 0;
  size_t to = 0;
  double remaining = 0;
  double rate = 0;
  double since = 0;
  uint64_t stamp = 0;
  bool live = false;
};

struct waiter {
  size_t reader;
  size_t target;
  uint64_t needed;
};

struct node {
  std::string name;
  std::vector<size_t> sources; // node indices
  std::unique_ptr<stripe_schedule> sched;
  std::vector<verified_prefix> verified;
  bool complete = false;
  double done_at = 0;
  size_t up = 0;
  size_t down = 0;
  std::vector<size_t> flows; // incident live flows
  std::vector<waiter> waiting_on_me;
  std::vector<size_t> idle_readers;
};

struct event {
  double at;
  uint64_t seq;
  enum kind { flow_done, start_read } what;
  size_t id;
  uint64_t stamp;
  bool operator>(const event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
};

std::string tensor_name(size_t t) {
  char name[48];
  std::snprintf(name, sizeof name, "layer.%05zu.weight", t);
  return name;
}

/// A full version: every tensor whole, the transport's stripe and poll.
fetch_shape full_shape(const settings& s) {
  return {std::vector<uint64_t>(s.tensors, static_cast<uint64_t>(s.tb * 1e12) / s.tensors),
          s.stripe, s.poll_s};
}

/// A delta whose frames are `fraction` of the model: what a receiver at the
/// version before fetches, as `choose_peer_fetch` decides it.
fetch_shape delta_shape(const settings& s, double fraction) {
  const auto tensor_bytes = static_cast<uint64_t>(s.tb * 1e12) / s.tensors;
  const auto frame_bytes = std::max<uint64_t>(8, static_cast<uint64_t>(tensor_bytes * fraction));
  manifest m;
  m.ref = {"run", 2};
  m.kind = version_kind::delta;
  m.base_version = 1;
  chain_plan plan;
  plan.target = m.ref;
  plan.deltas = {m.ref};
  plan.activation_needed = true;
  for (size_t t = 0; t < s.tensors; ++t) {
    auto name = tensor_name(t);
    m.touched.push_back(name);
    m.frames[name] = {frame_bytes, t};
    m.total_size += frame_bytes;
    plan.touched.insert(name);
  }
  std::vector<manifest> chain{m};
  auto choice = choose_peer_fetch(
    plan, chain, [&](std::string_view) { return std::optional<uint64_t>{tensor_bytes}; });
  if (choice.how != peer_fetch::frames) {
    std::fprintf(stderr, "fanout_bench: a receiver would fetch the delta whole: %s\n",
                 choice.why.c_str());
    std::exit(1);
  }
  fetch_shape shape{{}, s.frame_stripe, s.frame_poll_s};
  for (const auto& [name, f] : m.frames)
    shape.sizes.push_back(f.size);
  return shape;
}

class simulation {
public:
  simulation(const settings& s, size_t replicas, fetch_shape shape)
      : s_(s), bw_(s.gbps * 1e9 / 8), sizes_(std::move(shape.sizes)) {
    s_.stripe = shape.stripe;
    s_.poll_s = shape.poll_s;
    for (size_t t = 0; t < sizes_.size(); ++t)
      names_.push_back(tensor_name(t));
    nodes_.resize(replicas + 1);
    nodes_[0].name = "publisher";
    nodes_[0].complete = true;
    dir_.holds("publisher", "n0", "pool", version_);
    for (size_t i = 1; i <= replicas; ++i)
      nodes_[i].name = "replica-" + std::to_string(i);
    depth_.assign(nodes_.size(), 0);
  }

  /// Runs until every replica holds the version; answers the time.
  double run() {
    for (size_t i = 1; i < nodes_.size(); ++i)
      begin(i);
    rerate();
    while (!events_.empty()) {
      auto e = events_.top();
      events_.pop();
      now_ = e.at;
      if (e.what == event::flow_done) {
        auto& f = flows_[e.id];
        if (!f.live || f.stamp != e.stamp)
          continue;
        finish_flow(e.id);
      } else {
        start_flow(e.id);
      }
      rerate();
    }
    double last = 0;
    for (size_t i = 1; i < nodes_.size(); ++i) {
      if (!nodes_[i].complete) {
        std::fprintf(stderr, "fanout_bench: %s never completed\n", nodes_[i].name.c_str());
        std::exit(1);
      }
      last = std::max(last, nodes_[i].done_at);
    }
    return last;
  }

  double bound() const {
    double total = 0;
    for (auto b : sizes_)
      total += static_cast<double>(b);
    return total / bw_;
  }
  uint64_t events() const { return seq_; }
  size_t max_chain() const { return max_depth_; }

private:
  void push(double at, event::kind k, size_t id, uint64_t stamp = 0) {
    events_.push({at, seq_++, k, id, stamp});
  }

  size_t index_of(const std::string& name) const {
    if (name == "publisher")
      return 0;
    return static_cast<size_t>(std::stoul(name.substr(std::strlen("replica-"))));
  }

  void begin(size_t i) {
    auto& n = nodes_[i];
    auto picks = dir_.begin_fetch(n.name, "n" + std::to_string(i), "pool", version_);
    n.sched = std::make_unique<stripe_schedule>(names_, sizes_, s_.stripe, picks.size());
    n.verified.resize(sizes_.size());
    size_t depth = 0;
    for (size_t k = 0; k < picks.size(); ++k) {
      n.sources.push_back(index_of(picks[k].holder));
      for (size_t t = 0; t < sizes_.size(); ++t)
        n.sched->usable(t, k);
      if (picks[k].backup)
        n.sched->set_backup(k);
    }
    if (!picks.empty() && picks[0].partial)
      depth = depth_[n.sources[0]] + 1;
    depth_[i] = depth;
    max_depth_ = std::max(max_depth_, depth);
    n.sched->start();
    for (size_t k = 0; k < picks.size(); ++k)
      for (size_t r = 0; r < s_.readers_per_source; ++r) {
        readers_.push_back({i, k, {}, false});
        next(readers_.size() - 1);
      }
  }

  /// A reader takes its next stripe (the fetch's serve loop).
  void next(size_t rd) {
    auto& r = readers_[rd];
    auto& n = nodes_[r.node];
    auto p = n.sched->take(r.source);
    if (!p) {
      if (!n.sched->finished_for(r.source))
        n.idle_readers.push_back(rd);
      return;
    }
    r.p = *p;
    r.busy = true;
    auto& src = nodes_[n.sources[r.source]];
    uint64_t needed = p->offset + p->size;
    if (!src.complete && src.verified[p->target].prefix < needed) {
      src.waiting_on_me.push_back({rd, p->target, needed});
      return;
    }
    start_flow(rd);
  }

  void start_flow(size_t rd) {
    auto& r = readers_[rd];
    auto& n = nodes_[r.node];
    size_t from = n.sources[r.source];
    size_t id;
    if (!free_flows_.empty()) {
      id = free_flows_.back();
      free_flows_.pop_back();
    } else {
      id = flows_.size();
      flows_.emplace_back();
    }
    auto& f = flows_[id];
    // A read's round trip costs its link what it could carry meanwhile.
    double latency_bytes = s_.rtt_s * bw_ / static_cast<double>(s_.readers_per_source);
    f = {rd, from, r.node,      static_cast<double>(r.p.size) + latency_bytes,
         0,  now_, f.stamp + 1, true};
    ++nodes_[from].up;
    ++n.down;
    nodes_[from].flows.push_back(id);
    n.flows.push_back(id);
    dirty_.push_back(from);
    dirty_.push_back(r.node);
  }

  void finish_flow(size_t id) {
    auto& f = flows_[id];
    f.live = false;
    free_flows_.push_back(id);
    auto& from = nodes_[f.from];
    auto& to = nodes_[f.to];
    --from.up;
    --to.down;
    std::erase(from.flows, id);
    std::erase(to.flows, id);
    dirty_.push_back(f.from);
    dirty_.push_back(f.to);
    auto& r = readers_[f.reader];
    r.busy = false;
    auto& n = nodes_[f.to];
    n.sched->landed(r.source, r.p, {});
    uint64_t prefix = n.verified[r.p.target].add(r.p.offset, r.p.size);
    // Readers of this relay poll its progress: they see it at their next poll.
    auto& w = n.waiting_on_me;
    for (size_t i = 0; i < w.size();) {
      if (w[i].target == r.p.target && w[i].needed <= prefix) {
        push(now_ + s_.poll_s / 2, event::start_read, w[i].reader);
        w[i] = w.back();
        w.pop_back();
      } else {
        ++i;
      }
    }
    if (!n.complete && n.sched->done_total() == n.sched->bytes_total()) {
      n.complete = true;
      n.done_at = now_;
      dir_.end_fetch(n.name, true);
      dir_.holds(n.name, "n" + std::to_string(f.to), "pool", version_);
      for (auto& x : w)
        push(now_ + s_.poll_s / 2, event::start_read, x.reader);
      w.clear();
    }
    size_t rd = f.reader;
    next(rd);
    if (n.sched->in_flight() == 0) {
      auto idle = std::move(n.idle_readers);
      n.idle_readers.clear();
      for (auto x : idle)
        next(x);
    }
  }

  void rerate() {
    for (size_t d : dirty_)
      for (size_t id : nodes_[d].flows) {
        auto& f = flows_[id];
        double rate = std::min(bw_ / static_cast<double>(nodes_[f.from].up),
                               bw_ / static_cast<double>(nodes_[f.to].down));
        if (rate == f.rate)
          continue;
        f.remaining -= f.rate * (now_ - f.since);
        f.since = now_;
        f.rate = rate;
        ++f.stamp;
        push(now_ + std::max(f.remaining, 0.0) / rate, event::flow_done, id, f.stamp);
      }
    dirty_.clear();
  }

  settings s_;
  double bw_;
  std::vector<std::string> names_;
  std::vector<uint64_t> sizes_;
  version_ref version_{"run", 1};
  holder_directory dir_;
  std::vector<node> nodes_;
  std::vector<reader> readers_;
  std::vector<flow> flows_;
  std::vector<size_t> free_flows_;
  std::vector<size_t> dirty_;
  std::vector<size_t> depth_;
  size_t max_depth_ = 0;
  std::priority_queue<event, std::vector<event>, std::greater<>> events_;
  double now_ = 0;
  uint64_t seq_ = 0;
};

std::vector<size_t> parse_sizes(const char* text) {
  std::vector<size_t> out;
  for (const char* p = text; *p;) {
    char* end = nullptr;
    unsigned long v = std::strtoul(p, &end, 10);
    if (end == p || v == 0 || v > 1'000'000) {
      std::fprintf(stderr, "fanout_bench: --sizes wants numbers like 16,64,256\n");
      std::exit(2);
    }
    out.push_back(v);
    p = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0') {
      std::fprintf(stderr, "fanout_bench: --sizes wants numbers like 16,64,256\n");
      std::exit(2);
    }
  }
  return out;
}

std::vector<double> parse_fractions(const char* text) {
  std::vector<double> out;
  for (const char* p = text; *p;) {
    char* end = nullptr;
    double v = std::strtod(p, &end);
    if (end == p || !(v > 0 && v < 1) || (*end != ',' && *end != '\0')) {
      std::fprintf(stderr, "fanout_bench: --deltas wants fractions like 0.01,0.05\n");
      std::exit(2);
    }
    out.push_back(v);
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

} // namespace

int main(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fanout_bench: %s wants a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--sizes")
      s.sizes = parse_sizes(value());
    else if (a == "--gbps")
      s.gbps = std::atof(value());
    else if (a == "--tb")
      s.tb = std::atof(value());
    else if (a == "--deltas")
      s.deltas = parse_fractions(value());
    else if (a == "--frame-stripe-kb")
      s.frame_stripe = std::strtoull(value(), nullptr, 10) << 10;
    else if (a == "--json")
      s.json = true;
    else {
      std::fprintf(stderr, "usage: fanout_bench [--sizes 16,64,...] [--gbps 400] [--tb 1] "
                           "[--deltas 0.01,0.05] [--frame-stripe-kb 1024] [--json]\n");
      return 2;
    }
  }
  if (s.frame_stripe == 0 || s.frame_stripe % (uint64_t{1} << 20) != 0) {
    std::fprintf(stderr, "fanout_bench: --frame-stripe-kb must be a multiple of 1024 (the "
                         "transport's stripes are whole 1 MiB chunks)\n");
    return 2;
  }
  if (!(s.gbps > 0) || !(s.tb > 0)) {
    std::fprintf(stderr, "fanout_bench: --gbps and --tb must be positive\n");
    return 2;
  }
  double worst = 0;
  std::string rows;
  // One table: every size, `shape` fetched; answers the worst ratio.
  auto table = [&](const std::string& what, const std::function<fetch_shape()>& shape,
                   std::string& json_rows) {
    double table_worst = 0;
    if (!s.json)
      std::printf("%s\n%8s %12s %12s %8s %12s %10s\n", what.c_str(), "replicas", "converged_s",
                  "bound_s", "ratio", "per_hop_ms", "chain");
    for (size_t n : s.sizes) {
      simulation sim{s, n, shape()};
      double t = sim.run();
      double bound = sim.bound();
      double ratio = t / bound;
      table_worst = std::max(table_worst, ratio);
      double per_hop_ms = (t - bound) / static_cast<double>(n) * 1e3;
      if (s.json) {
        char row[256];
        std::snprintf(row, sizeof row,
                      "%s{\"replicas\":%zu,\"converged_s\":%.4f,\"bound_s\":%.4f,\"ratio\":%.4f,"
                      "\"per_hop_ms\":%.4f,\"chain\":%zu,\"store_only_ratio\":%zu}",
                      json_rows.empty() ? "" : ",", n, t, bound, ratio, per_hop_ms, sim.max_chain(),
                      n);
        json_rows += row;
      } else {
        std::printf("%8zu %12.4f %12.4f %8.3f %12.4f %10zu\n", n, t, bound, ratio, per_hop_ms,
                    sim.max_chain());
        std::fflush(stdout);
      }
    }
    if (!s.json)
      std::printf("worst ratio %.3f (target <= 1.5)\n", table_worst);
    return table_worst;
  };
  worst = table(
    "full version, " + std::to_string(s.tb) + " TB", [&] { return full_shape(s); }, rows);
  std::string delta_json;
  double delta_worst = 0;
  for (double fraction : s.deltas) {
    std::string delta_rows;
    char what[96];
    std::snprintf(what, sizeof what, "delta, frames %.1f%% of the model", fraction * 100);
    double w = table(
      what, [&] { return delta_shape(s, fraction); }, delta_rows);
    delta_worst = std::max(delta_worst, w);
    char head[96];
    std::snprintf(head, sizeof head, "%s{\"fraction\":%.4f,\"worst_ratio\":%.4f,\"sizes\":[",
                  delta_json.empty() ? "" : ",", fraction, w);
    delta_json += head + delta_rows + "]}";
  }
  if (s.json)
    std::printf("{\"bench\":\"fanout\",\"gbps\":%.0f,\"bytes\":%.0f,\"stripe\":%llu,"
                "\"sizes\":[%s],\"worst_ratio\":%.4f,\"target\":1.5,\"frame_stripe\":%llu,"
                "\"deltas\":[%s],\"delta_worst_ratio\":%.4f}\n",
                s.gbps, s.tb * 1e12, static_cast<unsigned long long>(s.stripe), rows.c_str(), worst,
                static_cast<unsigned long long>(s.frame_stripe), delta_json.c_str(), delta_worst);
  // The delta rows are report-only for now: frames fan out over the same
  // relay chain as full versions, whose N - 1 hops cost more than a small
  // delta's bytes at large N (issue 49 stays open for a tree of relays).
  if (!s.json)
    std::printf("delta worst ratio %.3f (target <= 1.5; report-only: a chain of relays)\n",
                delta_worst);
  return worst <= 1.5 ? 0 : 1;
}
