#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/core/error.hpp"

/// The CUDA calls behind `device_memory.hpp`, `stager.hpp` and `llama.hpp`:
/// implemented by the .cu files when the build has nvcc, and by
/// `device_memory.cpp` as `engine_unavailable` ("built without CUDA")
/// otherwise. Internal to gpu/: callers use the public headers.
namespace stitch::gpu::cuda {

int device_count() noexcept;
std::string device_name(int device);
status mem_info(int device, size_t& free, size_t& total);

status malloc(int device, size_t bytes, void** out);
void free(int device, void* ptr) noexcept;
status host_alloc(size_t bytes, void** out);
void host_free(void* ptr) noexcept;
status host_register(void* ptr, size_t bytes);
void host_unregister(void* ptr) noexcept;

status stream_create(int device, void** out);
void stream_destroy(void* stream) noexcept;
status stream_sync(void* stream);
status event_create(int device, void** out);
void event_destroy(void* event) noexcept;
status event_record(void* event, void* stream);
status event_sync(void* event);
/// Whether the work before the event is done (no wait).
result<bool> event_done(void* event);
result<double> event_elapsed_ms(void* start, void* end);
/// Makes `stream` wait for `event` (recorded on any stream of the device).
status stream_wait(void* stream, void* event);

/// `cudaMemcpyAsync` with `cudaMemcpyDefault` (unified addressing tells
/// the direction); `what` names the copy in errors.
status memcpy_async(void* dst, const void* src, size_t bytes, void* stream, const char* what);
/// `dst ^= delta` on `device` (the stream's; made current first, since a
/// kernel launched into another device's stream fails).
status xor_async(int device, void* dst, const void* delta, size_t bytes, void* stream);

/// The xxh3-64 of every 1 MiB chunk of `bytes` device bytes at `data` (8-byte
/// aligned) longer than 240 bytes, into `digests` (host, `chunk_count`
/// words); chunks of 240 bytes or less (only a tensor's last can be) are
/// left for the caller. Waits for `stream`.
status chunk_digests(const void* data, size_t bytes, uint64_t* digests, void* stream);

} // namespace stitch::gpu::cuda
