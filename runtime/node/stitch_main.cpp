// stitch: the command-line client of a Stitch cluster (DESIGN §7).

#include <CLI/CLI.hpp>

#include <cstdio>

#include "runtime/node/cli.hpp"

int main(int argc, char** argv) {
  using namespace stitch::node;
  CLI::App app{"stitch: command-line client of a Stitch cluster", "stitch"};
  app.require_subcommand(1);
  std::string coordinator = "127.0.0.1:4242";
  std::string token;
  app.add_option("--coordinator", coordinator, "coordinator HOST:PORT")->capture_default_str();
  app.add_option("--token", token, "admin token (or STITCH_TOKEN)")->envname("STITCH_TOKEN");
  app.set_version_flag("--version", "stitch 0.1.0");
  for (const char* name : {"init-model", "publish", "export", "demo", "submit", "status", "scale",
                           "stop"})
    app.add_subcommand(name, "not part of this build yet")->allow_extras();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? exit_ok : exit_usage;
  }
  std::fprintf(stderr, "stitch: '%s' is not part of this build yet\n",
               app.get_subcommands().front()->get_name().c_str());
  return exit_runtime_failure;
}
