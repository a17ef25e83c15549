#include "runtime/core/store_port.hpp"

#include <algorithm>
#include <map>
#include <vector>

#include "runtime/core/checksum.hpp"

namespace stitch {

status put_version(store_backend& store, std::string_view pool, const manifest& m,
                   std::span<const shard_upload> shards,
                   const std::map<std::string, std::string>& files) {
  if (auto ok = validate(m); !ok)
    return ok;
  std::map<std::string, byte_source*> by_name;
  for (const auto& s : shards) {
    if (!s.bytes)
      return make_error(errc::invalid_argument,
                        "shard " + quote_untrusted(s.name) + " has no bytes");
    if (!by_name.emplace(s.name, s.bytes).second)
      return make_error(errc::invalid_argument,
                        "shard " + quote_untrusted(s.name) + " was given twice");
    if (std::find(m.shards.begin(), m.shards.end(), s.name) == m.shards.end())
      return make_error(errc::invalid_argument, "shard " + quote_untrusted(s.name)
                                                  + " is not listed in the manifest of "
                                                  + to_string(m.ref));
  }
  for (const auto& name : m.shards)
    if (!by_name.contains(name))
      return make_error(errc::invalid_argument,
                        "shard '" + name + "' of " + to_string(m.ref) + " was not uploaded");
  auto writer = store.begin_version(pool, m.ref);
  if (!writer)
    return std::move(writer).error();
  std::vector<std::byte> buffer(size_t{4} << 20);
  for (const auto& name : m.shards) {
    byte_source& src = *by_name.at(name);
    if (auto ok = (*writer)->begin_shard(name, src.size()); !ok)
      return ok;
    for (;;) {
      auto n = src.read(buffer);
      if (!n)
        return std::move(n).error();
      if (*n == 0)
        break;
      if (auto ok = (*writer)->write(std::span{buffer}.first(*n)); !ok)
        return ok;
    }
  }
  for (const auto& [name, bytes] : files)
    if (auto ok = (*writer)->add_file(name, std::as_bytes(std::span{bytes.data(), bytes.size()}));
        !ok)
      return ok;
  return (*writer)->commit(m);
}

result<std::string> read_version_file(store_backend& store, std::string_view pool,
                                      const manifest& m, std::string_view name) {
  return read_version_file(
    m, name,
    [&](const version_ref& ref, std::string_view key, uint64_t offset, std::span<std::byte> out) {
      return store.read_range(pool, ref, key, offset, out);
    });
}

result<std::string> read_version_file(
  const manifest& m, std::string_view name,
  const std::function<status(const version_ref&, std::string_view, uint64_t, std::span<std::byte>)>&
    read) {
  auto it = m.files.find(std::string{name});
  if (it == m.files.end())
    return make_error(errc::not_found,
                      to_string(m.ref) + " keeps no file " + quote_untrusted(name));
  const file_entry& entry = it->second;
  if (entry.size > max_version_file_bytes)
    return make_error(errc::limit_exceeded, "file " + quote_untrusted(name) + " of "
                                              + to_string(m.ref) + " is larger than the limit");
  std::string bytes(entry.size, '\0');
  if (auto ok = read(m.ref, file_location_key(name), 0, std::as_writable_bytes(std::span{bytes}));
      !ok)
    return std::move(ok).error();
  if (checksum::tree_checksum(std::as_bytes(std::span{bytes})) != entry.checksum)
    return make_error(errc::corrupt_data, "file " + quote_untrusted(name) + " of "
                                            + to_string(m.ref) + " does not match its checksum");
  return bytes;
}

} // namespace stitch
