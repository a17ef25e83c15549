// The crash test's victim: publishes versions of the crash workload in a loop
// and prints "ack N" after each acknowledged publish, until it is killed.
// With `gc KEEP`, each publish is followed by a collection keeping the newest
// KEEP versions (printed "gc N" when it finished).
// Usage: store_crash_child DB_PATH [gc KEEP]

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "crash_workload.hpp"
#include "runtime/store/rocksdb_store.hpp"

int main(int argc, char** argv) {
  using namespace stitch;
  using namespace stitch::testing;
  if (argc != 2 && !(argc == 4 && std::string_view{argv[2]} == "gc")) {
    std::fprintf(stderr, "usage: store_crash_child DB_PATH [gc KEEP]\n");
    return 2;
  }
  const size_t keep = argc == 4 ? static_cast<size_t>(std::atoi(argv[3])) : 0;
  auto opened = store::open_rocksdb_store(argv[1]);
  if (!opened) {
    std::fprintf(stderr, "open: %s\n", to_string(opened.error()).c_str());
    return 1;
  }
  auto& db = **opened;
  std::printf("ready\n");
  std::fflush(stdout);
  for (;;) {
    auto pointer = db.read_pointer(crash_pool);
    if (!pointer) {
      std::fprintf(stderr, "read_pointer: %s\n", to_string(pointer.error()).c_str());
      return 1;
    }
    uint64_t next = *pointer ? (*pointer)->latest.version + 1 : 0;
    auto version = crash_version(next);
    if (auto ok = put(db, crash_pool, version); !ok) {
      std::fprintf(stderr, "put %llu: %s\n", static_cast<unsigned long long>(next),
                   to_string(ok.error()).c_str());
      return 1;
    }
    status moved;
    if (next == 0) {
      auto claimed = db.claim(crash_pool, version.m.ref);
      if (!claimed)
        moved = std::move(claimed).error();
    } else {
      auto advanced = db.compare_and_advance_pointer(crash_pool, (*pointer)->latest, version.m.ref);
      if (!advanced)
        moved = std::move(advanced).error();
    }
    if (!moved) {
      std::fprintf(stderr, "pointer %llu: %s\n", static_cast<unsigned long long>(next),
                   to_string(moved.error()).c_str());
      return 1;
    }
    std::printf("ack %llu\n", static_cast<unsigned long long>(next));
    std::fflush(stdout);
    if (keep > 0) {
      retention_request req;
      req.keep_last = keep;
      if (auto report = db.retain(crash_pool, req); !report) {
        std::fprintf(stderr, "retain: %s\n", to_string(report.error()).c_str());
        return 1;
      }
      std::printf("gc %llu\n", static_cast<unsigned long long>(next));
      std::fflush(stdout);
    }
  }
}
