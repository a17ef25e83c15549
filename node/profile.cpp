#include "node/profile.hpp"

#include <caf/all.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/coordinator_actor.hpp"
#include "actors/publisher_actor.hpp"
#include "actors/replica_actor.hpp"
#include "actors/store_client.hpp"
#include "node/commands.hpp"
#include "node/remote.hpp"
#include "runtime/core/safetensors.hpp"
#include "runtime/pipeline/hf_directory.hpp"
#include "runtime/store/version_layout.hpp"
#include "transport/capability.hpp"
#include "transport/s3_xml.hpp"

namespace stitch::node {

namespace {

namespace fs = std::filesystem;

constexpr auto step_timeout = std::chrono::minutes{10};

template <class T, class Handle, class... Ts>
result<T> ask(caf::actor_system& sys, const Handle& whom, Ts&&... xs) {
  return ask_actor<T>(sys, whom, step_timeout, std::forward<Ts>(xs)...);
}

/// splitmix64: a deterministic stream for the elements a delta changes.
uint64_t mix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// Changes about one element in `stride` of every tensor of the checkpoint
/// in `dir`, in place, at positions drawn from (`phase`, tensor name) as an
/// RL step scatters its changes: the lowest bit of the element's least
/// significant byte flips, the smallest change a float can take, so the
/// model stays the model. `only`: change just the `only` smallest tensors
/// (0: every tensor), as a step that trains few of them. Memory: one buffer.
status perturb_directory(const fs::path& dir, uint32_t phase, uint32_t stride, size_t only = 0) {
  auto checkpoint = pipeline::open_hf_directory(dir);
  if (!checkpoint)
    return std::move(checkpoint).error();
  if (only > 0) {
    std::vector<std::pair<uint64_t, std::string>> by_size;
    for (const auto& [name, t] : checkpoint->tensors)
      if (t.size > 0)
        by_size.emplace_back(t.size, name);
    std::sort(by_size.begin(), by_size.end());
    std::map<std::string, pipeline::hf_tensor> kept;
    for (size_t i = 0; i < std::min(only, by_size.size()); ++i)
      kept.emplace(by_size[i].second, checkpoint->tensors.at(by_size[i].second));
    checkpoint->tensors = std::move(kept);
  }
  std::map<std::string, int> fds;
  struct closer {
    std::map<std::string, int>& fds;
    ~closer() {
      for (auto& [file, fd] : fds)
        ::close(fd);
    }
  } closing{fds};
  for (const auto& file : checkpoint->files) {
    const auto path = checkpoint->directory / file;
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
      return make_error(errc::backend_failure,
                        "opening " + path.string() + ": " + std::strerror(errno));
    fds[file] = fd;
  }
  std::vector<std::byte> buffer(size_t{8} << 20);
  const uint64_t spread = 2 * uint64_t{stride} - 1;
  for (const auto& [name, t] : checkpoint->tensors) {
    const int fd = fds.at(t.file);
    const uint64_t elem = std::max(1u, safetensors::bits_per_element(t.type) / 8);
    uint64_t state = std::hash<std::string>{}(name) ^ (uint64_t{phase} << 32);
    // Gaps between changed elements average `stride`.
    uint64_t next = mix(state) % spread * elem;
    const uint64_t chunk = std::max<uint64_t>(elem, buffer.size() / elem * elem);
    for (uint64_t at = 0; at < t.size && next < t.size; at += chunk) {
      const auto n = static_cast<size_t>(std::min(chunk, t.size - at));
      if (next >= at + n)
        continue;
      auto bytes = std::span{buffer}.first(n);
      if (auto ok = pipeline::read_file_range(fd, t.offset + at, bytes, t.file); !ok)
        return ok;
      for (; next < at + n; next += (1 + mix(state) % spread) * elem)
        bytes[next - at] ^= std::byte{1};
      if (auto ok = pipeline::write_file_range(fd, t.offset + at, bytes, t.file); !ok)
        return ok;
    }
  }
  return {};
}

/// One row of the profile.
struct profiled {
  std::string path;
  profile_step step;
  /// The last version published for it.
  pipeline::publish_report published;
};

std::string ref_text(const std::optional<version_ref>& ref) {
  return ref ? to_string(*ref) : std::string{"-"};
}

nlohmann::ordered_json to_json(const profiled& p) {
  const auto& s = p.step;
  nlohmann::ordered_json j;
  j["path"] = p.path;
  j["target"] = to_string(s.target);
  j["from"] = s.from ? nlohmann::ordered_json(to_string(*s.from)) : nlohmann::ordered_json(nullptr);
  j["activated"] = s.activated;
  j["run_switch"] = s.reset;
  j["folded"] = s.folded;
  j["preparation_s"] = s.stage_s;
  j["fetch_s"] = s.fetch_s;
  j["decode_s"] = s.decode_s;
  j["verify_s"] = s.verify_s;
  j["stage_s"] = s.rest_s;
  j["drain_ms"] = s.drain_ms;
  j["pause_us"] = s.pause_us;
  j["total_s"] = s.total_s;
  j["bytes_moved"] = s.bytes_from_store + s.bytes_from_peers;
  j["bytes_from_store"] = s.bytes_from_store;
  j["bytes_from_peers"] = s.bytes_from_peers;
  // How an engine that loads from files took the weights (none for the
  // built-in engine, which swaps them in memory).
  j["engine_load"] = s.load_kind.empty() ? nlohmann::ordered_json(nullptr)
                                         : nlohmann::ordered_json{{"kind", s.load_kind},
                                                                  {"seconds", s.load_s},
                                                                  {"tensors", s.load_tensors},
                                                                  {"bytes", s.load_bytes},
                                                                  {"detail", s.load_detail}};
  j["published"] = {{"kind", to_string(p.published.kind)},
                    {"touched", p.published.touched.size()},
                    {"stored_bytes", p.published.stored_bytes}};
  j["checksum_ok"] = s.checksum_ok;
  j["checksum_basis"] = s.checksum_basis;
  j["checksum_detail"] = s.checksum_detail;
  return j;
}

/// Two panels, one row per path: preparation (seconds, its phases stacked)
/// and the engine pause (microseconds), each on its own scale.
std::string render_chart(const std::string& title, const std::vector<profiled>& rows) {
  const int label_w = 150, panel_w = 300, gap = 40, row_h = 26, top = 56;
  const int width = label_w + 2 * panel_w + gap + 90;
  const int height = top + row_h * static_cast<int>(rows.size()) + 40;
  double max_prep = 0, max_pause = 0;
  for (const auto& r : rows) {
    max_prep = std::max(max_prep, r.step.stage_s);
    max_pause = std::max(max_pause, r.step.pause_us);
  }
  if (max_prep <= 0)
    max_prep = 1;
  if (max_pause <= 0)
    max_pause = 1;
  char buf[512];
  std::string svg;
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                "font-family=\"sans-serif\" font-size=\"12\">\n"
                "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                width, height);
  svg += buf;
  svg += "<text x=\"10\" y=\"20\" font-size=\"14\">" + transport::xml_escape(title) + "</text>\n";
  const int prep_x = label_w, pause_x = label_w + panel_w + gap;
  std::snprintf(buf, sizeof buf,
                "<text x=\"%d\" y=\"44\">preparation, s (fetch | decode | verify | stage)</text>\n"
                "<text x=\"%d\" y=\"44\">engine pause, us</text>\n",
                prep_x, pause_x);
  svg += buf;
  const char* colors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#bab0ac"};
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& s = rows[i].step;
    const int y = top + static_cast<int>(i) * row_h;
    svg += "<text x=\"10\" y=\"" + std::to_string(y + 15) + "\">"
           + transport::xml_escape(rows[i].path) + "</text>\n";
    double parts[] = {s.fetch_s, s.decode_s, s.verify_s, s.rest_s};
    double x = prep_x;
    for (int k = 0; k < 4; ++k) {
      const double w = parts[k] / max_prep * panel_w;
      if (w <= 0)
        continue;
      std::snprintf(buf, sizeof buf,
                    "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"18\" fill=\"%s\"/>\n", x, y,
                    w, colors[k]);
      svg += buf;
      x += w;
    }
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%d\">%.3f</text>\n", x + 4, y + 14,
                  s.stage_s);
    svg += buf;
    const double pw = s.pause_us / max_pause * panel_w;
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"18\" fill=\"#e15759\"/>\n"
                  "<text x=\"%.1f\" y=\"%d\">%.1f</text>\n",
                  pause_x, y, pw, pause_x + pw + 4, y + 14, s.pause_us);
    svg += buf;
  }
  svg += "</svg>\n";
  return svg;
}

