#include "runtime/engine/device_fanout.hpp"

namespace stitch::engine {

device_fanout& device_fanout::instance() {
  static device_fanout fanout;
  return fanout;
}

void device_fanout::offer(const void* owner, const version_ref& ref, int gpu,
                          const std::shared_ptr<const device_weights>& weights) {
  if (!weights)
    return;
  std::lock_guard guard{mutex_};
  // What the owner offered before and dropped since goes.
  std::erase_if(offers_, [&](const auto& o) { return o.second.weights.expired(); });
  offers_[{owner, ref}] = offered{gpu, weights};
}

void device_fanout::withdraw(const void* owner) {
  std::lock_guard guard{mutex_};
  std::erase_if(offers_, [&](const auto& o) { return o.first.first == owner; });
  std::erase_if(staging_, [&](const auto& s) { return s.second == owner; });
  staged_.notify_all();
}

std::optional<device_fanout::holding> device_fanout::find_locked(const version_ref& ref,
                                                                 const void* asker) {
  for (const auto& [key, o] : offers_) {
    if (key.first == asker || key.second != ref)
      continue;
    if (auto w = o.weights.lock())
      return holding{o.gpu, std::move(w)};
  }
  return std::nullopt;
}

std::optional<device_fanout::holding> device_fanout::find(const version_ref& ref,
                                                          const void* asker) {
  std::lock_guard guard{mutex_};
  return find_locked(ref, asker);
}

std::optional<device_fanout::holding> device_fanout::join(const version_ref& ref, const void* asker,
                                                          std::chrono::milliseconds patience) {
  std::unique_lock lock{mutex_};
  if (auto h = find_locked(ref, asker))
    return h;
  auto other = staging_.find(ref);
  if (other == staging_.end() || other->second == asker) {
    staging_[ref] = asker;
    return std::nullopt;
  }
  staged_.wait_for(lock, patience, [&] { return !staging_.contains(ref); });
  return find_locked(ref, asker);
}

void device_fanout::staged(const void* owner, const version_ref& ref, int gpu,
                           const std::shared_ptr<const device_weights>& weights) {
  {
    std::lock_guard guard{mutex_};
    if (weights)
      offers_[{owner, ref}] = offered{gpu, weights};
    if (auto s = staging_.find(ref); s != staging_.end() && s->second == owner)
      staging_.erase(s);
  }
  staged_.notify_all();
}

result<std::shared_ptr<gpu::device_buffer>> device_fanout::take(const holding& from,
                                                                const std::string& name, int gpu) {
  auto it = from.weights->buffers.find(name);
  if (it == from.weights->buffers.end() || !it->second)
    return make_error(errc::not_found,
                      "GPU " + std::to_string(from.gpu) + " does not hold tensor '" + name + "'");
  const gpu::device_buffer& src = *it->second;
  auto made = gpu::device_buffer::allocate(gpu, src.size());
  if (!made)
    return std::move(made).error();
  auto dst = std::make_shared<gpu::device_buffer>(std::move(*made));
  if (from.gpu == gpu::host_device && gpu == gpu::host_device) {
    // Copies staged on the host (tests): the "broadcast" is a copy.
    auto stream = gpu::device_stream::create(gpu::host_device);
    if (!stream)
      return std::move(stream).error();
    if (auto ok = gpu::copy_on_device(*dst, 0, src, 0, src.size(), *stream); !ok)
      return std::move(ok).error();
    std::lock_guard guard{mutex_};
    bytes_taken_ += src.size();
    return dst;
  }
  // One broadcast at a time: a group's communicators are used in order.
  std::lock_guard serial{broadcast_mutex_};
  gpu::nccl_group* group = nullptr;
  {
    std::lock_guard guard{mutex_};
    auto key = std::make_pair(from.gpu, gpu);
    auto g = groups_.find(key);
    if (g == groups_.end()) {
      std::vector<int> devices{from.gpu};
      if (gpu != from.gpu)
        devices.push_back(gpu);
      auto created = gpu::nccl_group::create(devices);
      if (!created)
        return std::move(created).error();
      g = groups_.emplace(key, std::move(*created)).first;
    }
    group = g->second.get();
  }
  const gpu::device_buffer* targets[] = {dst.get()};
  if (auto ok = group->broadcast(0, src, targets); !ok)
    return std::move(ok).error();
  std::lock_guard guard{mutex_};
  bytes_taken_ += src.size();
  return dst;
}

uint64_t device_fanout::bytes_taken() const {
  std::lock_guard guard{mutex_};
  return bytes_taken_;
}

} // namespace stitch::engine
