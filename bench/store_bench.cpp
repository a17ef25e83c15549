// store_bench: the byte paths of the store, as ratios to the raw sequential
// write+fsync and read bandwidth of the same disk, measured in the same run
// (see bench/README.md):
//
//   - in process: a full anchor and a 1%-dense delta published to a RocksDB
//     store, the delta version exported to a directory;
//   - through a real `stitch-node` and the `stitch` CLI (when both binaries
//     sit next to this one): a local publish, a streamed publish, export by
//     the node and streamed to the CLI, with the node's and the CLI's peak
//     resident memory as ratios to the model size; and the store actor's
//     pointer-read latency while a streamed publish runs, against idle.
//
//   store_bench [--mb N] [--dir PATH] [--no-node | --pointer-only] [--json] [--samples PATH]

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "actors/coordinator_actor.hpp"
#include "actors/store_actor.hpp"
#include "node/remote.hpp"
#include "node/system_config.hpp"
#include "runtime/core/delta_codec.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/pipeline/materialize.hpp"
#include "runtime/pipeline/pipeline.hpp"
#include "runtime/pipeline/publisher.hpp"
#include "runtime/store/rocksdb_store.hpp"

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "store_bench: %s\n", what.c_str());
  std::exit(1);
}

/// Sequential write of `bytes` in 8 MiB blocks to a new file, then fsync:
/// bytes/s. With `direct`, through O_DIRECT (bypassing the page cache).
double raw_write(const fs::path& file, uint64_t bytes, bool direct) {
  std::error_code ec;
  fs::remove(file, ec);
  void* raw = nullptr;
  if (::posix_memalign(&raw, 4096, 8 << 20) != 0)
    die("out of memory");
  std::unique_ptr<char, decltype(&std::free)> block{static_cast<char*>(raw), &std::free};
  std::memset(block.get(), 'x', 8 << 20);
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
  if (fd < 0)
    return 0; // no direct I/O on this file system
  auto t0 = clock_type::now();
  for (uint64_t done = 0; done < bytes; done += 8 << 20)
    if (::write(fd, block.get(), 8 << 20) != 8 << 20)
      die("write failed");
  ::fsync(fd);
  double s = seconds_since(t0);
  ::close(fd);
  fs::remove(file, ec);
  return static_cast<double>(bytes) / s;
}

/// Drops the cached pages of every file under `path` (a file or a tree).
void drop_cache(const fs::path& path) {
  auto drop = [](const fs::path& f) {
    int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0)
      return;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  };
  if (fs::is_regular_file(path)) {
    drop(path);
    return;
  }
  for (const auto& e : fs::recursive_directory_iterator(path))
    if (e.is_regular_file())
      drop(e.path());
}

/// Sequential read after dropping the file's cached pages: bytes/s.
double raw_read(const fs::path& file) {
  drop_cache(file);
  int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0)
    die("cannot open " + file.string());
  std::vector<char> block(8 << 20);
  uint64_t total = 0;
  auto t0 = clock_type::now();
  for (ssize_t n; (n = ::read(fd, block.data(), block.size())) > 0;)
    total += static_cast<uint64_t>(n);
  double s = seconds_since(t0);
  ::close(fd);
  return static_cast<double>(total) / s;
}

/// What an export asks of the disk: a cold sequential read of `file` while a
/// file of the same size is written (O_DIRECT, as export writes large
/// files), both in 8 MiB blocks: bytes moved each way per second, until both
/// are done.
double raw_read_while_writing(const fs::path& file, const fs::path& out) {
  const uint64_t bytes = fs::file_size(file);
  double write_s = 0;
  std::thread writer{[&] {
    auto t0 = clock_type::now();
    raw_write(out, bytes, true);
    write_s = seconds_since(t0);
  }};
  auto t0 = clock_type::now();
  raw_read(file);
  const double read_s = seconds_since(t0);
  writer.join();
  return static_cast<double>(bytes) / std::max(read_s, write_s);
}

