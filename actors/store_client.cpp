#include "actors/store_client.hpp"

#include <caf/all.hpp>

#include <cstring>

#include "runtime/core/manifest.hpp"

namespace stitch {

remote_store::remote_store(caf::actor_system& sys, store_actor target,
                           std::chrono::milliseconds timeout)
    : sys_(sys), target_(std::move(target)), timeout_(timeout) {}

template <class T, class... Ts>
result<T> remote_store::call(Ts&&... xs) {
  caf::scoped_actor self{sys_};
  std::optional<result<T>> out;
  self->request(target_, caf::duration{timeout_}, std::forward<Ts>(xs)...)
    .receive([&](T& value) { out.emplace(std::move(value)); },
             [&](caf::error& err) { out.emplace(from_caf_error(sys_, err)); });
  return std::move(*out);
}

result<std::optional<pointer_record>> remote_store::read_pointer(std::string_view pool) {
  auto r = call<pointer_reply>(atom::read_pointer_v, std::string{pool});
  if (!r)
    return std::move(r).error();
  if (!r->present)
    return std::optional<pointer_record>{};
  return std::optional<pointer_record>{r->record};
}

result<pointer_record> remote_store::claim(std::string_view pool, const version_ref& boot) {
  return call<pointer_record>(atom::claim_v, std::string{pool}, boot);
}

result<pointer_record> remote_store::compare_and_advance_pointer(
  std::string_view pool, const std::optional<version_ref>& expected, const version_ref& proposed) {
  pointer_reply exp;
  if (expected) {
    exp.present = true;
    exp.record.latest = *expected;
  }
  return call<pointer_record>(atom::advance_v, std::string{pool}, exp, proposed);
}

status remote_store::put_version(std::string_view pool, const manifest& m,
                                 std::span<const shard_upload> shards) {
  auto id = call<uint64_t>(atom::put_begin_v, std::string{pool}, to_json(m));
  if (!id)
    return std::move(id).error();
  std::vector<char> buf;
  for (const auto& s : shards) {
    if (!s.bytes)
      return make_error(errc::invalid_argument, "shard '" + s.name + "' has no bytes");
    for (;;) {
      buf.resize(max_chunk_bytes);
      auto n = s.bytes->read({reinterpret_cast<std::byte*>(buf.data()), buf.size()});
      if (!n)
        return std::move(n).error();
      if (*n == 0)
        break;
      buf.resize(*n);
      auto sent = call<uint64_t>(atom::put_chunk_v, *id, s.name, buf);
      if (!sent)
        return std::move(sent).error();
    }
  }
  auto done = call<bool>(atom::put_end_v, *id);
  if (!done)
    return std::move(done).error();
  return {};
}

result<manifest> remote_store::read_manifest(std::string_view pool, const version_ref& ref) {
  auto json = call<std::string>(atom::read_manifest_v, std::string{pool}, ref);
  if (!json)
    return std::move(json).error();
  auto m = parse_manifest(*json);
  if (!m)
    return make_error(errc::corrupt_data,
                      "manifest of " + to_string(ref) + " from the store: " + m.error().message);
  return m;
}

status remote_store::read_range(std::string_view pool, const version_ref& ref,
                                std::string_view tensor, uint64_t offset,
                                std::span<std::byte> out) {
  size_t done = 0;
  while (done < out.size()) {
    uint64_t len = std::min<uint64_t>(out.size() - done, max_chunk_bytes);
    auto bytes = call<std::vector<char>>(atom::read_range_v, std::string{pool}, ref,
                                         std::string{tensor}, offset + done, len);
    if (!bytes)
      return std::move(bytes).error();
    if (bytes->size() != len)
      return make_error(errc::corrupt_data, "the store answered " + std::to_string(bytes->size())
                                              + " bytes for a read of " + std::to_string(len));
    std::memcpy(out.data() + done, bytes->data(), len);
    done += len;
  }
  return {};
}

result<std::vector<version_ref>> remote_store::list_versions(std::string_view pool,
                                                             std::string_view run_id) {
  return call<std::vector<version_ref>>(atom::list_v, std::string{pool}, std::string{run_id});
}

result<retention_report> remote_store::retain(std::string_view pool, size_t keep_last) {
  caf::scoped_actor self{sys_};
  std::optional<result<retention_report>> out;
  self
    ->request(target_, caf::duration{timeout_}, atom::retain_v, std::string{pool},
              static_cast<uint64_t>(keep_last))
    .receive(
      [&](std::vector<version_ref>& deleted, std::vector<version_ref>& kept) {
        out.emplace(retention_report{std::move(deleted), std::move(kept)});
      },
      [&](caf::error& err) { out.emplace(from_caf_error(sys_, err)); });
  return std::move(*out);
}

} // namespace stitch
