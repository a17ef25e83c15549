// Kills a publishing process at random moments and checks after each kill that
// the store kept every acknowledged version and shows nothing half written.

#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>
#include <vector>

#include "crash_workload.hpp"
#include "runtime/core/checksum.hpp"
#include "runtime/store/rocksdb_store.hpp"

namespace stitch {
namespace {

using namespace stitch::testing;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

/// Starts the crash child on a store at `path` (with `extra` arguments) and
/// kills it at random moments `kills` times, running `check(acked)` after
/// each kill; answers the acknowledged versions.
template <class Check>
std::set<uint64_t> kill_repeatedly(const std::string& path, const std::string& child_err,
                                   const std::vector<std::string>& extra, int kills, uint32_t seed,
                                   Check check) {
  std::mt19937 rng{seed};
  std::set<uint64_t> acked;
  for (int i = 0; i < kills; ++i) {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    EXPECT_GE(pid, 0);
    if (pid == 0) {
      dup2(fds[1], STDOUT_FILENO);
      int err = open(child_err.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (err >= 0)
        dup2(err, STDERR_FILENO);
      close(fds[0]);
      std::vector<char*> argv{const_cast<char*>(STITCH_CRASH_CHILD),
                              const_cast<char*>(path.c_str())};
      for (const auto& e : extra)
        argv.push_back(const_cast<char*>(e.c_str()));
      argv.push_back(nullptr);
      execv(STITCH_CRASH_CHILD, argv.data());
      _exit(127);
    }
    close(fds[1]);
    std::string out;
    char buf[4096];
    // Mostly kill mid-publish, after the store opened and 0-2 publishes were
    // acknowledged (so the run makes progress however loaded the machine is);
    // sometimes mid-recovery.
    auto count = [](const std::string& text, std::string_view word) {
      size_t n = 0;
      for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1))
        ++n;
      return n;
    };
    if (rng() % 8 != 0) {
      const size_t acks_wanted = rng() % 3;
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while ((out.find("ready") == std::string::npos || count(out, "ack ") < acks_wanted)
             && std::chrono::steady_clock::now() < deadline) {
        pollfd p{fds[0], POLLIN, 0};
        if (poll(&p, 1, 100) > 0) {
          ssize_t got = read(fds[0], buf, sizeof(buf));
          if (got <= 0)
            break;
          out.append(buf, static_cast<size_t>(got));
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40'000));
    kill(pid, SIGKILL);
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    if (!(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)) {
      std::ifstream err{child_err};
      std::stringstream text;
      text << err.rdbuf();
      ADD_FAILURE() << "the child exited on its own (kill " << i << "): " << text.str();
      return acked;
    }
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof(buf))) > 0)
      out.append(buf, static_cast<size_t>(n));
    close(fds[0]);
    std::istringstream lines{out};
    std::string word;
    while (lines >> word) {
      uint64_t v;
      if (word == "ack" && lines >> v)
        acked.insert(v);
    }
    check(acked);
    if (::testing::Test::HasFatalFailure()) {
      ADD_FAILURE() << "after kill " << i << " (seed " << seed << ")";
      return acked;
    }
  }
  return acked;
}

TEST(store_crash, sigkill_never_loses_acknowledged_or_exposes_half_written_versions) {
  temp_dir dir;
  const std::string path = (dir.path() / "db").string();
  const int kills = env_int("STITCH_CRASH_KILLS", 200);
  const auto seed = static_cast<uint32_t>(env_int("STITCH_CRASH_SEED", 20261130));
  auto acked = kill_repeatedly(path, (dir.path() / "child.err").string(), {}, kills, seed,
                               [&](const std::set<uint64_t>& a) { check_store(path, a); });
  RecordProperty("acknowledged", static_cast<int>(acked.size()));
  std::printf("store_crash: %d kills, %zu acknowledged versions, seed %u\n", kills, acked.size(),
              seed);
  EXPECT_GT(acked.size(), 10u) << "the publisher made too little progress to prove anything";
}

TEST(store_crash, sigkill_during_collections_never_leaves_a_retained_version_unreadable) {
  temp_dir dir;
  const std::string path = (dir.path() / "db").string();
  const int kills = env_int("STITCH_GC_CRASH_KILLS", 50);
  const auto seed = static_cast<uint32_t>(env_int("STITCH_CRASH_SEED", 20261130));
  constexpr size_t keep = 3;
  auto acked = kill_repeatedly(
    path, (dir.path() / "child.err").string(), {"gc", std::to_string(keep)}, kills, seed,
    [&](const std::set<uint64_t>& a) { check_collected_store(path, a, keep); });
  std::printf("store_crash (collecting): %d kills, %zu acknowledged versions, seed %u\n", kills,
              acked.size(), seed);
  EXPECT_GT(acked.size(), 10u) << "the publisher made too little progress to prove anything";
  // Collections really ran: far fewer versions are left than were published.
  auto opened = store::open_rocksdb_store(path);
  ASSERT_TRUE(opened);
  auto listed = (*opened)->list_versions(crash_pool, crash_run);
  ASSERT_TRUE(listed);
  EXPECT_LT(listed->size(), acked.size() / 2 + keep + crash_anchor_every + 1);
}

} // namespace
} // namespace stitch