/// Touches then frees `bytes` of memory. On a virtual machine whose memory
/// the host backs lazily, the first touch of a page costs far more than any
/// later one; warming first charges that once-per-machine cost to no measured
/// step (a long-running node's memory is warm).
void warm_up_memory(uint64_t bytes) {
  auto* p = static_cast<volatile char*>(std::malloc(bytes));
  if (!p)
    return;
  for (uint64_t i = 0; i < bytes; i += 4096)
    p[i] = 1;
  std::free(const_cast<char*>(p));
}

stitch::pipeline::tensor_set make_weights(uint64_t bytes, size_t count) {
  stitch::pipeline::tensor_set w;
  std::mt19937_64 rng{7};
  const uint64_t each = bytes / count / 4 * 4;
  for (size_t i = 0; i < count; ++i) {
    const std::string name = "model.layers." + std::to_string(i) + ".mlp.up_proj.weight";
    auto& t = w[name];
    t.name = name;
    t.type = stitch::safetensors::dtype::f32;
    t.shape = {each / 4};
    t.bytes.resize(each);
    auto* words = reinterpret_cast<uint64_t*>(t.bytes.data());
    for (uint64_t k = 0; k < each / 8; ++k)
      words[k] = rng();
  }
  return w;
}

/// A child process: `argv`, output into `log`.
struct child {
  pid_t pid = -1;
  fs::path log;

  /// Spawned without copying this process (posix_spawn: no fork of its
  /// page tables, no exit of the copy at exec), so starting a load does not
  /// stall the threads measuring it.
  static child start(const std::vector<std::string>& argv, const fs::path& log) {
    child c;
    c.log = log;
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                       0644);
    ::posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::vector<char*> args;
    for (const auto& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    if (int err = ::posix_spawnp(&c.pid, args[0], &actions, nullptr, args.data(), environ);
        err != 0)
      die("cannot start " + argv[0] + ": " + std::strerror(err));
    ::posix_spawn_file_actions_destroy(&actions);
    return c;
  }

  std::string output() const {
    std::ifstream in{log};
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  /// Waits for the exit: the exit code and the peak resident set in bytes.
  std::pair<int, uint64_t> wait() {
    int status = 0;
    rusage usage{};
    ::wait4(pid, &status, 0, &usage);
    pid = -1;
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1,
            static_cast<uint64_t>(usage.ru_maxrss) * 1024};
  }

  void stop() {
    if (pid <= 0)
      return;
    ::kill(pid, SIGTERM);
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
  }
};

/// VmHWM of a process (its peak resident set since it exec'd), in bytes.
uint64_t peak_resident(pid_t pid) {
  std::ifstream in{"/proc/" + std::to_string(pid) + "/status"};
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with("VmHWM:"))
      return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  return 0;
}

/// Runs a CLI command to its end: seconds, and its peak resident bytes (read
/// from /proc while it runs: rusage would also count the pages the child
/// shared with this process before exec); dies on failure.
std::pair<double, uint64_t> run_cli(const std::vector<std::string>& argv, const fs::path& log) {
  auto t0 = clock_type::now();
  auto c = child::start(argv, log);
  uint64_t peak = 0;
  int status = 0;
  const std::string name = fs::path{argv[0]}.filename().string().substr(0, 15);
  while (::waitpid(c.pid, &status, WNOHANG) == 0) {
    // Only once it runs the program: before exec it is a copy of this one.
    std::ifstream comm{"/proc/" + std::to_string(c.pid) + "/comm"};
    std::string now;
    std::getline(comm, now);
    if (now == name)
      peak = std::max(peak, peak_resident(c.pid));
    std::this_thread::sleep_for(std::chrono::milliseconds{5});
  }
  c.pid = -1;
  const double s = seconds_since(t0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    die("`" + argv[3] + " " + argv[4] + " ...` failed:\n" + c.output());
  return {s, peak};
}

/// Clears a process's VmHWM, so it counts from now.
void reset_peak(pid_t pid) {
  std::ofstream out{"/proc/" + std::to_string(pid) + "/clear_refs"};
  out << "5";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::error_code& ec_ignored() {
  static thread_local std::error_code ec;
  return ec;
}

struct latency {
  double p50 = 0;
  double p99 = 0;
};

latency percentiles(std::vector<double> v) {
  if (v.empty())
    return {};
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)]};
}

