#include "runtime/engine/engine_process.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace stitch::engine {

namespace fs = std::filesystem;

namespace {

std::string shell_quote(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

std::string gpu_list(const std::vector<uint32_t>& gpus) {
  std::string out;
  for (size_t i = 0; i < gpus.size(); ++i)
    out += (i ? "," : "") + std::to_string(gpus[i]);
  return out;
}

std::string describe_exit(int wstatus) {
  if (WIFEXITED(wstatus))
    return "exited with status " + std::to_string(WEXITSTATUS(wstatus));
  if (WIFSIGNALED(wstatus))
    return "killed by signal " + std::to_string(WTERMSIG(wstatus));
  return "ended (wait status " + std::to_string(wstatus) + ")";
}

/// Hands each line read from `fd` to `log` until end of file, then closes it.
void read_lines(int fd, const std::function<void(std::string_view)>& log) {
  std::string pending;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    pending.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1)
      if (log)
        log(std::string_view{pending}.substr(start, nl - start));
    pending.erase(0, start);
    // A line without end is cut rather than held without bound.
    if (pending.size() > 64 * 1024) {
      if (log)
        log(pending);
      pending.clear();
    }
  }
  if (!pending.empty() && log)
    log(pending);
  ::close(fd);
}

} // namespace

result<std::string> expand_launch_command(std::string_view command, uint16_t port,
                                          const std::vector<uint32_t>& gpus,
                                          const fs::path& model_dir) {
  std::string out;
  for (size_t i = 0; i < command.size(); ++i) {
    char c = command[i];
    if ((c == '{' || c == '}') && i + 1 < command.size() && command[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    auto close = command.find('}', i);
    if (close == std::string_view::npos)
      return make_error(errc::invalid_argument,
                        "engine.launch has an unclosed '{' (write '{{' for a literal brace)");
    auto name = command.substr(i + 1, close - i - 1);
    if (name == "port")
      out += std::to_string(port);
    else if (name == "gpu")
      out += shell_quote(gpu_list(gpus));
    else if (name == "model_dir")
      out += shell_quote(model_dir.string());
    else
      return make_error(errc::invalid_argument,
                        "engine.launch has the unknown placeholder {" + quote_untrusted(name)
                          + "} (known: {port}, {gpu}, {model_dir}; '{{' for a brace)");
    i = close;
  }
  return out;
}

namespace {

/// Binds a TCP socket on the loopback interface to `port` (0: any) and
/// releases it; the port it got.
result<uint16_t> bind_loopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return make_error(errc::backend_failure,
                      std::string{"cannot open a socket: "} + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0
      || ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int e = errno;
    ::close(fd);
    return make_error(errc::backend_failure,
                      "cannot bind port " + std::to_string(port) + ": " + std::strerror(e));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

} // namespace

result<uint16_t> pick_free_port() {
  return bind_loopback(0);
}

bool port_free(uint16_t port) {
  return port != 0 && bind_loopback(port).has_value();
}

engine_process::engine_process(launch_options options, uint16_t port, fs::path model_dir)
    : opts_(std::move(options)), port_(port), model_dir_(std::move(model_dir)) {}

result<std::unique_ptr<engine_process>> engine_process::start(launch_options options, uint16_t port,
                                                              fs::path model_dir) {
  if (auto cmd = expand_launch_command(options.command, port, options.gpus, model_dir); !cmd)
    return std::move(cmd).error();
  std::unique_ptr<engine_process> p{new engine_process(std::move(options), port, model_dir)};
  {
    std::lock_guard lock{p->mutex_};
    if (auto ok = p->spawn_locked(); !ok)
      return std::move(ok).error();
  }
  p->supervisor_ = std::thread{[raw = p.get()] { raw->supervise(); }};
  return p;
}

engine_process::~engine_process() {
  stop();
}

status engine_process::spawn_locked() {
  auto cmd = expand_launch_command(opts_.command, port_, opts_.gpus, model_dir_);
  if (!cmd)
    return std::move(cmd).error();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return make_error(errc::backend_failure,
                      std::string{"cannot make a pipe for the engine: "} + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  // Its own process group, so that stopping it stops whatever it started.
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGINT);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e)
    if (!std::string_view{*e}.starts_with("CUDA_VISIBLE_DEVICES="))
      env.emplace_back(*e);
  if (!opts_.gpus.empty())
    env.push_back("CUDA_VISIBLE_DEVICES=" + gpu_list(opts_.gpus));
  std::vector<char*> envp;
  for (auto& e : env)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string shell = "/bin/sh";
  std::string dash_c = "-c";
  std::string line = "exec " + *cmd;
  char* argv[] = {shell.data(), dash_c.data(), line.data(), nullptr};
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, shell.c_str(), &actions, &attr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return make_error(errc::backend_failure,
                      "cannot start the engine of " + opts_.name + ": " + std::strerror(rc));
  }
  pid_ = pid;
  ++starts_;
  started_at_ = std::chrono::steady_clock::now();
  readers_.emplace_back([fd = fds[0], log = opts_.log] { read_lines(fd, log); });
  if (opts_.log)
    opts_.log("[stitch] started (pid " + std::to_string(pid) + ", port " + std::to_string(port_)
              + "): " + *cmd);
  return {};
}

void engine_process::supervise() {
  auto backoff = opts_.min_backoff;
  for (;;) {
    int pid = -1;
    {
      std::lock_guard lock{mutex_};
      pid = pid_;
    }
    int wstatus = 0;
    while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }
    std::vector<std::thread> finished;
    std::unique_lock lock{mutex_};
    // Whatever it started dies with it: a restart must find its port free.
    ::kill(-pid, SIGKILL);
    pid_ = -1;
    last_exit_ = describe_exit(wstatus);
    finished.swap(readers_);
    bool lived_long = std::chrono::steady_clock::now() - started_at_ >= opts_.stable_after;
    wake_.notify_all();
    lock.unlock();
    for (auto& t : finished)
      t.join();
    lock.lock();
    if (stopping_)
      return;
    if (lived_long)
      backoff = opts_.min_backoff;
    if (opts_.log)
      opts_.log("[stitch] the engine " + last_exit_ + "; restarting in "
                + std::to_string(backoff.count()) + " ms");
    wake_.wait_for(lock, backoff, [&] { return stopping_; });
    if (stopping_)
      return;
    backoff = std::min(backoff * 2, opts_.max_backoff);
    while (!stopping_) {
      auto ok = spawn_locked();
      if (ok)
        break;
      if (opts_.log)
        opts_.log("[stitch] " + ok.error().message + "; trying again in "
                  + std::to_string(backoff.count()) + " ms");
      wake_.wait_for(lock, backoff, [&] { return stopping_; });
      backoff = std::min(backoff * 2, opts_.max_backoff);
    }
    if (stopping_)
      return;
  }
}

void engine_process::set_model_dir(fs::path dir) {
  std::lock_guard lock{mutex_};
  model_dir_ = std::move(dir);
}

uint64_t engine_process::starts() const {
  std::lock_guard lock{mutex_};
  return starts_;
}

bool engine_process::running() const {
  std::lock_guard lock{mutex_};
  return pid_ > 0;
}

std::string engine_process::last_exit() const {
  std::lock_guard lock{mutex_};
  return last_exit_;
}

void engine_process::kill_now() {
  std::lock_guard lock{mutex_};
  if (pid_ > 0)
    ::kill(-pid_, SIGKILL);
}

void engine_process::stop() {
  std::unique_lock lock{mutex_};
  if (!supervisor_.joinable())
    return;
  stopping_ = true;
  wake_.notify_all();
  if (pid_ > 0) {
    ::kill(-pid_, SIGTERM);
    if (!wake_.wait_for(lock, opts_.stop_grace, [&] { return pid_ <= 0; }) && pid_ > 0)
      ::kill(-pid_, SIGKILL);
  }
  lock.unlock();
  supervisor_.join();
  for (auto& t : readers_)
    t.join();
  readers_.clear();
}

} // namespace stitch::engine
