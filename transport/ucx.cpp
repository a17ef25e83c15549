#include "transport/ucx.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <pthread.h>
#include <thread>

namespace stitch::transport::ucx {

namespace {

stitch::error ucx_error(std::string what, ucs_status_t st) {
  return make_error(errc::backend_failure,
                    "ucx: " + std::move(what) + ": " + ucs_status_string(st));
}

/// Limits a decoded descriptor may not pass (a peer's bytes are input).
constexpr uint64_t max_address_bytes = 64 << 10;
constexpr uint64_t max_rkey_bytes = 64 << 10;

void put_u64(std::vector<std::byte>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
}

bool get_u64(std::span<const std::byte>& in, uint64_t& v) {
  if (in.size() < 8)
    return false;
  v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(in[static_cast<size_t>(i)]) << (8 * i);
  in = in.subspan(8);
  return true;
}

/// UCX logs to stdout by default, where a CLI prints its answer (`--json`):
/// its messages (an endpoint no transport can make, say) go to stderr.
ucs_log_func_rc_t log_to_stderr(const char* file, unsigned line, const char*, ucs_log_level_t level,
                                const ucs_log_component_config_t*, const char* message,
                                va_list ap) {
  char text[1024];
  std::vsnprintf(text, sizeof text, message, ap);
  const char* base = std::strrchr(file, '/');
  std::fprintf(stderr, "ucx %s (%s:%u): %s\n", ucs_log_level_names[level], base ? base + 1 : file,
               line, text);
  return UCS_LOG_FUNC_RC_STOP;
}

} // namespace

// -- context ------------------------------------------------------------------

struct context::impl {
  ucp_context_h handle = nullptr;
  ~impl() {
    if (handle)
      ucp_cleanup(handle);
  }
};

result<std::shared_ptr<context>> context::create(const context_options& opts) {
  static std::once_flag logging;
  std::call_once(logging, [] { ucs_log_push_handler(log_to_stderr); });
  ucp_config_t* config = nullptr;
  if (auto st = ucp_config_read(nullptr, nullptr, &config); st != UCS_OK)
    return ucx_error("reading the configuration", st);
  std::string tls = opts.transports;
  if (!tls.empty())
    if (auto st = ucp_config_modify(config, "TLS", tls.c_str()); st != UCS_OK) {
      ucp_config_release(config);
      return ucx_error("transports '" + tls + "'", st);
    }
  if (tls.empty()) {
    const char* env = std::getenv("UCX_TLS");
    tls = env ? env : "all";
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  // No UCP_FEATURE_WAKEUP: asking for it restricts UCX to transports that
  // signal events, which leaves shared-memory reads to TCP (1.2 instead of
  // 10 GB/s here). Workers poll instead (see `worker::impl::run`).
  params.features = UCP_FEATURE_RMA;
  params.mt_workers_shared = 1;
  std::shared_ptr<context> ctx{new context()};
  ctx->impl_ = std::make_unique<impl>();
  auto st = ucp_init(&params, config, &ctx->impl_->handle);
  ucp_config_release(config);
  if (st != UCS_OK) {
    ctx->impl_->handle = nullptr;
    return ucx_error("initialising UCP (transports '" + tls + "')", st);
  }
  ctx->transports_ = tls;
  return ctx;
}

context::~context() = default;

// -- descriptors ----------------------------------------------------------------

std::vector<std::byte> region_descriptor::encode() const {
  std::vector<std::byte> out;
  put_u64(out, worker_address.size());
  out.insert(out.end(), worker_address.begin(), worker_address.end());
  put_u64(out, address);
  put_u64(out, size);
  put_u64(out, rkey.size());
  out.insert(out.end(), rkey.begin(), rkey.end());
  return out;
}

result<region_descriptor> region_descriptor::decode(std::span<const std::byte> in) {
  auto bad = [](const char* what) {
    return make_error(errc::invalid_argument, std::string{"ucx region descriptor: "} + what);
  };
  region_descriptor d;
  uint64_t n = 0;
  if (!get_u64(in, n) || n == 0 || n > max_address_bytes || n > in.size())
    return bad("the worker address is missing or too long");
  d.worker_address.assign(in.begin(), in.begin() + static_cast<ptrdiff_t>(n));
  in = in.subspan(n);
  if (!get_u64(in, d.address) || !get_u64(in, d.size))
    return bad("the region's address or size is missing");
  if (!get_u64(in, n) || n == 0 || n > max_rkey_bytes || n > in.size())
    return bad("the remote key is missing or too long");
  d.rkey.assign(in.begin(), in.begin() + static_cast<ptrdiff_t>(n));
  in = in.subspan(n);
  if (!in.empty())
    return bad("trailing bytes");
  return d;
}

// -- regions ------------------------------------------------------------------

result<std::unique_ptr<region>> region::map(std::shared_ptr<context> ctx,
                                            std::span<const std::byte> bytes) {
  if (bytes.empty())
    return make_error(errc::invalid_argument, "ucx: an empty region cannot be registered");
  std::unique_ptr<region> r{new region()};
  r->ctx_ = std::move(ctx);
  r->bytes_ = bytes;
  ucp_mem_map_params_t params{};
  params.field_mask =
    UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_PROT;
  params.address = const_cast<std::byte*>(bytes.data());
  params.length = bytes.size();
  // Peers read a region, never write it (UCX's default grants remote writes
  // too). Transports with memory keys that carry access rights (InfiniBand,
  // RoCE) refuse a remote write; UCX 1.13's tcp and shared-memory transports
  // do not check, so receivers also verify every chunk by its digest.
  params.prot =
    UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE | UCP_MEM_MAP_PROT_REMOTE_READ;
  ucp_mem_h memh = nullptr;
  if (auto st = ucp_mem_map(r->ctx_->get().handle, &params, &memh); st != UCS_OK)
    return ucx_error("registering " + std::to_string(bytes.size()) + " bytes", st);
  r->memh_ = memh;
  void* packed = nullptr;
  size_t size = 0;
  if (auto st = ucp_rkey_pack(r->ctx_->get().handle, memh, &packed, &size); st != UCS_OK)
    return ucx_error("packing a remote key", st);
  auto* p = static_cast<const std::byte*>(packed);
  r->rkey_.assign(p, p + size);
  ucp_rkey_buffer_release(packed);
  return r;
}

region::~region() {
  if (memh_)
    ucp_mem_unmap(ctx_->get().handle, static_cast<ucp_mem_h>(memh_));
}

// -- worker -------------------------------------------------------------------

struct worker::impl {
  /// One read in flight on the progress thread.
  struct read_op {
    worker::impl* owner = nullptr;
    std::string peer;
    ucp_ep_h ep = nullptr;
    ucp_rkey_h rkey = nullptr;
    /// The packed key, unpacked again on a replacement endpoint.
    std::vector<std::byte> packed_rkey;
    uint64_t remote = 0;
    std::span<std::byte> out;
    size_t chunk = 0;
    size_t window = 0;
    size_t next = 0;
    size_t in_flight = 0;
    /// Ranges (offset, bytes) a replaced endpoint did not deliver: asked
    /// again before anything new.
    std::deque<std::pair<size_t, size_t>> redo;
    /// While its endpoint is being replaced: failed chunks go to `redo`.
    bool replacing = false;
    std::chrono::steady_clock::time_point last_progress;
    std::chrono::milliseconds stall{0};
    size_t stall_retries = 0;
    /// The first failure; success while none.
    status outcome;
    bool finished = false;
    std::promise<status> done;
  };
  /// One request of a read: which bytes it carries.
  struct chunk_request {
    read_op* op = nullptr;
    size_t at = 0;
    size_t bytes = 0;
  };
  struct endpoint {
    ucp_ep_h ep = nullptr;
    bool failed = false;
    std::string why;
  };

  ucp_worker_h handle = nullptr;
  int event_fd = -1;
  std::thread thread;
  std::mutex mutex;
  std::deque<std::function<void()>> jobs;
  bool stopping = false;
  // Progress-thread state.
  std::map<std::string, endpoint> endpoints;
  std::map<read_op*, std::shared_ptr<read_op>> reads;
  std::atomic<uint64_t> replaced{0};

  void post(std::function<void()> job) {
    {
      std::lock_guard lock{mutex};
      jobs.push_back(std::move(job));
    }
    uint64_t one = 1;
    (void) ::write(event_fd, &one, sizeof one);
  }

  static void on_peer_error(void* arg, ucp_ep_h ep, ucs_status_t st) {
    auto* self = static_cast<impl*>(arg);
    for (auto& [peer, e] : self->endpoints)
      if (e.ep == ep) {
        e.failed = true;
        e.why = ucs_status_string(st);
      }
  }

  result<ucp_ep_h> endpoint_for(const std::vector<std::byte>& address) {
    std::string key(reinterpret_cast<const char*>(address.data()), address.size());
    if (auto it = endpoints.find(key); it != endpoints.end() && !it->second.failed)
      return it->second.ep;
    // Failed endpoints (peers that died or left) go: the cache holds live
    // peers only, however many holders came and went.
    for (auto it = endpoints.begin(); it != endpoints.end();) {
      if (it->second.failed) {
        close(it->second.ep);
        it = endpoints.erase(it);
      } else {
        ++it;
      }
    }
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                        | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &impl::on_peer_error;
    params.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    if (auto st = ucp_ep_create(handle, &params, &ep); st != UCS_OK)
      return ucx_error("connecting to the peer", st);
    endpoints[key] = endpoint{ep, false, {}};
    return ep;
  }

  /// Force-closes `ep`: its outstanding requests complete with an error.
  void close(ucp_ep_h ep) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    auto req = ucp_ep_close_nbx(ep, &param);
    if (req == nullptr || UCS_PTR_IS_ERR(req))
      return;
    while (ucp_request_check_status(req) == UCS_INPROGRESS)
      ucp_worker_progress(handle);
    ucp_request_free(req);
  }

  static void on_chunk(void* request, ucs_status_t st, void* user_data) {
    std::unique_ptr<chunk_request> chunk{static_cast<chunk_request*>(user_data)};
    if (request)
      ucp_request_free(request);
    chunk->op->owner->chunk_done(*chunk, st);
  }

  void chunk_done(const chunk_request& chunk, ucs_status_t st) {
    auto* op = chunk.op;
    --op->in_flight;
    if (st == UCS_OK)
      op->last_progress = std::chrono::steady_clock::now();
    else if (op->replacing && op->outcome)
      op->redo.emplace_back(chunk.at, chunk.bytes);
    else if (op->outcome)
      op->outcome = ucx_error("reading from peer", st);
    if (!op->replacing)
      issue(op);
  }

  /// Asks for `n` bytes at `at` of `op`'s range; false once it failed.
  bool request(read_op* op, size_t at, size_t n) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &impl::on_chunk;
    auto chunk = std::make_unique<chunk_request>(chunk_request{op, at, n});
    param.user_data = chunk.get();
    auto req = ucp_get_nbx(op->ep, op->out.data() + at, n, op->remote + at, op->rkey, &param);
    if (UCS_PTR_IS_ERR(req)) {
      op->outcome = ucx_error("reading from peer", UCS_PTR_STATUS(req));
      return false;
    }
    if (req != nullptr) {
      chunk.release(); // the callback owns it now
      ++op->in_flight;
    }
    return true;
  }

