#include "node/system_config.hpp"

#include <malloc.h>

#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/message.hpp>

#include <algorithm>
#include <caf/openssl/manager.hpp>
#include <fstream>
#include <thread>

#include "actors/cluster_types.hpp"
#include "actors/coordinator_actor.hpp"
#include "actors/gateway_actor.hpp"
#include "actors/handle_types.hpp"
#include "actors/node_agent_actor.hpp"
#include "actors/publisher_actor.hpp"
#include "actors/rollout_driver_actor.hpp"
#include "actors/status_actor.hpp"
#include "actors/store_actor.hpp"
#include "actors/value_types.hpp"

namespace stitch {

void register_stitch_types(caf::actor_system_config& cfg) {
  cfg.add_message_types<caf::id_block::stitch_values>();
  cfg.add_message_types<caf::id_block::stitch_replica>();
  cfg.add_message_types<caf::id_block::stitch_replica_handles>();
  cfg.add_message_types<caf::id_block::stitch_cluster>();
  cfg.add_message_types<caf::id_block::stitch_gateway>();
  cfg.add_message_types<caf::id_block::stitch_node_agent>();
  cfg.add_message_types<caf::id_block::stitch_coordinator>();
  cfg.add_message_types<caf::id_block::stitch_status>();
  cfg.add_message_types<caf::id_block::stitch_rollout>();
  cfg.add_message_types<caf::id_block::stitch_handles>();
  cfg.add_message_types<caf::id_block::stitch_store>();
  cfg.add_message_types<caf::id_block::stitch_store_handles>();
  cfg.add_message_types<caf::id_block::stitch_publisher>();
  cfg.add_message_types<caf::id_block::stitch_publisher_handles>();
  cfg.add_error_category(caf::atom("stitch"),
                         [](uint8_t code, caf::atom_value, const caf::message& ctx) -> std::string {
                           std::string out = "stitch::";
                           out += to_string(static_cast<errc>(code));
                           if (ctx.match_elements<std::string>()) {
                             out += ": ";
                             out += ctx.get_as<std::string>(0);
                           }
                           return out;
                         });
}

size_t middleman_workers(unsigned cores) {
  // CAF's default is min(3, cores / 4) + 1.
  return cores < 4 ? 0 : std::min(3u, cores / 4) + 1;
}

void tune_scheduler(caf::actor_system_config& cfg) {
  cfg.set("work-stealing.moderate-poll-attempts", 1);
}

system_config::system_config() {
  register_stitch_types(*this);
  tune_scheduler(*this);
  load<caf::io::middleman>();
  // Nodes connect to each other directly through the node mesh (each node
  // listens on `cluster.listen`, its agent connects to the others it finds
  // in the coordinator's directory, TLS with `[tls]`), not CAF's automatic
  // connections: those open a plain port on every interface of every node,
  // TLS or not, and connect in the clear. A route that switches from
  // indirect to direct can kill the proxies in use (0.17): gateways and
  // status actors take in again what the coordinator re-enrolls every few
  // seconds.
  set("middleman.enable-automatic-connections", false);
  set("middleman.workers", middleman_workers(std::thread::hardware_concurrency()));
}

std::string check_tls_files(const std::string& cert, const std::string& key,
                            const std::string& ca) {
  for (const auto& [what, path] :
       {std::pair{"certificate", cert}, std::pair{"key", key}, std::pair{"CA certificate", ca}}) {
    std::ifstream in{path};
    std::string head(11, '\0');
    if (!in || !in.read(head.data(), static_cast<std::streamsize>(head.size()))
        || head != "-----BEGIN ")
      return std::string{"the TLS "} + what + " '" + path + "' is not a readable PEM file";
  }
  return {};
}

void system_config::use_tls(const std::string& cert, const std::string& key,
                            const std::string& ca) {
  openssl_certificate = cert;
  openssl_key = key;
  openssl_cafile = ca;
  load<caf::openssl::manager>();
}

} // namespace stitch

namespace stitch {

void keep_freed_buffers_in_heap() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

} // namespace stitch
