#pragma once

// A `stitch-node` child process for end-to-end tests, and a command runner.

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "transport/http_client.hpp"

namespace stitch::testing {

/// GET `target` from an HTTP surface; its JSON body when it answered 200.
inline std::optional<nlohmann::json> get_json(const std::string& host, uint16_t port,
                                              const std::string& target) {
  transport::http_client c{transport::http_endpoint{"http", host, port}};
  transport::http_request req;
  req.target = target;
  auto r = c.send(req);
  if (!r || r->status != 200)
    return std::nullopt;
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_discarded())
    return std::nullopt;
  return j;
}

struct run_result {
  int code = -1;
  std::string output;
};

/// Runs a command line, capturing stdout and stderr.
inline run_result run(const std::string& command) {
  run_result r;
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe)
    return r;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), pipe))
    r.output.append(buf.data(), n);
  int status = ::pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

/// Starts `args` (searched on PATH) as a child whose stdout and stderr
/// both append to `log`; its pid (-1 when fork failed).
inline pid_t spawn_logged(std::vector<std::string> args, const std::filesystem::path& log) {
  pid_t pid = fork();
  if (pid == 0) {
    // Both in append mode: two offsets into one file would overwrite each other.
    std::freopen(log.c_str(), "a", stdout);
    std::freopen(log.c_str(), "a", stderr);
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

/// SIGKILLs the child `pid` (if any), reaps it into `status` and forgets it.
inline void kill_and_reap(pid_t& pid, int& status) {
  if (pid <= 0)
    return;
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  pid = -1;
}

/// A `stitch-node` child process; its log is `DIR/node.log`.
class node_process {
public:
  /// The all-in-one node: `--data-dir DIR/data --set ...` with every listen
  /// port 0; the ports it picked are read from its log.
  node_process(const std::filesystem::path& dir, std::vector<std::string> extra_sets)
      : log_(dir / "node.log") {
    std::vector<std::string> args = {"--data-dir=" + (dir / "data").string()};
    for (const char* s : {"coordinator.listen=127.0.0.1:0", "gateway.listen=127.0.0.1:0",
                          "status.listen=127.0.0.1:0", "replica.listen=127.0.0.1:0"})
      args.insert(args.end(), {"--set", s});
    for (auto& s : extra_sets)
      args.insert(args.end(), {"--set", s});
    launch(args);
    await_log("status http://127\\.0\\.0\\.1:[0-9]+");
  }

  /// `stitch-node ARGS...`, waiting until its log matches `ready` (or it exits).
  node_process(const std::filesystem::path& dir, const std::vector<std::string>& args,
               const std::string& ready, std::vector<std::string> wrapper = {})
      : log_(dir / "node.log"), wrapper_(std::move(wrapper)) {
    std::filesystem::create_directories(dir);
    launch(args);
    await_log(ready);
  }

  /// Waits (bounded, 30 s) until the log matches `pattern`; reads the ports.
  bool await_log(const std::string& pattern) {
    for (int i = 0; i < 600; ++i) {
      auto s = log();
      std::smatch m;
      if (std::regex_search(s, m, std::regex{"listening on 127\\.0\\.0\\.1:([0-9]+)"}))
        coordinator_port = m[1];
      if (std::regex_search(s, m, std::regex{"gateway http://127\\.0\\.0\\.1:([0-9]+)"}))
        gateway_port = m[1];
      if (std::regex_search(s, m, std::regex{"status http://127\\.0\\.0\\.1:([0-9]+)"}))
        status_port = m[1];
      if (std::regex_search(s, std::regex{pattern})) {
        ready_ = true;
        return true;
      }
      if (pid_ > 0 && waitpid(pid_, &exit_status_, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  /// Sends `sig` (SIGSTOP: alive to TCP, silent to heartbeats; SIGCONT).
  void signal(int sig) {
    if (pid_ > 0)
      kill(pid_, sig);
  }

  /// SIGKILL: the node dies without leaving the cluster.
  void kill9() { kill_and_reap(pid_, exit_status_); }
  pid_t pid() const noexcept { return pid_; }

  /// The exit code when it exited on its own (-1 while running or killed).
  int exit_code() {
    if (pid_ > 0 && waitpid(pid_, &exit_status_, WNOHANG) == pid_)
      pid_ = -1;
    return pid_ <= 0 && WIFEXITED(exit_status_) ? WEXITSTATUS(exit_status_) : -1;
  }

  ~node_process() { stop(); }

  std::string log() const {
    std::ifstream in{log_};
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  bool started() const { return ready_; }

  /// SIGTERM; true when it exited 0.
  bool stop() {
    if (pid_ <= 0)
      return true;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

  std::string coordinator_port, gateway_port, status_port;

private:
  void launch(std::vector<std::string> args) {
    // A restarted node must not be taken as ready by its predecessor's log.
    std::error_code ec;
    std::filesystem::remove(log_, ec);
    args.insert(args.begin(), STITCH_NODE_BIN);
    // A wrapper (`ip netns exec NS env K=V`) execs the node in its place.
    args.insert(args.begin(), wrapper_.begin(), wrapper_.end());
    pid_ = spawn_logged(std::move(args), log_);
  }

  std::filesystem::path log_;
  std::vector<std::string> wrapper_;
  pid_t pid_ = -1;
  int exit_status_ = 0;
  bool ready_ = false;
};

} // namespace stitch::testing