  /// Keeps `op`'s window full; ends it when everything (or a failure) is in.
  void issue(read_op* op) {
    while (op->outcome && op->in_flight < op->window && !op->redo.empty()) {
      auto [at, n] = op->redo.front();
      op->redo.pop_front();
      if (!request(op, at, n))
        break;
    }
    while (op->outcome && op->in_flight < op->window && op->redo.empty()
           && op->next < op->out.size()) {
      const size_t n = std::min(op->chunk, op->out.size() - op->next);
      const size_t at = op->next;
      op->next += n;
      if (!request(op, at, n))
        break;
    }
    // Done when nothing is in flight: everything read, or a failure whose
    // outstanding chunks have all come back (nothing lands in `out` later).
    if (op->in_flight > 0 || op->finished)
      return;
    finish(op);
  }

  void finish(read_op* op) {
    op->finished = true;
    if (op->rkey)
      ucp_rkey_destroy(op->rkey);
    op->rkey = nullptr;
    op->done.set_value(op->outcome);
    reads.erase(op);
  }

  /// The deadline passed: the endpoint goes, its requests complete failed
  /// (so nothing lands in `out` later). Other reads on it move to a new
  /// endpoint (`keep_others`) or fail with it.
  void expire(read_op* op, bool keep_others = true) {
    if (op->finished)
      return;
    if (op->outcome)
      op->outcome =
        make_error(errc::backend_failure, "ucx: reading from peer: the deadline passed");
    op->next = op->out.size();
    op->redo.clear();
    auto it = endpoints.find(op->peer);
    if (it != endpoints.end() && it->second.ep == op->ep && keep_others) {
      replace_endpoint(op->ep, op->peer, false);
    } else if (it != endpoints.end()) {
      auto ep = it->second.ep;
      endpoints.erase(it);
      close(ep); // completes the outstanding chunks (each calls chunk_done)
    }
    if (!op->finished && op->in_flight == 0)
      finish(op);
  }

