#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "runtime/core/error.hpp"

namespace stitch::engine {

/// How the node starts an external engine for one replica (`engine.launch`).
struct launch_options {
  /// A shell command line; `{port}`, `{gpu}` and `{model_dir}` are replaced
  /// (the values shell-quoted) by the engine's port, the replica's GPU slots
  /// (comma-separated; also put in `CUDA_VISIBLE_DEVICES`) and the directory
  /// it boots from.
  std::string command;
  /// The replica's name: every output line is logged with it.
  std::string name;
  std::vector<uint32_t> gpus;
  /// Receives each line the engine writes (stdout and stderr), without its
  /// newline; called from the process's reader thread.
  std::function<void(std::string_view line)> log;
  /// Restart back-off: doubles from `min_backoff` up to `max_backoff`, and
  /// starts again from `min_backoff` after a run that lasted `stable_after`.
  std::chrono::milliseconds min_backoff{1000};
  std::chrono::milliseconds max_backoff{30'000};
  std::chrono::milliseconds stable_after{60'000};
  /// `stop` waits this long after SIGTERM before SIGKILL.
  std::chrono::milliseconds stop_grace{10'000};
};

/// The text of `command` with the placeholders filled in; an unknown
/// `{name}` placeholder is an `invalid_argument` error naming it (a literal
/// brace is written `{{` or `}}`).
result<std::string> expand_launch_command(std::string_view command, uint16_t port,
                                          const std::vector<uint32_t>& gpus,
                                          const std::filesystem::path& model_dir);

/// A free TCP port on the loopback interface (bound and released).
result<uint16_t> pick_free_port();

/// Whether nothing listens on loopback `port` now (it can be bound).
bool port_free(uint16_t port);

/// One launched engine process, supervised: it runs in its own process
/// group with its output captured line by line; when it exits without being
/// asked to, it is started again after a back-off, on the same port and from
/// the model directory set last. Thread-safe.
class engine_process {
public:
  /// Starts the process (`/bin/sh -c`), booting from `model_dir`.
  static result<std::unique_ptr<engine_process>> start(launch_options options, uint16_t port,
                                                       std::filesystem::path model_dir);
  ~engine_process();
  engine_process(const engine_process&) = delete;
  engine_process& operator=(const engine_process&) = delete;

  uint16_t port() const noexcept { return port_; }
  /// The directory the next restart boots from.
  void set_model_dir(std::filesystem::path dir);
  /// Starts counted so far (1 after `start`); a restart increments it.
  uint64_t starts() const;
  /// Whether the process is running now.
  bool running() const;
  /// How the last run ended ("exited with status 1", "killed by signal 9"),
  /// empty while the first run lasts.
  std::string last_exit() const;
  /// Sends SIGKILL to the process group (tests: a crashed engine).
  void kill_now();
  /// Stops supervising and ends the process: SIGTERM to its group, SIGKILL
  /// after the grace period. Idempotent.
  void stop();

private:
  engine_process(launch_options options, uint16_t port, std::filesystem::path model_dir);
  /// Spawns one run; the caller holds `mutex_`.
  status spawn_locked();
  void supervise();

  launch_options opts_;
  uint16_t port_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::filesystem::path model_dir_;
  int pid_ = -1;
  uint64_t starts_ = 0;
  bool stopping_ = false;
  std::string last_exit_;
  std::chrono::steady_clock::time_point started_at_;
  std::thread supervisor_;
  std::vector<std::thread> readers_;
};

} // namespace stitch::engine