void print_table(std::FILE* out, const std::vector<profiled>& rows) {
  std::fprintf(out, "%-18s %-36s %5s %9s %9s %9s %9s %9s %9s %10s %9s %10s %17s  %s\n", "path",
               "target", "fold", "prep s", "fetch s", "decode s", "verify s", "stage s", "drain ms",
               "pause us", "total s", "moved", "engine load", "checksum");
  for (const auto& r : rows) {
    const auto& s = r.step;
    char load[64] = "-";
    if (!s.load_kind.empty())
      std::snprintf(load, sizeof load, "%s %.4f s", s.load_kind.c_str(), s.load_s);
    std::fprintf(
      out, "%-18s %-36s %5llu %9.4f %9.4f %9.4f %9.4f %9.4f %9.3f %10.1f %9.4f %10s %17s  %s\n",
      r.path.c_str(), to_string(s.target).c_str(), static_cast<unsigned long long>(s.folded),
      s.stage_s, s.fetch_s, s.decode_s, s.verify_s, s.rest_s, s.drain_ms, s.pause_us, s.total_s,
      human_bytes(s.bytes_from_store + s.bytes_from_peers).c_str(), load,
      (std::string{s.checksum_ok ? "ok" : "FAILED"} + " (" + s.checksum_basis + ")").c_str());
  }
  // Partial and full engine loads side by side, with why each was chosen.
  for (const auto& r : rows)
    if (!r.step.load_kind.empty())
      std::fprintf(out, "  %-18s %s load, %llu tensors, %s: %s\n", r.path.c_str(),
                   r.step.load_kind.c_str(), static_cast<unsigned long long>(r.step.load_tensors),
                   human_bytes(r.step.load_bytes).c_str(), r.step.load_detail.c_str());
}