/// Where each pointer read is written, when asked (`--samples PATH`): one
/// line per read, its phase ("idle" or "loaded"), when it started
/// (CLOCK_MONOTONIC seconds, as `perf record -k CLOCK_MONOTONIC` stamps its
/// events) and how long it took in milliseconds.
std::FILE* samples_file = nullptr;

/// Pointer reads through the store actor, one after the other, for `span`.
std::vector<double> pointer_reads(caf::actor_system& sys, const stitch::store_actor& store,
                                  std::chrono::milliseconds span, const char* phase,
                                  const std::function<bool()>& keep_going = {}) {
  std::vector<double> out;
  caf::scoped_actor self{sys};
  const auto end = clock_type::now() + span;
  while (clock_type::now() < end && (!keep_going || keep_going())) {
    auto t0 = clock_type::now();
    self
      ->request(store, std::chrono::seconds{30}, stitch::atom::read_pointer_v,
                std::string{"default"})
      .receive([](const caf::optional<stitch::pointer_record>&) {},
               [](const caf::error& err) { die("pointer read failed: " + caf::to_string(err)); });
    out.push_back(seconds_since(t0));
    if (samples_file) {
      timespec at{};
      ::clock_gettime(CLOCK_MONOTONIC, &at);
      std::fprintf(samples_file, "%s %.6f %.3f\n", phase,
                   static_cast<double>(at.tv_sec) + static_cast<double>(at.tv_nsec) * 1e-9
                     - out.back(),
                   out.back() * 1e3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds{2});
  }
  return out;
}

struct node_figures {
  bool ran = false;
  double local_publish_bw = 0;
  double stream_publish_bw = 0;
  /// Through the publisher's HTTP surface with the Python client (0: no
  /// python3 here).
  double http_publish_bw = 0;
  double node_publish_peak = 0;
  double export_bw = 0;
  double export_cli_peak = 0;
  double stream_export_bw = 0;
  double stream_export_cli_peak = 0;
  latency idle;
  latency loaded;
  size_t loaded_samples = 0;

  double p50_ratio() const { return idle.p50 > 0 ? loaded.p50 / idle.p50 : 0; }
  double p99_ratio() const { return idle.p99 > 0 ? loaded.p99 / idle.p99 : 0; }
};

node_figures node_rows(const fs::path& dir, const stitch::pipeline::tensor_set& weights,
                       uint64_t bytes, const fs::path& bin_dir, bool pointer_only) {
  node_figures f;
  const fs::path node_bin = bin_dir / "stitch-node";
  const fs::path cli_bin = bin_dir / "stitch";
  if (!fs::exists(node_bin) || !fs::exists(cli_bin))
    return f;
  f.ran = true;
  const fs::path model = dir / "model";
  if (auto ok = stitch::pipeline::write_hf_directory(model, weights); !ok)
    die(to_string(ok.error()));

  auto node =
    child::start({node_bin.string(), "--data-dir", (dir / "node").string(), "--set",
                  "roles=coordinator,store,publisher", "--set", "coordinator.listen=127.0.0.1:0",
                  "--set", "publisher.listen=127.0.0.1:0"},
                 dir / "node.log");
  std::string port, http_port;
  for (int i = 0; i < 600 && (port.empty() || http_port.empty()); ++i) {
    std::smatch m;
    auto log = node.output();
    if (std::regex_search(log, m, std::regex{"listening on 127\\.0\\.0\\.1:([0-9]+)"}))
      port = m[1];
    if (std::regex_search(log, m, std::regex{"publisher http://127\\.0\\.0\\.1:([0-9]+)"}))
      http_port = m[1];
    std::this_thread::sleep_for(std::chrono::milliseconds{50});
  }
  if (port.empty() || http_port.empty())
    die("stitch-node did not start:\n" + node.output());
  // The Python client publishing the same directory over HTTP, when there is
  // a python3: the seconds it reports.
  // The client's sources: this checkout's, or where STITCH_PYTHON_CLIENT
  // says (a copy of the bench run away from its build, bench/gpu_check.sh).
  const char* client_env = std::getenv("STITCH_PYTHON_CLIENT");
  const fs::path client_dir = client_env && *client_env
                                ? fs::path{client_env}
                                : fs::path{STITCH_SOURCE_DIR} / "clients/python";
  const bool have_python = fs::exists(client_dir / "stitch_client")
                           && std::system("python3 -c 'import json' >/dev/null 2>&1") == 0;
  auto http_publish = [&](uint64_t v) {
    const std::string script =
      "import sys, time; sys.path.insert(0, '" + client_dir.string()
      + "'); "
        "from stitch_client import Client; c = Client(publisher='http://127.0.0.1:"
      + http_port + "'); t = time.monotonic(); c.publish('" + model.string()
      + "', run='r', version=" + std::to_string(v) + ", anchor=True); print(time.monotonic() - t)";
    // A log of its own: the output read back is this run's seconds (one log
    // for every run would be read from its start, the first run's figure).
    auto c =
      child::start({"python3", "-c", script}, dir / ("python-" + std::to_string(v) + ".log"));
    int status = 0;
    ::waitpid(c.pid, &status, 0);
    c.pid = -1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      die("the Python client's publish failed:\n" + c.output());
    return std::strtod(c.output().c_str(), nullptr);
  };
  const std::string coordinator = "127.0.0.1:" + port;
  auto cli = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {cli_bin.string(), "--coordinator", coordinator});
    return run_cli(args, dir / "cli.log");
  };
  const double b = static_cast<double>(bytes);

  // The first publish of a run (its remembered copy is allocated): the
  // node's peak memory.
  reset_peak(node.pid);
  cli({"publish", "--run", "r", "--version", "0", model.string()});
  f.node_publish_peak = static_cast<double>(peak_resident(node.pid)) / b;
  // Then anchors of the same run in turns, read by the node and streamed by
  // the CLI (medians of three; the machine is shared and noisy).
  std::vector<double> local, streamed, over_http, exported, exported_streamed;
  uint64_t version = 1;
  for (int round = 0; round < (pointer_only ? 0 : 3); ++round) {
    local.push_back(cli({"publish", "--anchor", "--run", "r", "--version",
                         std::to_string(version++), model.string()})
                      .first);
    streamed.push_back(cli({"publish", "--stream", "--anchor", "--run", "r", "--version",
                            std::to_string(version++), model.string()})
                         .first);
    if (have_python)
      over_http.push_back(http_publish(version++));
  }
  if (have_python && !over_http.empty())
    f.http_publish_bw = b / median(over_http);
  const std::string latest = "r/" + std::to_string(version - 1);
  for (int round = 0; round < (pointer_only ? 0 : 3); ++round) {
    fs::remove_all(dir / "export", ec_ignored());
    drop_cache(dir / "node" / "store");
    auto [s, peak] = cli({"export", "--version", latest, "--out", (dir / "export").string()});
    exported.push_back(s);
    f.export_cli_peak = std::max(f.export_cli_peak, static_cast<double>(peak) / b);
    fs::remove_all(dir / "export-streamed", ec_ignored());
    drop_cache(dir / "node" / "store");
    auto [ss, speak] =
      cli({"export", "--stream", "--version", latest, "--out", (dir / "export-streamed").string()});
    exported_streamed.push_back(ss);
    f.stream_export_cli_peak = std::max(f.stream_export_cli_peak, static_cast<double>(speak) / b);
  }
  if (!pointer_only) {
    f.local_publish_bw = b / median(local);
    f.stream_publish_bw = b / median(streamed);
    f.export_bw = b / median(exported);
    f.stream_export_bw = b / median(exported_streamed);
  }

  // Pointer reads, idle and while another pool takes a streamed publish.
  // The reader is set up as a node is (a replica reading the pointer runs in
  // one): its threads preempt bulk work when they wake.
  {
    stitch::pipeline::run_as_latency_thread();
    stitch::system_config cfg;
    cfg.set("logger.file-verbosity", caf::atom("quiet"));
    caf::actor_system sys{cfg};
    auto coord =
      stitch::node::connect_coordinator(sys, {"127.0.0.1", static_cast<uint16_t>(std::stoi(port))});
    if (!coord)
      die(to_string(coord.error()));
    auto found = stitch::node::ask_actor<caf::actor>(sys, *coord, std::chrono::seconds{10},
                                                     stitch::atom::lookup_v, std::string{"store"});
    if (!found)
      die(to_string(found.error()));
    auto store = caf::actor_cast<stitch::store_actor>(*found);
    // Idle and loaded in turns, three of each (one load is a second or two
    // of reads: a p99 of its few hundred is a handful of samples), so that
    // both see the machine in the same state.
    std::vector<double> idle, loaded;
    for (int round = 0; round < 3; ++round) {
      auto quiet = pointer_reads(sys, store, std::chrono::milliseconds{1000}, "idle");
      idle.insert(idle.end(), quiet.begin(), quiet.end());
      auto load = child::start({cli_bin.string(), "--coordinator", coordinator, "publish",
                                "--stream", "--anchor", "--pool", "load", "--run", "r", "--version",
                                std::to_string(round), model.string()},
                               dir / ("load-" + std::to_string(round) + ".log"));
      bool running = true;
      auto samples = pointer_reads(sys, store, std::chrono::minutes{5}, "loaded", [&] {
        int status = 0;
        if (running && ::waitpid(load.pid, &status, WNOHANG) == load.pid) {
          running = false;
          load.pid = -1;
          if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            die("the loading publish failed:\n" + load.output());
        }
        return running;
      });
      if (running)
        load.stop();
      loaded.insert(loaded.end(), samples.begin(), samples.end());
    }
    f.loaded_samples = loaded.size();
    f.idle = percentiles(std::move(idle));
    f.loaded = percentiles(std::move(loaded));
  }
  node.stop();
  return f;
}

