#pragma once

// A holder's offer as a typed message (`peer_offer`) and as the transport
// uses it (`transport::ucx::offer`).

#include "actors/replica_actor.hpp"
#include "transport/ucx_peer.hpp"

namespace stitch {

inline std::string bytes_to_string(const std::vector<std::byte>& b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

inline std::vector<std::byte> string_to_bytes(const std::string& s) {
  auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

inline peer_offer to_peer_offer(const transport::ucx::offer& o) {
  peer_offer out{o.source,  o.version,          bytes_to_string(o.worker_address), o.lease, {},
                 o.partial, o.progress_address, bytes_to_string(o.progress_rkey)};
  for (const auto& t : o.tensors)
    out.tensors.push_back(
      {t.name, t.address, t.size, bytes_to_string(t.rkey), t.leaves, t.progress_slot});
  return out;
}

inline transport::ucx::offer from_peer_offer(const peer_offer& o) {
  transport::ucx::offer out{
    o.source,  o.version,          string_to_bytes(o.worker_address), o.lease, {},
    o.partial, o.progress_address, string_to_bytes(o.progress_rkey)};
  for (const auto& t : o.tensors)
    out.tensors.push_back(
      {t.name, t.address, t.size, string_to_bytes(t.rkey), t.leaves, t.progress_slot});
  return out;
}

} // namespace stitch