  /// Replaces the endpoint of the reads on `old` with a new one to the same
  /// peer: their requests still out complete failed and are asked again
  /// there. Reads whose key the new endpoint refuses fail.
  void replace_endpoint(ucp_ep_h old, const std::string& peer, bool stalled) {
    // Only `old` makes way: a newer endpoint to the peer already serves
    // other reads.
    if (auto it = endpoints.find(peer); it != endpoints.end() && it->second.ep == old)
      endpoints.erase(it);
    // Made for the first read that moves (none may: a read past its
    // deadline alone on `old` needs no new endpoint to a peer likely gone).
    std::optional<result<ucp_ep_h>> fresh;
    std::vector<read_op*> moved;
    std::vector<ucp_rkey_h> old_keys;
    for (auto& [raw, op] : reads) {
      // A read that failed already (one past its deadline) ends with the
      // old endpoint.
      if (op->ep != old || op->finished || !op->outcome)
        continue;
      old_keys.push_back(op->rkey);
      op->rkey = nullptr;
      op->replacing = true;
      op->last_progress = std::chrono::steady_clock::now();
      if (!fresh)
        fresh = endpoint_for(
          std::vector<std::byte>(reinterpret_cast<const std::byte*>(peer.data()),
                                 reinterpret_cast<const std::byte*>(peer.data()) + peer.size()));
      if (!*fresh) {
        op->outcome = fresh->error();
      } else {
        op->ep = **fresh;
        if (auto st = ucp_ep_rkey_unpack(op->ep, op->packed_rkey.data(), &op->rkey); st != UCS_OK) {
          op->rkey = nullptr;
          op->outcome = ucx_error("unpacking the peer's remote key", st);
        }
      }
      moved.push_back(raw);
    }
    close(old); // completes the outstanding requests (into each read's `redo`)
    for (auto key : old_keys)
      if (key)
        ucp_rkey_destroy(key);
    if (stalled && fresh && *fresh)
      ++replaced;
    for (auto* op : moved) {
      op->replacing = false;
      if (!op->outcome)
        op->next = op->out.size();
      issue(op);
    }
  }