/// The pointer-read figures as JSON members (without braces).
void print_pointer_json(const node_figures& f) {
  std::printf(
    "\"pointer_read_idle_p50_ms\":%.3f,\"pointer_read_idle_p99_ms\":%.3f,"
    "\"pointer_read_loaded_p50_ms\":%.3f,\"pointer_read_loaded_p99_ms\":%.3f,"
    "\"pointer_read_p50_loaded_over_idle\":%.2f,\"pointer_read_p99_loaded_over_idle\":%.2f",
    f.idle.p50 * 1e3, f.idle.p99 * 1e3, f.loaded.p50 * 1e3, f.loaded.p99 * 1e3, f.p50_ratio(),
    f.p99_ratio());
}

/// The pointer-read figures as the table's last line.
void print_pointer_line(const node_figures& f) {
  std::printf("pointer reads through the store actor: idle p50 %.3f ms p99 %.3f ms; during a "
              "streamed publish p50 %.3f ms p99 %.3f ms (%zu reads): p99 x%.2f (target <= 2)\n",
              f.idle.p50 * 1e3, f.idle.p99 * 1e3, f.loaded.p50 * 1e3, f.loaded.p99 * 1e3,
              f.loaded_samples, f.p99_ratio());
}

} // namespace

int main(int argc, char** argv) {
  uint64_t mb = 1024;
  fs::path dir = fs::temp_directory_path() / "stitch-store-bench";
  bool json = false;
  bool with_node = true;
  bool pointer_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--no-node")
      with_node = false;
    else if (a == "--pointer-only")
      pointer_only = true;
    else if (a == "--mb" && i + 1 < argc)
      mb = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--dir" && i + 1 < argc)
      dir = argv[++i];
    else if (a == "--json")
      json = true;
    else if (a == "--samples" && i + 1 < argc) {
      samples_file = std::fopen(argv[++i], "w");
      if (!samples_file)
        die(std::string{"cannot write "} + argv[i] + ": " + std::strerror(errno));
    } else {
      std::fprintf(stderr,
                   "usage: store_bench [--mb N] [--dir PATH] [--no-node | --pointer-only] [--json] "
                   "[--samples PATH]\n");
      return 2;
    }
  }
  if (mb < 8)
    mb = 8;
  const uint64_t bytes = mb << 20;
  warm_up_memory(3 * bytes + (uint64_t{1} << 30));
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  if (pointer_only) {
    // Only the pointer reads, idle and under a streamed publish (quick to
    // repeat while working on that figure).
    const auto nodes = node_rows(dir, make_weights(bytes, 16), bytes,
                                 fs::canonical("/proc/self/exe").parent_path(), true);
    fs::remove_all(dir, ec);
    if (!nodes.ran)
      die("no stitch-node/stitch next to this binary");
    if (json) {
      std::printf("{\"mb\":%llu,", static_cast<unsigned long long>(mb));
      print_pointer_json(nodes);
      std::printf("}\n");
    } else {
      print_pointer_line(nodes);
    }
    return 0;
  }

  // The disk's limits: the better of buffered and direct writes (each the
  // median of three, on new files), and a cold sequential read.
  auto median3 = [](auto f) {
    double v[3] = {f(), f(), f()};
    std::sort(v, v + 3);
    return v[1];
  };
  const double buffered_bw = median3([&] { return raw_write(dir / "raw", bytes, false); });
  const double direct_bw = median3([&] { return raw_write(dir / "raw", bytes, true); });
  // The limit is buffered write + fsync; O_DIRECT is shown beside it.
  const double write_bw = buffered_bw;
  {
    std::vector<char> block(8 << 20, 'x');
    std::ofstream out{dir / "raw", std::ios::binary};
    for (uint64_t done = 0; done < bytes; done += block.size())
      out.write(block.data(), static_cast<std::streamsize>(block.size()));
  }
  const double read_bw = median3([&] { return raw_read(dir / "raw"); });
  const double read_write_bw =
    median3([&] { return raw_read_while_writing(dir / "raw", dir / "raw-out"); });
  fs::remove(dir / "raw", ec);

  auto weights = make_weights(bytes, 16);
  // Three anchors, three 1%-dense deltas, three exports: medians.
  std::vector<double> full_s, delta_s, export_s;
  uint64_t delta_stored = 0;
  {
    auto opened = stitch::store::open_rocksdb_store((dir / "db").string());
    if (!opened)
      die(to_string(opened.error()));
    auto& db = **opened;
    stitch::pipeline::publisher pub{db};
    uint64_t version = 0;
    for (int round = 0; round < 3; ++round) {
      auto t0 = clock_type::now();
      auto full = pub.publish({"default", "bench", version++, true, false}, weights);
      full_s.push_back(seconds_since(t0));
      if (!full)
        die("full publish: " + to_string(full.error()));
    }
    std::mt19937_64 rng{11};
    for (int round = 0; round < 3; ++round) {
      // 1% of the bytes change, spread over every tensor.
      for (auto& [name, t] : weights)
        for (uint64_t k = 0; k < t.bytes.size() / 100; ++k)
          t.bytes[rng() % t.bytes.size()] ^= std::byte{0x5a};
      auto t0 = clock_type::now();
      auto delta = pub.publish({"default", "bench", version++, false, false}, weights);
      delta_s.push_back(seconds_since(t0));
      if (!delta)
        die("delta publish: " + to_string(delta.error()));
      if (delta->kind != stitch::version_kind::delta)
        die("the 1%-dense change was not published as a delta: " + delta->reason_for_anchor);
      delta_stored = delta->stored_bytes;
    }
    // The first delta: its anchor and one delta rebuilt, every tensor verified.
    const uint64_t exported_version = 3;
    for (int round = 0; round < 3; ++round) {
      fs::remove_all(dir / "out", ec);
      drop_cache(dir / "db");
      auto t0 = clock_type::now();
      auto exported =
        stitch::pipeline::export_version(db, "default", {"bench", exported_version}, dir / "out");
      export_s.push_back(seconds_since(t0));
      if (!exported)
        die("export: " + to_string(exported.error()));
    }
  }
  fs::remove_all(dir / "db", ec);
  fs::remove_all(dir / "out", ec);

  // The CPU's limit for a delta: XOR and compress (the publisher's codec) the same kind of
  // change on one core, nothing else.
  double codec_s = 0;
  {
    std::mt19937_64 rng{13};
    std::vector<std::byte> x;
    std::vector<std::byte> runs;
    for (const auto& [name, t] : weights) {
      auto changed = t.bytes;
      for (uint64_t k = 0; k < changed.size() / 100; ++k)
        changed[rng() % changed.size()] ^= std::byte{0x5a};
      x.resize(changed.size());
      runs.resize(stitch::delta::sparse_encode_bound(x.size()));
      auto t0 = clock_type::now();
      (void) stitch::delta::xor_encode(t.bytes, changed, x);
      const size_t listed = stitch::delta::sparse_encode(x, runs);
      auto packed =
        stitch::delta::compress(std::span{runs}.first(listed), 1, stitch::delta::finder::literals);
      codec_s += seconds_since(t0);
      if (!packed)
        die("zstd: " + to_string(packed.error()));
    }
  }

  const auto nodes =
    with_node ? node_rows(dir, weights, bytes, fs::canonical("/proc/self/exe").parent_path(), false)
              : node_figures{};
  fs::remove_all(dir, ec);

  const double b = static_cast<double>(bytes);
  const double full_bw = b / median(full_s), delta_bw = b / median(delta_s),
               export_bw = b / median(export_s), codec_bw = b / codec_s;
  if (json) {
    std::printf("{\"mb\":%llu,\"raw_write_buffered_gbps\":%.3f,\"raw_write_direct_gbps\":%.3f,"
                "\"raw_write_gbps\":%.3f,\"raw_read_gbps\":%.3f,"
                "\"full_publish_gbps\":%.3f,\"full_publish_ratio\":%.3f,"
                "\"delta_publish_gbps\":%.3f,\"delta_publish_ratio\":%.3f,"
                "\"delta_stored_bytes\":%llu,\"delta_codec_gbps\":%.3f,"
                "\"delta_publish_codec_ratio\":%.3f,\"export_gbps\":%.3f,\"export_ratio\":%.3f,"
                "\"raw_read_while_writing_gbps\":%.3f,\"export_over_read_while_writing\":%.3f",
                static_cast<unsigned long long>(mb), buffered_bw / 1e9, direct_bw / 1e9,
                write_bw / 1e9, read_bw / 1e9, full_bw / 1e9, full_bw / write_bw, delta_bw / 1e9,
                delta_bw / write_bw, static_cast<unsigned long long>(delta_stored), codec_bw / 1e9,
                delta_bw / codec_bw, export_bw / 1e9, export_bw / read_bw, read_write_bw / 1e9,
                export_bw / read_write_bw);
    if (nodes.ran) {
      std::printf(",\"cli_publish_ratio\":%.3f,\"stream_publish_over_local_ratio\":%.3f,"
                  "\"node_publish_peak_over_model\":%.3f,\"cli_export_ratio\":%.3f,"
                  "\"cli_export_peak_over_model\":%.3f,\"stream_export_ratio\":%.3f,"
                  "\"stream_export_peak_over_model\":%.3f,\"http_publish_over_cli_ratio\":%.3f,",
                  nodes.local_publish_bw / write_bw,
                  nodes.stream_publish_bw / nodes.local_publish_bw, nodes.node_publish_peak,
                  nodes.export_bw / read_bw, nodes.export_cli_peak,
                  nodes.stream_export_bw / read_bw, nodes.stream_export_cli_peak,
                  nodes.http_publish_bw / nodes.local_publish_bw);
      print_pointer_json(nodes);
    }
    std::printf("}\n");
    return 0;
  }
  std::printf("store_bench: %llu MiB model (16 f32 tensors)\n",
              static_cast<unsigned long long>(mb));
  std::printf("%-40s %9s %9s  %s\n", "measure", "GB/s", "ratio", "target");
  std::printf("%-40s %9.3f %9s\n", "raw write+fsync (buffered)", buffered_bw / 1e9, "1.00");
  std::printf("%-40s %9.3f %9.2f  (shown: what direct I/O gets)\n", "raw write+fsync, O_DIRECT",
              direct_bw / 1e9, direct_bw / buffered_bw);

  std::printf("%-40s %9.3f %9s\n", "raw read (cache dropped)", read_bw / 1e9, "1.00");
  std::printf("%-40s %9.3f %9.2f  >= 0.6 x write\n", "publish full anchor (in process)",
              full_bw / 1e9, full_bw / write_bw);
  std::printf("%-40s %9.3f %9.2f  >= 0.9 x write (model bytes/s; %llu stored)\n",
              "publish 1%-dense delta (in process)", delta_bw / 1e9, delta_bw / write_bw,
              static_cast<unsigned long long>(delta_stored));
  std::printf("%-40s %9.3f %9.2f  (delta publish vs XOR + the delta codec on one core)\n",
              "  the CPU's delta codec limit", codec_bw / 1e9, delta_bw / codec_bw);
  std::printf("%-40s %9.3f %9.2f  >= 0.5 x read\n", "export anchor + delta (in process)",
              export_bw / 1e9, export_bw / read_bw);
  std::printf("%-40s %9.3f %9.2f  (export vs the disk reading and writing at once)\n",
              "  raw read while writing", read_write_bw / 1e9, export_bw / read_write_bw);
  if (!nodes.ran) {
    std::printf("(no stitch-node/stitch next to this binary: node rows skipped)\n");
    return 0;
  }
  std::printf("%-40s %9.3f %9.2f  >= 0.6 x write\n", "stitch publish DIR (node reads it)",
              nodes.local_publish_bw / 1e9, nodes.local_publish_bw / write_bw);
  std::printf("%-40s %9.3f %9.2f  >= 0.8 x local publish\n", "stitch publish --stream",
              nodes.stream_publish_bw / 1e9, nodes.stream_publish_bw / nodes.local_publish_bw);
  if (nodes.http_publish_bw > 0)
    std::printf("%-40s %9.3f %9.2f  >= 0.8 x CLI publish of the directory\n",
                "HTTP publish (Python client, same dir)", nodes.http_publish_bw / 1e9,
                nodes.http_publish_bw / nodes.local_publish_bw);
  std::printf("%-40s %9s %9.2f  <= 1.5 x model\n", "node peak memory during publish", "",
              nodes.node_publish_peak);
  std::printf("%-40s %9.3f %9.2f  >= 0.5 x read\n", "stitch export (node writes)",
              nodes.export_bw / 1e9, nodes.export_bw / read_bw);
  std::printf("%-40s %9s %9.2f  <= 0.3 x model\n", "  CLI peak memory", "", nodes.export_cli_peak);
  std::printf("%-40s %9.3f %9.2f  (report)\n", "stitch export --stream (to the CLI)",
              nodes.stream_export_bw / 1e9, nodes.stream_export_bw / read_bw);
  std::printf("%-40s %9s %9.2f  <= 0.3 x model\n", "  CLI peak memory", "",
              nodes.stream_export_cli_peak);
  print_pointer_line(nodes);
  return 0;
}
