#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/admission_gate.hpp"
#include "runtime/core/chain_planner.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/manifest.hpp"
#include "runtime/core/transfer_port.hpp"

namespace stitch {

struct sampling_params {
  double temperature = 1.0;
  double top_p = 1.0;
  /// 0 = no top-k cut.
  uint32_t top_k = 0;
  uint32_t max_new_tokens = 128;
  std::vector<std::string> stop;
  std::optional<uint64_t> seed;
};

struct generation_request {
  request_id id = 0;
  std::string prompt;
  sampling_params sampling;
  bool return_logprob = false;
};

enum class finish_reason : uint8_t { stop, length, abort };

/// Generated tokens `first_token..last_token` (indices into the output,
/// inclusive) came from weights of `version` (SGLang's
/// `weight_version_spans`): a generation crossing an in_place activation
/// has several.
struct version_span {
  uint64_t version = 0;
  uint32_t first_token = 0;
  uint32_t last_token = 0;

  friend bool operator==(const version_span&, const version_span&) = default;
};

struct generation_result {
  std::vector<int32_t> tokens;
  std::string text;
  /// Log-probabilities of the sampled tokens (when asked for).
  std::vector<float> logprobs;
  finish_reason finish = finish_reason::stop;
  uint32_t prompt_tokens = 0;
  /// Which version produced which tokens, in order (empty when the engine
  /// cannot say).
  std::vector<version_span> spans;
};

/// Where staged tensor bytes come from. `read` fills `out` from the store's
/// stored bytes of `tensor` of a version at `offset` (anchor bytes or delta
/// frames); `peers`, when there are any, fetches a version's full tensors
/// from replicas that hold it (the transfer port), and whatever they could
/// not give is built from the stored bytes.
class tensor_source {
public:
  virtual ~tensor_source() = default;
  virtual result<manifest> manifest_of(const version_ref& ref) = 0;
  virtual status read(const version_ref& ref, std::string_view tensor, uint64_t offset,
                      std::span<std::byte> out) = 0;
  /// The peer transfer, or null (no transport, or store-only).
  virtual transfer* peers() { return nullptr; }
};

/// An HTTP-level call a replica hands its engine: a versioned route's body
/// (constraint removed, `stamp_request` applied) or a pass-through route.
struct engine_call {
  request_id id = 0;
  /// Unique across replicas: response ids are made from it.
  std::string tag;
  std::string method = "POST";
  std::string route;
  std::string body;
};

struct engine_reply {
  uint16_t status = 200;
  std::string content_type = "application/json";
  /// The whole response body; for a stream, the last event's JSON object
  /// (the host stamps it, then sends it).
  std::string body;
  bool stream = false;
  /// Versioned routes: "stop", "length" or "abort".
  std::string finish_reason;
  /// The version that made the last token, from an engine that reports
  /// spans: an activation can land between the engine's last step and the
  /// host hearing of it, and the end stamp is then no earlier than this.
  std::optional<uint64_t> last_token_version;
};

/// Receives a stream's events before the last, each one JSON object.
using event_sink = std::function<void(std::string event)>;

struct engine_health {
  bool healthy = false;
  std::string detail;
};

/// How an engine loaded the weights of its last activation (`stitch
/// profile`): an engine that loads a version from files (an external one)
/// either reloads every tensor or only those the version's deltas changed.
struct engine_load_report {
  /// "partial" (only `tensors` were loaded) or "full".
  std::string kind;
  /// Why a full load was chosen, or how the partial one was verified.
  std::string detail;
  /// Tensors and bytes the engine was given, and the seconds its load and
  /// checks took (the pause included them).
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  double seconds = 0;
};

/// Where an engine computes and what it holds there (`/status` "device",
/// `/metrics`).
struct engine_device_usage {
  /// "cpu", or "cuda:N".
  std::string device = "cpu";
  /// "host", or the device's name ("NVIDIA H200").
  std::string name = "host";
  /// Bytes the engine holds on the device: weights served and staged, KV
  /// caches, activations, the staging ring (0 on the CPU).
  uint64_t memory_used = 0;
  uint64_t memory_total = 0;
  /// Bytes copied from host to device and applied there by stages, and the
  /// seconds the staging pipeline was busy with them.
  uint64_t staged_bytes_total = 0;
  double staging_seconds_total = 0;
  /// Host buffers of released versions that the process keeps for the next
  /// ones (`gpu::host_allocator`'s recycling; 0 where nothing recycles): the
  /// bytes kept now, and the bytes of allocations they served.
  uint64_t host_recycled_kept_bytes = 0;
  uint64_t host_recycled_bytes_total = 0;
};

/// The engine port (DESIGN §4). `stage` builds the target weights in a shadow
/// copy while the engine keeps serving; `commit` activates the shadow and is
/// the only step that pauses generation. Slow methods are called from worker
/// threads; implementations are thread-safe. Instances: `runtime/engine/`.
class engine_port {
public:
  virtual ~engine_port() = default;