  /// Reads none of whose requests came back for their `stall`: their
  /// endpoint is replaced while they have retries left.
  void check_stalls(std::chrono::steady_clock::time_point now) {
    for (auto& [raw, op] : reads) {
      if (op->finished || op->in_flight == 0 || op->stall_retries == 0
          || now - op->last_progress < op->stall)
        continue;
      --op->stall_retries;
      replace_endpoint(op->ep, op->peer, true);
      return; // `reads` may have changed
    }
  }

  void run() {
    pthread_setname_np(pthread_self(), "ucx-worker");
    using clock = std::chrono::steady_clock;
    auto last_activity = clock::now();
    auto last_stall_check = last_activity;
    for (;;) {
      std::deque<std::function<void()>> todo;
      bool stop = false;
      {
        std::lock_guard lock{mutex};
        todo.swap(jobs);
        stop = stopping;
      }
      for (auto& job : todo)
        job();
      if (stop)
        break;
      unsigned progressed = 0;
      while (ucp_worker_progress(handle) != 0)
        ++progressed;
      // Busy while bytes move: reads in flight, or peers' requests being
      // served (over TCP a holder answers every read). Idle, it polls
      // ever more slowly: within 2 ms of activity it spins, then every
      // millisecond, after 100 ms every 5; a posted job wakes it at once.
      const auto now = clock::now();
      if (!reads.empty() && now - last_stall_check >= std::chrono::milliseconds{50}) {
        last_stall_check = now;
        check_stalls(now);
      }
      if (progressed > 0 || !reads.empty() || !todo.empty()) {
        last_activity = now;
        continue;
      }
      const auto idle = now - last_activity;
      if (idle < std::chrono::milliseconds{2})
        continue;
      pollfd p{event_fd, POLLIN, 0};
      if (::poll(&p, 1, idle < std::chrono::milliseconds{100} ? 1 : 5) > 0) {
        uint64_t count;
        (void) ::read(event_fd, &count, sizeof count);
      }
    }
    // Reads still in flight end failed; endpoints close.
    for (auto& [raw, op] : std::map<read_op*, std::shared_ptr<read_op>>{reads})
      expire(raw, false);
    for (auto& [peer, e] : endpoints)
      close(e.ep);
    endpoints.clear();
  }
};

