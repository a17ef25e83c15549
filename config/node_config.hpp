#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/admission_gate.hpp"
#include "runtime/core/engine_kind.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/manifest.hpp"

namespace stitch::config {

/// `HOST:PORT`; port 0 picks a free one.
struct listen_address {
  std::string host;
  uint16_t port = 0;
  friend bool operator==(const listen_address&, const listen_address&) = default;
};

/// Parses `HOST:PORT` (`[::1]:PORT` for IPv6); an error quotes the text.
result<listen_address> parse_listen_address(std::string_view text);

/// Whether `host` names this machine only (`localhost`, `::1`, `127.*`).
bool is_loopback(std::string_view host);

/// How replicas fetch weights (`transfer.peers`): from peers that hold a
/// version over UCX, or from the store only.
enum class peer_transfer : uint8_t { ucx, off };

/// The roles a node can host (DESIGN §2).
inline constexpr std::string_view known_roles[] = {
  "coordinator", "store", "publisher", "replica", "gateway", "status", "trainer", "rollout_driver"};

/// A node's role config (DESIGN §2, §7): the TOML file, then
/// `STITCH_<SECTION>__<KEY>` environment variables, then `--set key=value`.
/// With no file the defaults are the single-machine all-in-one node.
struct node_config {
  std::string name = "local";
  std::filesystem::path data_dir = "./stitch-data";
  std::vector<std::string> roles = {"coordinator", "store",   "publisher",
                                    "replica",     "gateway", "status"};
  /// GPU slots this node offers for replicas (`gpus = [0, 1]`).
  std::vector<uint32_t> gpus;

  listen_address coordinator_listen{"127.0.0.1", 4242};
  /// Where a node without the coordinator accepts the other nodes' direct
  /// connections (the node mesh: gateways reach replicas, replicas reach
  /// each other, without passing through the hub). A wildcard host (0.0.0.0,
  /// ::) is advertised as the address the node reaches the coordinator from.
  listen_address cluster_listen{"127.0.0.1", 0};
  /// Plain (non-TLS) CAF listeners on addresses other machines reach are
  /// refused unless this is set: anyone who reaches them speaks the nodes'
  /// messages. Logged at start and shown in /status.
  bool cluster_insecure = false;
  /// The coordinator to join; empty: this node's own.
  std::string coordinator_address;
  /// Seconds without a heartbeat after which the coordinator removes a node
  /// (nodes beat four times per timeout).
  double heartbeat_timeout = 3;
  /// Empty: `rocksdb:<data_dir>/store`.
  std::string store_uri;
  /// Versions of each run retention keeps (besides what they and the
  /// replicas need); 0 keeps everything.
  uint32_t retain_versions = 20;
  /// How replicas fetch weights from peers that hold them: over UCX, or off
  /// (the store only). UCX's own variables (`UCX_TLS`, `UCX_NET_DEVICES`)
  /// choose its transports.
  peer_transfer transfer_peers = peer_transfer::ucx;
  /// Host memory for the publisher's copies of each run's last version;
  /// copies beyond it go to scratch files.
  uint64_t publisher_memory_limit = uint64_t{2} << 30;
  /// How deltas store their XOR: `xor_sparse` (run lists, "xor-sparse") or
  /// `xor_bytes` (the XOR bytes, "xor", for replicas on releases before
  /// xor-sparse).
  delta_encoding publisher_delta_encoding = delta_encoding::xor_sparse;
  /// Bytes buffered by streamed reads and writes of version bytes (export).
  uint64_t io_buffer_bytes = uint64_t{64} << 20;