  /// Warms whatever the plan will need (e.g. allocates the shadow).
  virtual status prefetch(const chain_plan& plan) = 0;
  /// Builds the plan's target into the shadow, verifying every touched
  /// tensor's checksum; a mismatch fails naming the tensor and leaves the
  /// serving weights untouched.
  virtual status stage(const chain_plan& plan, bool onto_shadow, tensor_source& source) = 0;
  /// Drops the shadow.
  virtual void discard_shadow() = 0;
  /// Activates the shadow (O(1) in model size). A failure leaves the engine
  /// in an uncertain state: the host must rebuild it.
  virtual status commit() = 0;
  virtual status pause() = 0;
  virtual status resume() = 0;
  virtual status flush_cache() = 0;
  /// Rebuilds the weights of `ref` from scratch (run switch, recovery).
  virtual status reset_to_boot(const version_ref& ref, tensor_source& source) = 0;
  /// Serves an HTTP-level call; blocking. Versioned routes generate (bad
  /// input is `invalid_argument` naming the field); streamed events go to
  /// `on_event` as they are produced. `cancelled` is polled between steps.
  virtual result<engine_reply> forward(const engine_call& call, const event_sink& on_event,
                                       const std::function<bool()>& cancelled) = 0;
  /// Generates; blocking. `cancelled` is polled between steps.
  virtual result<generation_result> generate(const generation_request& request,
                                             const std::function<bool()>& cancelled) = 0;
  /// Namespaces an engine request body for `route` by the version it is
  /// admitted on, so that no prefix/KV cache entry computed under other
  /// weights is reused (DESIGN §1 Caches follow versions): SGLang's
  /// `extra_key`. Bodies that are not JSON objects pass through.
  virtual std::string stamp_request(std::string_view route, std::string_view body,
                                    const version_ref& served) = 0;
  /// Adds the version stamps to an engine response body for `route`.
  virtual std::string stamp_response(std::string_view route, std::string_view body, const stamps& s,
                                     std::string_view run_id) = 0;
  virtual engine_health health() = 0;
  /// The served weights in host memory with their version, for peers to
  /// read (`transport/ucx_peer.hpp`); none when the engine cannot expose
  /// them (an external engine's weights live in its own process).
  virtual std::optional<host_weights> host_view() { return std::nullopt; }
  /// How the last activation's weights were loaded; none for an engine
  /// that swaps its weights in memory (the built-in one).
  virtual std::optional<engine_load_report> last_load() { return std::nullopt; }
  /// Where the engine computes (the CPU unless it says otherwise).
  virtual engine_device_usage device_usage() { return {}; }
  /// The served weights are also version `ref`: the versions after the
  /// served one change no weights, and the host advanced to `ref` without an
  /// activation. Tokens generated from now on are counted as `ref`
  /// (`weight_version_spans`, which must agree with the stamps), and peers
  /// are offered the weights as `ref`. Called on the host's thread: cheap.
  virtual void relabel(const version_ref& ref) { (void) ref; }
  /// Whether answers say which version produced each token
  /// (`weight_version_spans`); an engine that cannot say reports only the
  /// start and end stamps.
  virtual bool reports_version_spans() const { return false; }
  /// Why a client's pass-through `method route` may not reach the engine
  /// (403 RouteBlocked); nothing when it may. An external engine passes
  /// only the routes that serve inference or read-only model information
  /// (`runtime/core/engine_routes.hpp`), whatever it adds in later releases.
  virtual std::optional<std::string> route_refusal(std::string_view method,
                                                   std::string_view route) const = 0;
};

} // namespace stitch
