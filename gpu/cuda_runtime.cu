// CUDA side of gpu/cuda_backend.hpp: the runtime calls, each error carrying
// CUDA's own text and the call that failed.
#include <cuda_runtime.h>

#include <string>

#include "gpu/cuda_backend.hpp"
#include "gpu/cuda_check.cuh"

namespace stitch::gpu::cuda {

namespace {

status on_device(int device, const char* call) {
  return check(cudaSetDevice(device), call);
}

} // namespace

int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "CUDA device " + std::to_string(device);
  }
  return prop.name;
}

status mem_info(int device, size_t& free, size_t& total) {
  if (auto ok = on_device(device, "cudaSetDevice"); !ok)
    return ok;
  return check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
}

status malloc(int device, size_t bytes, void** out) {
  if (auto ok = on_device(device, "cudaSetDevice"); !ok)
    return ok;
  cudaError_t err = cudaMalloc(out, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return make_error(errc::limit_exceeded, "CUDA device " + std::to_string(device) + " has no "
                                              + std::to_string(bytes)
                                              + " bytes free (cudaMalloc: out of memory)");
  }
  return check(err, "cudaMalloc");
}

void free(int device, void* ptr) noexcept {
  if (!ptr)
    return;
  cudaSetDevice(device);
  cudaFree(ptr);
}

status host_alloc(size_t bytes, void** out) {
  return check(cudaHostAlloc(out, bytes, cudaHostAllocPortable), "cudaHostAlloc");
}

void host_free(void* ptr) noexcept {
  if (ptr)
    cudaFreeHost(ptr);
}

status host_register(void* ptr, size_t bytes) {
  return check(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable), "cudaHostRegister");
}

void host_unregister(void* ptr) noexcept {
  if (cudaHostUnregister(ptr) != cudaSuccess)
    cudaGetLastError();
}

status stream_create(int device, void** out) {
  if (auto ok = on_device(device, "cudaSetDevice"); !ok)
    return ok;
  cudaStream_t s = nullptr;
  if (auto ok = check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
      !ok)
    return ok;
  *out = s;
  return {};
}

void stream_destroy(void* stream) noexcept {
  if (stream)
    cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

status stream_sync(void* stream) {
  return check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

status event_create(int device, void** out) {
  if (auto ok = on_device(device, "cudaSetDevice"); !ok)
    return ok;
  cudaEvent_t e = nullptr;
  if (auto ok = check(cudaEventCreate(&e), "cudaEventCreate"); !ok)
    return ok;
  *out = e;
  return {};
}

void event_destroy(void* event) noexcept {
  if (event)
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

status event_record(void* event, void* stream) {
  return check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
               "cudaEventRecord");
}

status event_sync(void* event) {
  return check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
}

result<bool> event_done(void* event) {
  cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  if (auto ok = check(err, "cudaEventQuery"); !ok)
    return std::move(ok).error();
  return true;
}

result<double> event_elapsed_ms(void* start, void* end) {
  float ms = 0;
  if (auto ok = check(
        cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)),
        "cudaEventElapsedTime");
      !ok)
    return std::move(ok).error();
  return static_cast<double>(ms);
}

status stream_wait(void* stream, void* event) {
  return check(
    cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
    "cudaStreamWaitEvent");
}

status memcpy_async(void* dst, const void* src, size_t bytes, void* stream, const char* what) {
  if (bytes == 0)
    return {};
  cudaError_t err =
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
  if (err == cudaSuccess)
    return {};
  cudaGetLastError();
  return make_error(errc::engine_unavailable, std::string{"CUDA "} + what + " of "
                                                + std::to_string(bytes)
                                                + " bytes failed: " + cudaGetErrorString(err));
}

} // namespace stitch::gpu::cuda
