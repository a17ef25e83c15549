#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "gpu/device_memory.hpp"
#include "runtime/core/error.hpp"

namespace stitch::gpu {

/// The staging pipeline of a replica on a device: bytes that arrived in host
/// memory are copied to the device in chunks on a copy stream of its own, so
/// the engine keeps computing on its stream meanwhile; delta pieces are
/// applied there by kernels (`xor` into the shadow, `overwrite` copied over
/// it). Pieces whose host memory is reused at once (a decoder's scratch) go
/// through a ring of pinned chunks, each reused only after the device is done
/// with it, so filling the next chunk overlaps the copy of the last; bytes
/// that stay put until `finish` (a staged tensor) are copied straight from
/// where they lie. On `host_device` every operation happens at once.
/// Thread-safe: the engine's patch workers share one stager.
class device_stager {
public:
  struct options {
    /// Size of one ring chunk and of the largest single copy.
    size_t chunk_bytes = size_t{8} << 20;
    /// Chunks in the ring: how many copies can be in flight, and how many
    /// threads can fill chunks at once.
    size_t ring = 4;
    /// Runs the ring on `host_device` too (the CPU stand-in otherwise copies
    /// at once), so that the pipeline itself is tested without a GPU.
    bool ring_on_host = false;
  };

  struct counters {
    uint64_t bytes_copied = 0;
    uint64_t bytes_xored = 0;
    uint64_t bytes_verified = 0;
    /// Seconds from the first operation after a `finish` to that `finish`,
    /// summed: the time the pipeline was busy.
    double busy_seconds = 0;
  };

  static result<std::unique_ptr<device_stager>> create(int device);
  static result<std::unique_ptr<device_stager>> create(int device, options opts);
  ~device_stager();
  device_stager(const device_stager&) = delete;
  device_stager& operator=(const device_stager&) = delete;

  int device() const noexcept { return device_; }

  /// `dst[offset ..] = src` (a whole tensor, or an `overwrite` piece). With
  /// `stable`, `src` stays valid and unchanged until `finish` and is copied
  /// from where it lies; otherwise it may be reused when this returns.
  status write(const device_buffer& dst, size_t offset, std::span<const std::byte> src,
               bool stable = false);
  /// `dst[offset ..] ^= src` (an `xor` piece); `src` may be reused when this returns.
  status xor_apply(const device_buffer& dst, size_t offset, std::span<const std::byte> src);
  /// `dst = src`, on the device (a delta's base, before its pieces).
  status copy(const device_buffer& dst, const device_buffer& src);
  /// Waits for everything queued; the first error of any operation since the
  /// last `finish` (later operations after an error are skipped).
  status finish();
  /// The DESIGN §1 checksum of the first `n` bytes of `buffer`, after
  /// everything queued before it.
  result<uint64_t> checksum(const device_buffer& buffer, size_t n);

  /// Never waits for device work (status reads it on an actor's thread).
  counters stats() const;

private:
  struct slot {
    pinned_buffer host;
    device_buffer scratch;
    device_event done;
    /// The device has been given work with it (`done` was recorded).
    bool used = false;
    /// A thread is filling it, outside the lock.
    bool filling = false;
  };

  device_stager(int device, options opts) : device_(device), opts_(opts) {}
  /// A slot no other thread is filling, waiting for one; marks it filling.
  slot& claim_slot(std::unique_lock<std::mutex>& lock);
  status piecewise(std::unique_lock<std::mutex>& lock, const device_buffer& dst, size_t offset,
                   std::span<const std::byte> src, bool xor_into);
  void started();
  void add(uint64_t counters::*field, uint64_t n);
  status remember(status s);

  int device_;
  options opts_;
  mutable std::mutex mutex_;
  device_stream stream_;
  std::vector<slot> ring_;
  size_t next_ = 0;
  /// Signalled when a slot stops filling and when `fillers_` drops to 0.
  std::condition_variable slot_free_;
  /// Threads inside `piecewise`: `finish` waits for them.
  size_t fillers_ = 0;
  status first_error_;
  /// Apart from `mutex_`, so that `stats` never waits for device work.
  mutable std::mutex counters_mutex_;
  counters counters_;
  bool busy_ = false;
  double busy_since_ = 0;
};

} // namespace stitch::gpu
