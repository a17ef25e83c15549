#include "gpu/stager.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "gpu/checksum.hpp"

namespace stitch::gpu {

namespace {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

} // namespace

result<std::unique_ptr<device_stager>> device_stager::create(int device) {
  return create(device, options{});
}

result<std::unique_ptr<device_stager>> device_stager::create(int device, options opts) {
  if (opts.chunk_bytes == 0 || opts.ring == 0)
    return make_error(errc::invalid_argument, "a staging ring needs chunks of some size");
  std::unique_ptr<device_stager> s{new device_stager(device, opts)};
  auto stream = device_stream::create(device);
  if (!stream)
    return std::move(stream).error();
  s->stream_ = std::move(*stream);
  if (device != host_device || opts.ring_on_host) {
    s->ring_.resize(opts.ring);
    for (auto& sl : s->ring_) {
      auto host = pinned_buffer::allocate(device, opts.chunk_bytes);
      if (!host)
        return std::move(host).error();
      auto scratch = device_buffer::allocate(device, opts.chunk_bytes);
      if (!scratch)
        return std::move(scratch).error();
      auto ev = device_event::create(device);
      if (!ev)
        return std::move(ev).error();
      sl.host = std::move(*host);
      sl.scratch = std::move(*scratch);
      sl.done = std::move(*ev);
    }
  }
  return s;
}

device_stager::~device_stager() {
  (void) stream_.synchronize();
}

void device_stager::started() {
  if (!busy_) {
    busy_ = true;
    busy_since_ = now_seconds();
  }
}

status device_stager::remember(status s) {
  if (!s && first_error_)
    first_error_ = s;
  return s;
}

device_stager::slot& device_stager::claim_slot(std::unique_lock<std::mutex>& lock) {
  for (;;) {
    for (size_t i = 0; i < ring_.size(); ++i) {
      slot& sl = ring_[(next_ + i) % ring_.size()];
      if (!sl.filling) {
        next_ = (next_ + i + 1) % ring_.size();
        sl.filling = true;
        return sl;
      }
    }
    slot_free_.wait(lock);
  }
}

status device_stager::piecewise(std::unique_lock<std::mutex>& lock, const device_buffer& dst,
                                size_t offset, std::span<const std::byte> src, bool xor_into) {
  // Each chunk is filled outside the lock, so the engine's patch workers
  // fill chunks side by side; the device work is queued under it.
  ++fillers_;
  status out;
  for (size_t done = 0; done < src.size() && first_error_;) {
    const size_t n = std::min(opts_.chunk_bytes, src.size() - done);
    slot& sl = claim_slot(lock);
    lock.unlock();
    // The slot's last use must be over before its host chunk is refilled.
    status ok = sl.used ? sl.done.synchronize() : status{};
    auto host = sl.host.bytes().first(n);
    if (ok)
      parallel_copy(host, src.subspan(done, n));
    lock.lock();
    if (ok && first_error_) {
      ok = xor_into ? copy_to_device(sl.scratch, 0, host, stream_) : status{};
      if (ok)
        ok = xor_into ? xor_on_device(dst, offset + done, sl.scratch, 0, n, stream_)
                      : copy_to_device(dst, offset + done, host, stream_);
      if (ok)
        ok = sl.done.record(stream_);
      sl.used = true;
    }
    sl.filling = false;
    slot_free_.notify_all();
    if (!ok) {
      out = remember(ok);
      break;
    }
    done += n;
  }
  if (--fillers_ == 0)
    slot_free_.notify_all();
  return out ? first_error_ : out;
}

status device_stager::write(const device_buffer& dst, size_t offset, std::span<const std::byte> src,
                            bool stable) {
  std::unique_lock lock{mutex_};
  if (!first_error_)
    return first_error_;
  started();
  add(&counters::bytes_copied, src.size());
  if (ring_.empty() || stable)
    return remember(copy_to_device(dst, offset, src, stream_));
  return piecewise(lock, dst, offset, src, false);
}

status device_stager::xor_apply(const device_buffer& dst, size_t offset,
                                std::span<const std::byte> src) {
  std::unique_lock lock{mutex_};
  if (!first_error_)
    return first_error_;
  started();
  add(&counters::bytes_xored, src.size());
  if (!ring_.empty())
    return piecewise(lock, dst, offset, src, true);
  if (offset > dst.size() || src.size() > dst.size() - offset)
    return remember(make_error(errc::invalid_argument, "xor piece outside the tensor"));
  return remember(parallel_xor_apply(dst.host_bytes().subspan(offset, src.size()), src));
}

status device_stager::copy(const device_buffer& dst, const device_buffer& src) {
  std::lock_guard guard{mutex_};
  if (!first_error_)
    return first_error_;
  started();
  if (dst.size() != src.size())
    return remember(
      make_error(errc::invalid_argument, "device copy of " + std::to_string(src.size())
                                           + " bytes into " + std::to_string(dst.size())));
  add(&counters::bytes_copied, src.size());
  return remember(copy_on_device(dst, 0, src, 0, src.size(), stream_));
}

status device_stager::finish() {
  std::unique_lock lock{mutex_};
  slot_free_.wait(lock, [this] { return fillers_ == 0; });
  status synced = stream_.synchronize();
  if (busy_) {
    std::lock_guard counting{counters_mutex_};
    counters_.busy_seconds += now_seconds() - busy_since_;
    busy_ = false;
  }
  status out = first_error_ ? synced : first_error_;
  first_error_ = {};
  return out;
}

result<uint64_t> device_stager::checksum(const device_buffer& buffer, size_t n) {
  std::lock_guard guard{mutex_};
  if (!first_error_)
    return first_error_.error();
  started();
  add(&counters::bytes_verified, n);
  auto sum = device_tree_checksum(buffer, 0, n, stream_);
  if (!sum)
    (void) remember(sum.error());
  return sum;
}

void device_stager::add(uint64_t counters::*field, uint64_t n) {
  std::lock_guard counting{counters_mutex_};
  counters_.*field += n;
}

device_stager::counters device_stager::stats() const {
  std::lock_guard counting{counters_mutex_};
  return counters_;
}

} // namespace stitch::gpu