result<std::unique_ptr<worker>> worker::start(std::shared_ptr<context> ctx) {
  std::unique_ptr<worker> w{new worker()};
  w->ctx_ = std::move(ctx);
  w->impl_ = std::make_unique<impl>();
  auto& im = *w->impl_;
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (auto st = ucp_worker_create(w->ctx_->get().handle, &params, &im.handle); st != UCS_OK) {
    im.handle = nullptr;
    return ucx_error("creating a worker", st);
  }
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  if (auto st = ucp_worker_get_address(im.handle, &addr, &len); st != UCS_OK)
    return ucx_error("reading the worker's address", st);
  auto* p = reinterpret_cast<const std::byte*>(addr);
  w->address_.assign(p, p + len);
  ucp_worker_release_address(im.handle, addr);
  im.event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (im.event_fd < 0)
    return make_error(errc::backend_failure, "ucx: cannot create the worker's event descriptor");
  im.thread = std::thread{[&im] { im.run(); }};
  // A worker that cannot reach even its own process over a transport with
  // peer-failure handling (UCX 1.13 has it over TCP and InfiniBand, not
  // shared memory: a machine or chroot without a network device) reaches no
  // peer either: say so now, once, rather than at every fetch.
  std::array<std::byte, 8> probe{};
  std::array<std::byte, 8> echo{};
  auto mapped = region::map(w->ctx_, probe);
  if (!mapped)
    return std::move(mapped).error();
  read_options ro;
  ro.deadline = std::chrono::seconds{5};
  if (auto ok = w->read(w->describe(**mapped), 0, echo, ro); !ok)
    return make_error(errc::backend_failure, "ucx (" + w->ctx_->transports()
                                               + ") cannot reach even this process with "
                                                 "peer-failure handling: "
                                               + ok.error().message);
  return w;
}

