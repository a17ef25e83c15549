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

TEST(store_crash, sigkill_never_loses_acknowledged_or_exposes_half_written_versions) {
  temp_dir dir;
  const std::string path = (dir.path() / "db").string();
  const std::string child_err = (dir.path() / "child.err").string();
  const int kills = env_int("STITCH_CRASH_KILLS", 200);
  const auto seed = static_cast<uint32_t>(env_int("STITCH_CRASH_SEED", 20261130));
  std::mt19937 rng{seed};
  std::set<uint64_t> acked;
  for (int i = 0; i < kills; ++i) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      dup2(fds[1], STDOUT_FILENO);
      int err = open(child_err.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (err >= 0)
        dup2(err, STDERR_FILENO);
      close(fds[0]);
      execl(STITCH_CRASH_CHILD, STITCH_CRASH_CHILD, path.c_str(), static_cast<char*>(nullptr));
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
      FAIL() << "the publisher exited on its own (kill " << i << "): " << text.str();
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
    check_store(path, acked);
    if (HasFatalFailure())
      FAIL() << "after kill " << i << " (seed " << seed << ")";
  }
  RecordProperty("acknowledged", static_cast<int>(acked.size()));
  std::printf("store_crash: %d kills, %zu acknowledged versions, seed %u\n", kills, acked.size(),
              seed);
  EXPECT_GT(acked.size(), 10u) << "the publisher made too little progress to prove anything";
}

} // namespace
} // namespace stitch
