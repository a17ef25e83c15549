#pragma once

// Shared by the UCX tests: deterministic bytes, and length-prefixed frames
// a forked holder writes to its parent through a pipe.

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "transport/ucx.hpp"

namespace stitch::transport::ucx::testing {

/// `n` bytes that depend only on `seed`.
inline std::vector<std::byte> pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> out(n);
  std::mt19937_64 rng{seed};
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (size_t i = n / 8 * 8; i < n; ++i)
    out[i] = static_cast<std::byte>(i * 7 + seed);
  return out;
}

/// Writes `bytes` as one frame (an 8-byte length, then the bytes).
inline void write_frame(int fd, const std::vector<std::byte>& bytes) {
  uint64_t n = bytes.size();
  (void) !::write(fd, &n, sizeof n);
  (void) !::write(fd, bytes.data(), bytes.size());
}

/// Reads one frame; empty when the pipe closed first.
inline std::vector<std::byte> read_frame(int fd) {
  uint64_t n = 0;
  if (::read(fd, &n, sizeof n) != static_cast<ssize_t>(sizeof n) || n > (uint64_t{1} << 20))
    return {};
  std::vector<std::byte> bytes(n);
  size_t got = 0;
  while (got < n) {
    auto r = ::read(fd, bytes.data() + got, n - got);
    if (r <= 0)
      return {};
    got += static_cast<size_t>(r);
  }
  return bytes;
}

/// Why UCX cannot move bytes over TCP here ("" when it can): a machine
/// where UCX finds no network device (a chroot without /sys, an isolated
/// namespace whose loopback is down). Tried once, in a child process, so
/// this process has not touched UCX before the tests fork holders.
inline std::string ucx_unusable() {
  static const std::string why = [] {
    int fds[2];
    if (::pipe(fds) != 0)
      return std::string{"pipe failed"};
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      std::string err;
      if (auto w = worker::start(context_options{"tcp"}); !w)
        err = w.error().message;
      (void) !::write(fds[1], err.data(), err.size());
      ::_exit(0);
    }
    ::close(fds[1]);
    std::string err;
    char buf[512];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
      err.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    ::waitpid(pid, nullptr, 0);
    return err;
  }();
  return why;
}

} // namespace stitch::transport::ucx::testing

/// Skips a test on a machine where UCX cannot run, saying why.
#define STITCH_REQUIRE_UCX()                                                                       \
  do {                                                                                             \
    if (auto why = ::stitch::transport::ucx::testing::ucx_unusable(); !why.empty())                \
      GTEST_SKIP() << "UCX cannot move bytes on this machine: " << why;                            \
  } while (0)
