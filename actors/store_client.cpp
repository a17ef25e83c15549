#include "actors/store_client.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "runtime/core/manifest.hpp"

namespace stitch {

remote_store::remote_store(caf::actor_system& sys, store_actor target,
                           std::chrono::milliseconds timeout)
    : sys_(sys), target_(std::move(target)), timeout_(timeout) {}

namespace {

/// Paces asking a `busy` store again (a full lane refused the request
/// before running any of it, so asking again is always safe): 5 ms,
/// doubling up to 200 ms, while the call's time lasts.
class busy_backoff {
public:
  explicit busy_backoff(std::chrono::milliseconds budget)
      : until_(std::chrono::steady_clock::now() + budget) {}

  /// Sleeps and says yes when `e` is `busy` and time is left for another try.
  bool wait(const error& e) {
    if (e.code != errc::busy || std::chrono::steady_clock::now() + pause_ > until_)
      return false;
    std::this_thread::sleep_for(pause_);
    pause_ = std::min(pause_ * 2, max_pause);
    return true;
  }

private:
  static constexpr std::chrono::milliseconds max_pause{200};
  std::chrono::steady_clock::time_point until_;
  std::chrono::milliseconds pause_{5};
};

} // namespace

template <class T, class... Ts>
result<T> remote_store::call(const Ts&... xs) {
  caf::scoped_actor self{sys_};
  for (busy_backoff backoff{timeout_};;) {
    std::optional<result<T>> out;
    self->request(target_, caf::duration{timeout_}, xs...)
      .receive([&](T& value) { out.emplace(std::move(value)); },
               [&](caf::error& err) { out.emplace(from_caf_error(sys_, err)); });
    if (*out || !backoff.wait(out->error()))
      return std::move(*out);
  }
}

result<std::optional<pointer_record>> remote_store::read_pointer(std::string_view pool) {
  auto r = call<caf::optional<pointer_record>>(atom::read_pointer_v, std::string{pool});
  if (!r)
    return std::move(r).error();
  if (!*r)
    return std::optional<pointer_record>{};
  return std::optional<pointer_record>{**r};
}

result<pointer_record> remote_store::claim(std::string_view pool, const version_ref& boot) {
  return call<pointer_record>(atom::claim_v, std::string{pool}, boot, token_);
}

result<pointer_record> remote_store::compare_and_advance_pointer(
  std::string_view pool, const std::optional<version_ref>& expected, const version_ref& proposed) {
  caf::optional<version_ref> exp;
  if (expected)
    exp = *expected;
  return call<pointer_record>(atom::advance_v, std::string{pool}, exp, proposed, token_);
}

/// Streams an upload to the store actor with a window of chunks in flight.
class remote_store::writer final : public version_writer {
public:
  writer(caf::actor_system& sys, store_actor target, std::chrono::milliseconds timeout, uint64_t id)
      : self_(sys), sys_(sys), target_(std::move(target)), timeout_(timeout), id_(id) {}

  ~writer() override {
    if (!committed_)
      caf::anon_send(target_, atom::put_abort_v, id_);
  }

  status begin_shard(std::string_view name, uint64_t size) override {
    if (!buffer_.empty())
      if (auto ok = send_buffer(); !ok)
        return ok;
    if (auto ok = flush(0); !ok)
      return ok;
    pending_.push_back(self_->request(target_, caf::duration{timeout_}, atom::put_shard_v, id_,
                                      std::string{name}, size));
    return {};
  }

  status write(std::span<const std::byte> bytes) override {
    while (!bytes.empty()) {
      const size_t take = std::min<size_t>(bytes.size(), max_chunk_bytes - buffer_.size());
      buffer_.insert(buffer_.end(), reinterpret_cast<const char*>(bytes.data()),
                     reinterpret_cast<const char*>(bytes.data()) + take);
      bytes = bytes.subspan(take);
      if (buffer_.size() == max_chunk_bytes)
        if (auto ok = send_buffer(); !ok)
          return ok;
    }
    return {};
  }

  status add_file(std::string_view name, std::span<const std::byte> bytes) override {
    if (!buffer_.empty())
      if (auto ok = send_buffer(); !ok)
        return ok;
    if (auto ok = flush(0); !ok)
      return ok;
    std::vector<char> copy(reinterpret_cast<const char*>(bytes.data()),
                           reinterpret_cast<const char*>(bytes.data()) + bytes.size());
    std::optional<status> out;
    self_
      ->request(target_, caf::duration{timeout_}, atom::put_file_v, id_, std::string{name},
                std::move(copy))
      .receive([&](bool) { out.emplace(); },
               [&](caf::error& err) { out.emplace(from_caf_error(sys_, err)); });
    return std::move(*out);
  }

  status commit(const manifest& m) override {
    if (!buffer_.empty())
      if (auto ok = send_buffer(); !ok)
        return ok;
    if (auto ok = flush(0); !ok)
      return ok;
    committed_ = true;
    std::optional<status> out;
    self_->request(target_, caf::duration{timeout_}, atom::put_end_v, id_, m)
      .receive([&](bool) { out.emplace(); },
               [&](caf::error& err) { out.emplace(from_caf_error(sys_, err)); });
    return std::move(*out);
  }

private:
  using handle = decltype(std::declval<caf::scoped_actor&>()->request(
    std::declval<store_actor&>(), caf::duration{}, atom::put_chunk_v, uint64_t{},
    std::vector<char>{}));

