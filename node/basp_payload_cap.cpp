// CAF 0.17's BASP broker reads a 32-byte header, then allocates the payload
// length it declares and reads that much, before any handshake: one TCP
// client declaring 1 GiB made the node allocate it. This definition in the
// executables interposes on libcaf_io's `caf::io::basp::valid` (which the
// broker calls through the PLT on every header, before it reads a payload):
// a header whose payload is larger than a handshake needs (1 MiB: node ids
// and the published actor's interface), or than any message needs (256 MiB:
// byte payloads travel in chunks of at most `max_chunk_bytes`, 8 MiB; the
// largest control messages are manifests and peer offers of a model's
// tensors), is invalid, and CAF closes the connection without reading on.
//
// Compiled into `stitch-node` and `stitch` only (as `openssl_error_queue.cpp`).

#include <caf/io/basp/header.hpp>

#include <dlfcn.h>

#include <cstdint>

namespace {

constexpr uint64_t handshake_cap = uint64_t{1} << 20;
constexpr uint64_t payload_cap = uint64_t{256} << 20;

} // namespace

namespace caf::io::basp {

bool valid(const header& hdr) {
  using fn = bool (*)(const header&);
  static const fn next = [] {
    void* p = dlsym(RTLD_NEXT, "_ZN3caf2io4basp5validERKNS1_6headerE");
    fn f = nullptr;
    static_assert(sizeof(f) == sizeof(p));
    __builtin_memcpy(&f, &p, sizeof(f));
    return f;
  }();
  const uint64_t cap = is_handshake(hdr) ? handshake_cap : payload_cap;
  if (hdr.payload_len > cap)
    return false;
  return next != nullptr && next(hdr);
}

} // namespace caf::io::basp
