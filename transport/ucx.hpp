#pragma once

// Weight bytes host to host over UCX (DESIGN §4 "Transfer"): RAII over UCP —
// a context, a worker with the thread that progresses it, registered memory
// regions a peer can read, and receiver-driven reads of a peer's region in
// chunks with a window in flight and a deadline. No CAF; `ucp.h` stays in
// the .cpp. Transport selection follows UCX's own conventions (`UCX_TLS`,
// `UCX_NET_DEVICES`), or `context_options::transports`.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"

namespace stitch::transport::ucx {

struct context_options {
  /// UCX's TLS list (`tcp`, `posix,self`, ...); empty: `UCX_TLS` or UCX's
  /// own choice.
  std::string transports;
};

/// A UCP context: what memory is registered with and workers are made from.
/// Thread-safe (its workers may live on different threads).
class context {
public:
  static result<std::shared_ptr<context>> create(const context_options& opts = {});
  ~context();
  context(const context&) = delete;
  context& operator=(const context&) = delete;

  /// The transports UCX may use, as configured (for `/status`).
  const std::string& transports() const noexcept { return transports_; }

  struct impl;
  impl& get() const noexcept { return *impl_; }

private:
  context() = default;
  std::unique_ptr<impl> impl_;
  std::string transports_;
};

/// Where a peer reads a region: its holder's worker address, the region's
/// address and size there, and the packed remote key.
struct region_descriptor {
  std::vector<std::byte> worker_address;
  uint64_t address = 0;
  uint64_t size = 0;
  std::vector<std::byte> rkey;

  /// A self-delimiting byte form (for pipes and tests; actors send the
  /// fields typed).
  std::vector<std::byte> encode() const;
  /// Reads `encode`'s form back; malformed input is `invalid_argument`.
  static result<region_descriptor> decode(std::span<const std::byte> bytes);
};

/// Memory registered with a context so that peers can read it (remote read
/// only: no peer is granted writes). The memory is the caller's and must
/// outlive the region.
class region {
public:
  static result<std::unique_ptr<region>> map(std::shared_ptr<context> ctx,
                                             std::span<const std::byte> bytes);
  ~region();
  region(const region&) = delete;
  region& operator=(const region&) = delete;

  std::span<const std::byte> bytes() const noexcept { return bytes_; }
  const std::vector<std::byte>& packed_rkey() const noexcept { return rkey_; }

private:
  region() = default;
  std::shared_ptr<context> ctx_;
  std::span<const std::byte> bytes_;
  void* memh_ = nullptr;
  std::vector<std::byte> rkey_;
};

struct read_options {
  /// Bytes per request.
  size_t chunk = size_t{1} << 20;
  /// Requests in flight.
  size_t window = 8;
  /// The read fails with `backend_failure` ("deadline") past this; its
  /// endpoint is closed so that nothing it started completes later.
  std::chrono::milliseconds deadline{30'000};
  /// Requests in flight of which none completes for this long are taken as
  /// lost (seen in CI: a get over TCP that never came back): the endpoint is
  /// replaced, up to `stall_retries` times, and what it had not delivered is
  /// asked again on the new one. A holder that died fails the new endpoint.
  std::chrono::milliseconds stall{5'000};
  size_t stall_retries = 2;
};

/// A UCP worker and the thread that progresses it. Every UCP call on the
/// worker and its endpoints runs on that thread (callers hand jobs over), so
/// a worker may be used from any thread. A holder's worker must live while
/// peers read its regions: over TCP, UCX serves their reads with messages
/// its thread answers.
class worker {
public:
  static result<std::unique_ptr<worker>> start(std::shared_ptr<context> ctx);
  /// A worker over a context of its own (`ctx()`).
  static result<std::unique_ptr<worker>> start(const context_options& opts);
  ~worker();
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  /// This worker's address, for descriptors of the regions it serves.
  const std::vector<std::byte>& address() const noexcept { return address_; }
  /// The context its regions are registered with.
  const std::shared_ptr<context>& ctx() const noexcept { return ctx_; }

  /// The descriptor of `r` served by this worker.
  region_descriptor describe(const region& r) const;

  /// Reads `out.size()` bytes of the peer's region at `offset` into `out`
  /// (UCP get, `opts.chunk` bytes per request, `opts.window` in flight).
  /// An unreachable or failed peer, a bad descriptor or the deadline is an
  /// error naming it; nothing is written to `out` after this returns.
  status read(const region_descriptor& from, uint64_t offset, std::span<std::byte> out,
              const read_options& opts = {});

  /// Endpoints replaced because their reads stalled (`read_options::stall`).
  uint64_t stalled_endpoints_replaced() const noexcept;

  struct impl;

private:
  worker() = default;
  std::shared_ptr<context> ctx_;
  std::vector<std::byte> address_;
  std::unique_ptr<impl> impl_;
};

} // namespace stitch::transport::ucx