  uint32_t replicas = 2;
  std::string model_preset = "tiny";
  /// The engine each replica drives: builtin (the engine of
  /// `model.preset`), sglang or vllm (an external server, at `engine.url` or
  /// started per replica with `engine.launch`).
  stitch::engine_kind engine_kind = stitch::engine_kind::builtin;
  /// Where the built-in engine computes: cpu, or cuda (the replica's first
  /// GPU slot, device 0 without one).
  stitch::engine_device engine_device = stitch::engine_device::cpu;
  /// Requests the built-in engine steps together (its KV slots on a device).
  uint64_t engine_max_batch = 64;
  std::string engine_url;
  /// A command line with `{port}`, `{gpu}` and `{model_dir}` placeholders.
  std::string engine_launch;
  /// Where versions are materialized for an external engine to load (one
  /// folder per replica); empty: /dev/shm/stitch-<name> (a tmpfs), else
  /// `<data_dir>/staging`.
  std::filesystem::path engine_staging_dir;
  /// Seconds: each read of an engine answer; a weight update; a launched
  /// engine's start until it answers its health route.
  double engine_request_timeout = 600;
  double engine_update_timeout = 600;
  double engine_ready_timeout = 900;
  /// A delta whose changed tensors hold at most this many bytes is loaded
  /// into SGLang alone and read back (0: every load is a full one).
  uint64_t engine_partial_reload_max_bytes = uint64_t{256} << 20;
  std::string pool = "default";
  listen_address replica_listen{"127.0.0.1", 8100};
  stitch::commit_mode commit_mode = stitch::commit_mode::in_place;
  /// Seconds.
  double drain_timeout = 300;
  double backstop = 5;

  listen_address gateway_listen{"127.0.0.1", 8080};
  std::vector<std::string> affinity_headers = {"X-Session-Id", "Modal-Session-ID"};
  listen_address status_listen{"127.0.0.1", 8081};
  /// The publisher's HTTP surface: HOST:PORT, or empty for none.
  std::string publisher_listen;
  /// It speaks HTTPS with the node's `[tls]` certificate and key.
  bool publisher_tls = false;
  /// Seconds a streamed publish (CLI or HTTP) may go without bytes before it
  /// is dropped, leaving nothing visible.
  double session_idle_timeout = 600;
  uint64_t body_limit = uint64_t{16} << 20;
  /// Open connections each HTTP surface holds at most, and from one client
  /// address; more are answered 503 and counted in /metrics. 0 = no limit.
  uint64_t http_max_connections = 8192;
  uint64_t http_max_connections_per_client = 1024;
  /// Bytes of request bodies each HTTP surface receives at once at most, by
  /// their announced lengths; a body past it is answered 503. 0 = no limit.
  uint64_t http_body_budget = uint64_t{256} << 20;

  std::string admin_token;
  /// A file holding the admin token (so that it is in no config file or
  /// command line); read once the settings are resolved.
  std::filesystem::path admin_token_file;
  /// The member capability (`stitch member-token` prints it for an admin
  /// token): what a node presents on membership messages. Derived from
  /// `admin_token` when that is set; a node given only this one takes part
  /// in the cluster but cannot publish, move pointers or delete versions.
  std::string member_token;
  std::filesystem::path member_token_file;
  std::filesystem::path tls_cert;
  std::filesystem::path tls_key;
  std::filesystem::path tls_ca;

  bool has_role(std::string_view role) const;
  std::string effective_store_uri() const;
  std::filesystem::path effective_staging_dir() const;
};

/// Parses a role file. Every problem — syntax, unknown key, wrong type, bad
/// value, missing companion setting, two roles on one port — is reported in
/// one `invalid_argument` error, one line each, naming the key path and the
/// `origin` (file name). `whole` = false leaves out what `validate` checks
/// across keys, for a file that environment variables and `--set` complete
/// (the caller validates the result).
result<node_config> parse_node_config(std::string_view toml_text, std::string_view origin,
                                      bool whole = true);

/// Applies one `key=value` (dotted key, the value as text) on top of `into`,
/// typed by the schema; a problem is appended to `problems` as one line.
void apply_setting(node_config& into, std::string_view key, std::string_view value,
                   std::string_view origin, std::string& problems);

/// Checks what no single key can: known roles, TLS files given together, no
/// two listeners on one port. Appends one line per problem.
void validate(const node_config& c, std::string& problems);

/// The effective config as TOML (`--print-config`); the admin token is
/// never printed.
std::string to_toml(const node_config& c);

/// Every settable key path (`replica.commit_mode`, ...).
std::vector<std::string> setting_keys();

/// The environment variable of a key: `replica.commit_mode` ->
/// `STITCH_REPLICA__COMMIT_MODE`.
std::string env_name(std::string_view key);

} // namespace stitch::config