result<std::unique_ptr<worker>> worker::start(const context_options& opts) {
  auto ctx = context::create(opts);
  if (!ctx)
    return std::move(ctx).error();
  return start(std::move(*ctx));
}

worker::~worker() {
  if (!impl_)
    return;
  auto& im = *impl_;
  if (im.thread.joinable()) {
    {
      std::lock_guard lock{im.mutex};
      im.stopping = true;
    }
    uint64_t one = 1;
    (void) ::write(im.event_fd, &one, sizeof one);
    im.thread.join();
  }
  if (im.handle)
    ucp_worker_destroy(im.handle);
  if (im.event_fd >= 0)
    ::close(im.event_fd);
}

uint64_t worker::stalled_endpoints_replaced() const noexcept {
  return impl_ ? impl_->replaced.load() : 0;
}

region_descriptor worker::describe(const region& r) const {
  region_descriptor d;
  d.worker_address = address_;
  d.address = reinterpret_cast<uint64_t>(r.bytes().data());
  d.size = r.bytes().size();
  d.rkey = r.packed_rkey();
  return d;
}

status worker::read(const region_descriptor& from, uint64_t offset, std::span<std::byte> out,
                    const read_options& opts) {
  if (out.empty())
    return {};
  if (offset > from.size || out.size() > from.size - offset)
    return make_error(errc::invalid_argument, "ucx: reading " + std::to_string(out.size())
                                                + " bytes at " + std::to_string(offset)
                                                + " of a region of " + std::to_string(from.size));
  if (from.worker_address.empty() || from.rkey.empty())
    return make_error(errc::invalid_argument, "ucx: the region descriptor names no peer or key");
  // UCX trusts a packed address: one this build did not make (its header
  // byte carries the format version) would abort the process in UCX.
  if (from.worker_address.size() < 9 || from.worker_address[0] != address_.front())
    return make_error(errc::invalid_argument,
                      "ucx: the peer's worker address is not in this UCX build's format");
  auto op = std::make_shared<impl::read_op>();
  op->owner = impl_.get();
  op->peer.assign(reinterpret_cast<const char*>(from.worker_address.data()),
                  from.worker_address.size());
  op->remote = from.address + offset;
  op->out = out;
  op->chunk = std::max<size_t>(opts.chunk, 1);
  op->window = std::max<size_t>(opts.window, 1);
  op->stall = std::max(opts.stall, std::chrono::milliseconds{1});
  op->stall_retries = opts.stall_retries;
  op->packed_rkey = from.rkey;
  auto result = op->done.get_future();
  auto rkey = from.rkey;
  auto address = from.worker_address;
  impl_->post([im = impl_.get(), op, rkey = std::move(rkey), address = std::move(address)] {
    auto ep = im->endpoint_for(address);
    if (!ep) {
      op->done.set_value(std::move(ep).error());
      return;
    }
    op->ep = *ep;
    if (auto st = ucp_ep_rkey_unpack(op->ep, rkey.data(), &op->rkey); st != UCS_OK) {
      op->rkey = nullptr;
      op->done.set_value(ucx_error("unpacking the peer's remote key", st));
      return;
    }
    op->last_progress = std::chrono::steady_clock::now();
    im->reads[op.get()] = op;
    im->issue(op.get());
  });
  if (result.wait_for(opts.deadline) == std::future_status::ready)
    return result.get();
  impl_->post([im = impl_.get(), op] {
    if (im->reads.contains(op.get()))
      im->expire(op.get());
  });
  return result.get();
}

} // namespace stitch::transport::ucx
