#include "runtime/node/node.hpp"

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include "actors/coordinator.hpp"
#include "actors/publisher.hpp"
#include "actors/store.hpp"
#include "runtime/store/store_uri.hpp"

namespace stitch::node {

result<std::unique_ptr<node>> node::start(caf::actor_system& sys, const node_settings& settings) {
  std::error_code ec;
  std::filesystem::create_directories(settings.data_dir, ec);
  if (ec)
    return make_error(errc::backend_failure, "cannot create the data directory '"
                                               + settings.data_dir.string() + "': " + ec.message());
  auto opened = store::open_store(settings.effective_store_uri());
  if (!opened)
    return std::move(opened).error();
  std::shared_ptr<store_backend> backend{std::move(*opened)};
  std::unique_ptr<node> n{new node(sys)};
  n->store_ = sys.spawn<caf::detached>(store_service, backend, settings.data_dir / "spool");
  n->publisher_ =
    sys.spawn<caf::detached>(publisher_service, backend, n->store_, store::publisher_options{});
  n->coordinator_ = sys.spawn(coordinator);
  caf::anon_send(n->coordinator_, atom::enroll_v, std::string{"store"},
                 caf::actor_cast<caf::actor>(n->store_));
  caf::anon_send(n->coordinator_, atom::enroll_v, std::string{"publisher"},
                 caf::actor_cast<caf::actor>(n->publisher_));
  auto port = sys.middleman().publish(n->coordinator_, settings.coordinator.port,
                                      settings.coordinator.host.c_str(), true);
  if (!port) {
    n->stop();
    return make_error(errc::backend_failure, "cannot listen on " + settings.coordinator.host + ":"
                                               + std::to_string(settings.coordinator.port) + ": "
                                               + sys.render(port.error()));
  }
  n->port_ = *port;
  return n;
}

node::~node() {
  stop();
}

void node::stop() {
  if (coordinator_ && port_ != 0)
    (void) sys_.middleman().unpublish(coordinator_, port_);
  for (auto handle : {caf::actor_cast<caf::actor>(coordinator_),
                      caf::actor_cast<caf::actor>(publisher_), caf::actor_cast<caf::actor>(store_)})
    if (handle) {
      caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
      // Handles sent to remote nodes are kept alive in the registry for them;
      // a stopping node releases them.
      sys_.registry().erase(handle.id());
    }
  coordinator_ = nullptr;
  publisher_ = nullptr;
  store_ = nullptr;
}

} // namespace stitch::node