  status send_buffer() {
    if (auto ok = flush(window - 1); !ok)
      return ok;
    chunks_.push_back(
      self_->request(target_, caf::duration{timeout_}, atom::put_chunk_v, id_, std::move(buffer_)));
    buffer_ = {};
    buffer_.reserve(max_chunk_bytes);
    return {};
  }

  /// Waits until at most `keep` chunks are in flight (and every shard start
  /// was answered).
  status flush(size_t keep) {
    status outcome;
    for (auto& p : pending_)
      p.receive([](bool) {}, [&](caf::error& err) { outcome = from_caf_error(sys_, err); });
    pending_.clear();
    while (chunks_.size() > keep) {
      chunks_.front().receive([](uint64_t) {},
                              [&](caf::error& err) { outcome = from_caf_error(sys_, err); });
      chunks_.pop_front();
    }
    return outcome;
  }

  caf::scoped_actor self_;
  caf::actor_system& sys_;
  store_actor target_;
  std::chrono::milliseconds timeout_;
  uint64_t id_;
  bool committed_ = false;
  std::vector<char> buffer_;
  std::deque<decltype(std::declval<caf::scoped_actor&>()->request(
    std::declval<store_actor&>(), caf::duration{}, atom::put_shard_v, uint64_t{}, std::string{},
    uint64_t{}))>
    pending_;
  std::deque<handle> chunks_;
};

result<std::unique_ptr<version_writer>> remote_store::begin_version(std::string_view pool,
                                                                    const version_ref& ref) {
  auto id = call<uint64_t>(atom::put_begin_v, std::string{pool}, ref, token_);
  if (!id)
    return std::move(id).error();
  return std::unique_ptr<version_writer>{std::make_unique<writer>(sys_, target_, timeout_, *id)};
}

result<manifest> remote_store::read_manifest(std::string_view pool, const version_ref& ref) {
  auto m = call<manifest>(atom::read_manifest_v, std::string{pool}, ref);
  if (!m)
    return m;
  // From another node: checked like any input.
  if (auto ok = validate(*m); !ok)
    return make_error(errc::corrupt_data,
                      "manifest of " + to_string(ref) + " from the store: " + ok.error().message);
  if (m->ref != ref)
    return make_error(errc::corrupt_data, "the store answered the manifest of " + to_string(m->ref)
                                            + " for " + to_string(ref));
  return m;
}

status remote_store::read_range(std::string_view pool, const version_ref& ref,
                                std::string_view tensor, uint64_t offset,
                                std::span<std::byte> out) {
  caf::scoped_actor self{sys_};
  using handle = decltype(self->request(target_, caf::duration{timeout_}, atom::read_range_v,
                                        std::string{}, ref, std::string{}, uint64_t{}, uint64_t{}));
  struct flight {
    handle h;
    size_t at;
    size_t len;
  };
  std::deque<flight> flights;
  status outcome;
  auto ask = [&](size_t at, size_t len) {
    return self->request(target_, caf::duration{timeout_}, atom::read_range_v, std::string{pool},
                         ref, std::string{tensor}, offset + at, uint64_t{len});
  };
  // A chunk the store was too busy to read is asked for again on its own
  // (the others stay in flight).
  auto land = [&](flight& f) {
    for (busy_backoff backoff{timeout_};;) {
      std::optional<error> refused;
      f.h.receive(
        [&](const shared_piece& bytes) {
          if (!outcome)
            return;
          if (bytes.size != f.len) {
            outcome =
              make_error(errc::corrupt_data, "the store answered " + std::to_string(bytes.size)
                                               + " bytes for a read of " + std::to_string(f.len));
            return;
          }
          if (f.len > 0)
            std::memcpy(out.data() + f.at, bytes.data, f.len);
        },
        [&](caf::error& err) {
          if (outcome)
            refused = from_caf_error(sys_, err);
        });
      if (!refused)
        return;
      if (!backoff.wait(*refused)) {
        outcome = std::move(*refused);
        return;
      }
      f.h = ask(f.at, f.len);
    }
  };
  size_t next = 0;
  while ((next < out.size() || !flights.empty()) && outcome) {
    while (next < out.size() && flights.size() < read_window) {
      const size_t len = std::min<uint64_t>(out.size() - next, read_chunk_bytes);
      flights.push_back({ask(next, len), next, len});
      next += len;
    }
    land(flights.front());
    flights.pop_front();
  }
  // Answers still in flight after a failure are drained (and dropped).
  for (auto& f : flights)
    land(f);
  return outcome;
}

result<std::vector<version_ref>> remote_store::list_versions(std::string_view pool,
                                                             std::string_view run_id) {
  return call<std::vector<version_ref>>(atom::list_v, std::string{pool}, std::string{run_id});
}

result<std::vector<std::string>> remote_store::list_pools() {
  return pools_of({});
}

result<std::vector<std::string>> remote_store::pools_of(std::string_view run) {
  return call<std::vector<std::string>>(atom::list_pools_v, std::string{run});
}

status remote_store::export_to(std::string_view pool, const version_ref& ref,
                               const std::string& path, bool sync, const std::string& token) {
  auto done = call<bool>(atom::export_to_v, std::string{pool}, ref, path, sync, token);
  if (!done)
    return std::move(done).error();
  return {};
}

result<retention_report> remote_store::retain(std::string_view pool,
                                              const retention_request& request) {
  return call<retention_report>(atom::retain_v, std::string{pool}, request, token_);
}

} // namespace stitch
