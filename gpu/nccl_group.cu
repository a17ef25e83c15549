// CUDA side of gpu/nccl_group.hpp, with NCCL loaded at run time.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "gpu/cuda_check.cuh"
#include "gpu/dynamic_library.hpp"
#include "gpu/nccl_group.hpp"

namespace stitch::gpu {

namespace {

struct nccl_api {
  decltype(&ncclCommInitAll) init_all = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  std::string error;
};

const nccl_api& nccl() {
  static nccl_api api;
  static std::once_flag once;
  std::call_once(once, [] {
    auto lib = open_library("NCCL", "STITCH_NCCL", {"libnccl.so.2", "libnccl.so"});
    api.init_all = reinterpret_cast<decltype(api.init_all)>(lib.symbol("ncclCommInitAll"));
    api.destroy = reinterpret_cast<decltype(api.destroy)>(lib.symbol("ncclCommDestroy"));
    api.broadcast = reinterpret_cast<decltype(api.broadcast)>(lib.symbol("ncclBroadcast"));
    api.group_start = reinterpret_cast<decltype(api.group_start)>(lib.symbol("ncclGroupStart"));
    api.group_end = reinterpret_cast<decltype(api.group_end)>(lib.symbol("ncclGroupEnd"));
    api.error_string =
      reinterpret_cast<decltype(api.error_string)>(lib.symbol("ncclGetErrorString"));
    api.error = lib.error;
  });
  return api;
}

status nccl_check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess)
    return {};
  return make_error(errc::engine_unavailable,
                    std::string{"NCCL "} + what + " failed: " + nccl().error_string(r));
}

status cuda_check(cudaError_t err, const char* what) {
  return cuda::check(err, what);
}

} // namespace

struct nccl_group::impl {
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  std::mutex mutex;

  ~impl() {
    for (size_t i = 0; i < streams.size(); ++i) {
      cudaSetDevice(devices[i]);
      if (streams[i])
        cudaStreamDestroy(streams[i]);
    }
    for (auto c : comms)
      if (c)
        nccl().destroy(c);
  }
};

nccl_group::nccl_group(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
nccl_group::~nccl_group() = default;

const std::vector<int>& nccl_group::devices() const noexcept {
  return impl_->devices;
}

result<std::unique_ptr<nccl_group>> nccl_group::create(std::vector<int> devices) {
  if (devices.empty())
    return make_error(errc::invalid_argument, "an NCCL group needs at least one GPU");
  if (std::set<int>(devices.begin(), devices.end()).size() != devices.size())
    return make_error(errc::invalid_argument, "an NCCL group's GPUs must be distinct");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess)
    count = 0;
  cudaGetLastError();
  for (int d : devices)
    if (d < 0 || d >= count)
      return make_error(errc::engine_unavailable, "CUDA device " + std::to_string(d)
                                                    + " is not there (" + std::to_string(count)
                                                    + " visible)");
  const auto& api = nccl();
  if (!api.error.empty())
    return make_error(errc::engine_unavailable, api.error);
  auto p = std::make_unique<impl>();
  p->devices = std::move(devices);
  p->comms.assign(p->devices.size(), nullptr);
  if (auto ok = nccl_check(
        api.init_all(p->comms.data(), static_cast<int>(p->devices.size()), p->devices.data()),
        "ncclCommInitAll");
      !ok)
    return std::move(ok).error();
  p->streams.assign(p->devices.size(), nullptr);
  for (size_t i = 0; i < p->devices.size(); ++i) {
    if (auto ok = cuda_check(cudaSetDevice(p->devices[i]), "cudaSetDevice"); !ok)
      return std::move(ok).error();
    if (auto ok = cuda_check(cudaStreamCreateWithFlags(&p->streams[i], cudaStreamNonBlocking),
                             "cudaStreamCreate");
        !ok)
      return std::move(ok).error();
  }
  return std::unique_ptr<nccl_group>{new nccl_group(std::move(p))};
}

status nccl_group::broadcast(size_t root, const device_buffer& src,
                             std::span<const device_buffer* const> dst) {
  impl& g = *impl_;
  const size_t ranks = g.devices.size();
  if (root >= ranks)
    return make_error(errc::invalid_argument, "broadcast root outside the group");
  const size_t want = ranks == 1 ? 1 : ranks - 1;
  if (dst.size() != want)
    return make_error(errc::invalid_argument, "a broadcast over " + std::to_string(ranks)
                                                + " GPUs takes " + std::to_string(want)
                                                + " destination buffers");
  if (src.device() != g.devices[root])
    return make_error(errc::invalid_argument, "the broadcast's source is not on the root's GPU");
  std::vector<void*> recv(ranks, nullptr);
  size_t next = 0;
  for (size_t r = 0; r < ranks; ++r) {
    if (ranks > 1 && r == root) {
      recv[r] = src.data();
      continue;
    }
    const device_buffer* d = dst[next++];
    if (!d || d->size() != src.size() || d->device() != g.devices[r])
      return make_error(errc::invalid_argument,
                        "a broadcast destination has the wrong size or GPU");
    recv[r] = d->data();
  }
  if (src.size() == 0)
    return {};
  std::lock_guard guard{g.mutex};
  const auto& api = nccl();
  if (auto ok = nccl_check(api.group_start(), "ncclGroupStart"); !ok)
    return ok;
  status queued;
  for (size_t r = 0; r < ranks && queued; ++r) {
    cudaSetDevice(g.devices[r]);
    // Only the root's send buffer is read; the others pass their own.
    const void* send = r == root ? src.data() : recv[r];
    auto sent = nccl_check(api.broadcast(send, recv[r], src.size(), ncclUint8,
                                         static_cast<int>(root), g.comms[r], g.streams[r]),
                           "ncclBroadcast");
    if (!sent)
      queued = sent;
  }
  if (auto ok = nccl_check(api.group_end(), "ncclGroupEnd"); !ok && queued)
    queued = ok;
  if (!queued)
    return queued;
  for (size_t r = 0; r < ranks; ++r) {
    cudaSetDevice(g.devices[r]);
    if (auto ok = cuda_check(cudaStreamSynchronize(g.streams[r]), "the NCCL broadcast"); !ok)
      return ok;
  }
  return {};
}

} // namespace stitch::gpu
