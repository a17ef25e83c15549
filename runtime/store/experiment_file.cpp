#include "runtime/store/experiment_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <msgpack.hpp>

namespace stitch::store {

namespace {

/// Version 1 of the record; a later layout bumps it.
constexpr uint32_t record_format = 1;

struct spec_msg {
  std::string run_id, pool, commit_mode, boot_preset, boot_dir;
  uint32_t replicas = 0;
  uint64_t boot_seed = 0, boot_version = 0;
  bool trainer_enabled = false;
  uint32_t steps = 0, samples_per_step = 0, staleness = 0;
  double learning_rate = 0;
  bool trainer_done = false;
  uint64_t next_replica = 0;
  MSGPACK_DEFINE(run_id, pool, commit_mode, boot_preset, boot_dir, replicas, boot_seed,
                 boot_version, trainer_enabled, steps, samples_per_step, staleness, learning_rate,
                 trainer_done, next_replica)
};

struct file_msg {
  uint32_t format = record_format;
  std::vector<spec_msg> experiments;
  MSGPACK_DEFINE(format, experiments)
};

status fail_at(const std::filesystem::path& path, const std::string& what) {
  return make_error(errc::backend_failure, what + " " + path.string() + ": " + errno_text(errno));
}

} // namespace

std::string encode_experiments(const std::vector<experiment_record>& records) {
  file_msg f;
  for (const auto& r : records) {
    const auto& s = r.spec;
    f.experiments.push_back({s.run_id, s.pool, s.commit_mode, s.boot_preset, s.boot_dir, s.replicas,
                             s.boot_seed, s.boot_version, s.trainer.enabled, s.trainer.steps,
                             s.trainer.samples_per_step, s.trainer.staleness,
                             s.trainer.learning_rate, r.trainer_done, r.next_replica});
  }
  msgpack::sbuffer buf;
  msgpack::pack(buf, f);
  return std::string{buf.data(), buf.size()};
}

result<std::vector<experiment_record>> decode_experiments(std::string_view bytes) {
  file_msg f;
  try {
    // No container or string is longer than the record itself: a forged
    // length is refused before msgpack allocates for it.
    const auto n = bytes.size();
    msgpack::unpack_limit limit(n, n, n, n, n, 8);
    auto handle = msgpack::unpack(bytes.data(), bytes.size(), nullptr, nullptr, limit);
    handle.get().convert(f);
  } catch (const std::exception& e) {
    return make_error(errc::corrupt_data,
                      std::string{"experiments record is corrupt: "} + e.what());
  }
  if (f.format != record_format)
    return make_error(errc::corrupt_data, "experiments record has format "
                                            + std::to_string(f.format) + "; this build reads "
                                            + std::to_string(record_format));
  std::vector<experiment_record> out;
  for (auto& m : f.experiments) {
    experiment_record r;
    r.spec.run_id = std::move(m.run_id);
    r.spec.pool = std::move(m.pool);
    r.spec.commit_mode = std::move(m.commit_mode);
    r.spec.boot_preset = std::move(m.boot_preset);
    r.spec.boot_dir = std::move(m.boot_dir);
    r.spec.replicas = m.replicas;
    r.spec.boot_seed = m.boot_seed;
    r.spec.boot_version = m.boot_version;
    r.spec.trainer = {m.trainer_enabled, m.steps, m.samples_per_step, m.staleness, m.learning_rate};
    r.trainer_done = m.trainer_done;
    r.next_replica = m.next_replica;
    out.push_back(std::move(r));
  }
  return out;
}

status save_experiments(const std::filesystem::path& path,
                        const std::vector<experiment_record>& records) {
  const auto bytes = encode_experiments(records);
  auto temp = path;
  temp += ".tmp";
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return fail_at(temp, "cannot create");
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      auto failed = fail_at(temp, "cannot write");
      ::close(fd);
      ::unlink(temp.c_str());
      return failed;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    auto failed = fail_at(temp, "cannot fsync");
    ::close(fd);
    ::unlink(temp.c_str());
    return failed;
  }
  ::close(fd);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    auto failed = fail_at(path, "cannot replace");
    ::unlink(temp.c_str());
    return failed;
  }
  auto parent = path.parent_path().empty() ? std::filesystem::path{"."} : path.parent_path();
  int dir = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0)
    return fail_at(parent, "cannot open");
  bool synced = ::fsync(dir) == 0;
  ::close(dir);
  if (!synced)
    return fail_at(parent, "cannot fsync");
  return {};
}

result<std::vector<experiment_record>> load_experiments(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return std::vector<experiment_record>{};
  // The record holds a few specs; anything this large is not one.
  constexpr uintmax_t limit = uintmax_t{16} << 20;
  auto size = std::filesystem::file_size(path, ec);
  if (ec)
    return make_error(errc::backend_failure, "cannot read " + path.string() + ": " + ec.message());
  if (size > limit)
    return make_error(errc::corrupt_data, path.string() + " holds " + std::to_string(size)
                                            + " bytes; an experiments record is far smaller");
  std::ifstream in{path, std::ios::binary};
  std::string bytes(static_cast<size_t>(size), '\0');
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size())))
    return make_error(errc::backend_failure, "cannot read " + path.string());
  auto records = decode_experiments(bytes);
  if (!records)
    return make_error(records.error().code, path.string() + ": " + records.error().message);
  return records;
}

} // namespace stitch::store