/// The scratch work of one profile: what it published and where it keeps
/// the copy of the weights.
class session {
public:
  session(caf::actor_system& sys, const profile_command& cmd, replica_actor replica,
          std::string pool, fs::path dir)
      : sys_(sys), cmd_(cmd), replica_(std::move(replica)), pool_(std::move(pool)),
        dir_(std::move(dir)) {}

  result<pipeline::publish_report> publish(const std::string& run, uint64_t version) {
    publish_command pub;
    pub.coordinator = cmd_.coordinator;
    pub.args.pool = pool_;
    pub.args.run_id = run;
    pub.args.version = version;
    pub.args.token = cmd_.token;
    pub.directory = dir_.string();
    return with_quiet_output([&](std::FILE* out) { return run_publish(sys_, pub, out); });
  }

  status change(uint32_t phase, size_t only = 0) {
    return perturb_directory(dir_, phase, cmd_.stride, only);
  }

  /// Publishes the directory as (run, version) and runs the
  /// replica's pass to it.
  result<profiled> step(std::string path, const std::string& run, uint64_t version) {
    auto published = publish(run, version);
    if (!published)
      return std::move(published).error();
    return await(std::move(path), {run, version}, std::move(*published));
  }

  result<profiled> await(std::string path, version_ref target, pipeline::publish_report published) {
    auto s = ask<profile_step>(sys_, replica_, atom::profile_v, target,
                               transport::member_capability(cmd_.token));
    if (!s)
      return make_error(s.error().code, path + ": " + s.error().message);
    return profiled{std::move(path), std::move(*s), std::move(published)};
  }

private:
  caf::actor_system& sys_;
  const profile_command& cmd_;
  replica_actor replica_;
  std::string pool_;
  fs::path dir_;
};

} // namespace

status run_profile(caf::actor_system& sys, const profile_command& cmd, std::FILE* out) {
  if (cmd.folded < 1 || cmd.folded > 6)
    return make_error(errc::invalid_argument,
                      "--folded must be 1..6 (the catch-up stays within the publisher's anchor "
                      "interval of 10 versions)");
  if (cmd.stride < 1)
    return make_error(errc::invalid_argument, "--stride must be at least 1");
  const std::string pool = "profile-" + cmd.replica;
  if (auto ok = validate_pool(pool); !ok)
    return make_error(errc::invalid_argument,
                      "the scratch pool of replica '" + cmd.replica + "': " + ok.error().message);
  auto coordinator = connect_coordinator(sys, cmd.coordinator);
  if (!coordinator)
    return std::move(coordinator).error();
  auto replica = ask<replica_actor>(sys, *coordinator, atom::profile_v, cmd.replica, cmd.token);
  if (!replica)
    return std::move(replica).error();
  auto info = ask<replica_info>(sys, *replica, atom::server_info_v);
  if (!info)
    return std::move(info).error();
  if (!info->applied)
    return make_error(errc::engine_unavailable,
                      cmd.replica
                        + " serves no version yet: the profile's versions are copies "
                          "of the weights it serves");
  // Refused before any weights are copied (the replica checks again).
  if (info->ready && !cmd.take_out)
    return make_error(errc::conflict, in_rotation_refusal(*info));
  auto publisher_handle =
    ask<caf::actor>(sys, *coordinator, atom::lookup_v, std::string{"publisher"});
  if (!publisher_handle)
    return std::move(publisher_handle).error();
  auto publisher = caf::actor_cast<publisher_actor>(*publisher_handle);
  auto store_handle = ask<caf::actor>(sys, *coordinator, atom::lookup_v, std::string{"store"});
  if (!store_handle)
    return std::move(store_handle).error();
  remote_store store{sys, caf::actor_cast<store_actor>(*store_handle)};
  // What an earlier profile left in the scratch pool goes once this one has
  // moved the pointer off it.
  auto previous = store.read_pointer(pool);
  if (!previous)
    return std::move(previous).error();

  std::error_code ec;
  fs::path root = cmd.work_dir.empty()
                    ? fs::temp_directory_path() / ("stitch-profile-" + std::to_string(::getpid()))
                    : fs::path{cmd.work_dir};
  if (fs::exists(root / "weights", ec))
    return make_error(errc::invalid_argument, (root / "weights").string() + " exists already");
  fs::create_directories(root, ec);
  if (ec)
    return make_error(errc::backend_failure, "creating " + root.string() + ": " + ec.message());
  struct cleanup {
    fs::path root;
    bool owned;
    ~cleanup() {
      std::error_code ignored;
      fs::remove_all(owned ? root : root / "weights", ignored);
    }
  } cleaned{root, cmd.work_dir.empty()};
  const fs::path dir = root / "weights";

  export_command exp;
  exp.coordinator = cmd.coordinator;
  exp.pool = info->pool;
  exp.version = to_string(*info->applied);
  exp.out_dir = dir.string();
  exp.token = cmd.token;
  {
    auto exported =
      with_quiet_output([&](std::FILE* quiet) { return run_export(sys, exp, quiet); });
    if (!exported)
      return make_error(exported.error().code, "copying " + to_string(*info->applied)
                                                 + " for the profile: " + exported.error().message);
  }

  // The replica takes the capability derived from the admin token (a
  // replica's node may hold only that one).
  const auto cap = transport::member_capability(cmd.token);
  auto began = ask<replica_info>(sys, *replica, atom::profile_v, pool, cmd.take_out, cap);
  if (!began)
    return std::move(began).error();
  if (!cmd.json)
    std::fprintf(out, "%s follows scratch pool %s (out of rotation); its weights: %s of pool %s\n",
                 cmd.replica.c_str(), pool.c_str(), to_string(*info->applied).c_str(),
                 info->pool.c_str());

  // Runs named by the time, never the ones an earlier profile left.
  auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count();
  auto run_of = [&](const char* suffix) { return "profile-" + std::to_string(millis) + suffix; };
  while (
    *previous
    && ((*previous)->latest.run_id == run_of("-a") || (*previous)->latest.run_id == run_of("-b")))
    ++millis;
  const std::string run_a = run_of("-a"), run_b = run_of("-b");
  session s{sys, cmd, *replica, pool, dir};
  std::vector<profiled> rows;
  auto steps = [&]() -> status {
    auto add = [&](result<profiled> r) -> status {
      if (!r)
        return std::move(r).error();
      rows.push_back(std::move(*r));
      return {};
    };
    if (auto ok = add(s.step("cold start", run_a, 1)); !ok)
      return ok;
    uint32_t phase = 1;
    if (auto ok = s.change(phase++); !ok)
      return ok;
    if (auto ok = add(s.step("delta", run_a, 2)); !ok)
      return ok;
    // A step that changes two tensors: an engine that loads from files
    // can load just those (a partial reload), beside the full one above.
    if (auto ok = s.change(phase++, 2); !ok)
      return ok;
    if (auto ok = add(s.step("two-tensor delta", run_a, 3)); !ok)
      return ok;
    pipeline::publish_report last;
    uint64_t v = 3;
    for (uint32_t i = 0; i < cmd.folded; ++i) {
      if (auto ok = s.change(phase++); !ok)
        return ok;
      auto p = s.publish(run_a, ++v);
      if (!p)
        return std::move(p).error();
      last = std::move(*p);
    }
    if (auto ok = add(s.await("folded catch-up", {run_a, v}, std::move(last))); !ok)
      return ok;
    if (auto ok = add(s.step("empty delta", run_a, ++v)); !ok)
      return ok;
    if (auto ok = s.change(phase++); !ok)
      return ok;
    return add(s.step("run switch", run_b, 1));
  };
  auto outcome = steps();
  // Back to its own pool, whatever happened.
  auto back = ask<replica_info>(sys, *replica, atom::profile_v, atom::done_v, cap);
  std::vector<std::string> dropped{run_a};
  if (*previous)
    dropped.push_back((*previous)->latest.run_id);
  auto collected = ask<retention_report>(sys, publisher, atom::collect_v, pool, dropped, cmd.token);
  if (!outcome)
    return outcome;
  if (!back)
    return make_error(back.error().code,
                      "returning " + cmd.replica + " to its pool: " + back.error().message);

  nlohmann::ordered_json j;
  j["replica"] = cmd.replica;
  j["engine"] = info->engine;
  j["pool"] = info->pool;
  j["scratch_pool"] = pool;
  j["weights"] = to_string(*info->applied);
  j["folded"] = cmd.folded;
  j["stride"] = cmd.stride;
  auto& arr = j["steps"] = nlohmann::ordered_json::array();
  for (const auto& r : rows)
    arr.push_back(to_json(r));
  j["returned"] = {{"pool", back->pool},
                   {"ready", back->ready},
                   {"applied", ref_text(back->applied)},
                   {"reason", back->reason}};
  j["scratch_removed"] =
    collected ? nlohmann::ordered_json(collected->deleted.size()) : nlohmann::ordered_json(nullptr);
  const std::string text = j.dump(2);
  if (!cmd.out.empty()) {
    fs::path json_path{cmd.out};
    fs::path svg_path = json_path;
    svg_path.replace_extension(".svg");
    auto write = [](const fs::path& path, const std::string& content) -> status {
      std::ofstream file{path, std::ios::binary | std::ios::trunc};
      file << content;
      file.close();
      if (!file)
        return make_error(errc::backend_failure, "writing " + path.string() + " failed");
      return {};
    };
    if (auto ok = write(json_path, text + "\n"); !ok)
      return ok;
    if (auto ok =
          write(svg_path,
                render_chart("stitch profile: " + cmd.replica + " (" + info->engine + ")", rows));
        !ok)
      return ok;
  }
  if (cmd.json) {
    std::fprintf(out, "%s\n", text.c_str());
  } else {
    print_table(out, rows);
    std::fprintf(out, "%s is back in pool %s: %s at %s%s\n", cmd.replica.c_str(),
                 back->pool.c_str(), back->ready ? "in rotation" : "NOT in rotation",
                 ref_text(back->applied).c_str(),
                 back->ready ? "" : (" (" + back->reason + ")").c_str());
    if (!collected)
      std::fprintf(out, "the scratch runs were not removed: %s\n",
                   to_string(collected.error()).c_str());
  }
  return {};
}

} // namespace stitch::node
