#!/usr/bin/env python3
"""Keeps the layering of docs/architecture.md: every #include between source
folders points down.

    scripts/check-layers.py [--root DIR]

Reads every `#include` of the source folders below (C++ and CUDA files) and
fails, naming the file, the line and the rule, when

  - a folder includes a folder it may not depend on (one above it, or a
    sibling it must stay apart from: the engines use the weight pipeline,
    never a store backend);
  - `runtime/core` includes a header of threads, sockets, files or a library
    with I/O (it is the pure domain), or a header from any other folder;
  - a folder below `actors/` includes CAF.

Quoted includes are repository-relative ("runtime/core/manifest.hpp") or name
a file of the including folder ("xxh3_blocks.hpp"). Tests, benches and
examples sit above every layer and are not checked. Exit status: 0 clean,
1 a violation (each printed on stderr), 2 usage.
"""

import argparse
import pathlib
import re
import sys

# What each folder may include, besides itself. A folder not listed here is
# not a layer (tests/, bench/, examples/, clients/).
ALLOWED = {
    "runtime/core": set(),
    "gpu": {"runtime/core"},
    "transport": {"runtime/core"},
    "config": {"runtime/core"},
    "runtime/store": {"runtime/core", "gpu", "transport"},
    "runtime/pipeline": {"runtime/core", "gpu"},
    "runtime/engine": {"runtime/core", "gpu", "transport", "runtime/pipeline"},
    "actors": {"runtime/core", "gpu", "transport", "config", "runtime/store",
               "runtime/pipeline", "runtime/engine"},
    "node": {"runtime/core", "gpu", "transport", "config", "runtime/store",
             "runtime/pipeline", "runtime/engine", "actors"},
}

# runtime/core is pure: no threads, sockets, files, RocksDB, CAF or CUDA.
CORE_FORBIDDEN = re.compile(
    r"^(thread|mutex|shared_mutex|condition_variable|future|atomic|stop_token|"
    r"semaphore|barrier|latch|fstream|filesystem|unistd\.h|fcntl\.h|"
    r"sys/.*|netinet/.*|arpa/.*|netdb\.h|poll\.h|pthread\.h|"
    r"caf/.*|rocksdb/.*|boost/.*|ucp/.*|ucs/.*|cuda.*|nccl.*|cublas.*|"
    r"msgpack.*|toml.*|spdlog/.*|openssl/.*)$")

BELOW_ACTORS = {"runtime/core", "gpu", "transport", "config", "runtime/store",
                "runtime/pipeline", "runtime/engine"}

# Folders above every layer: nothing in a layer includes them.
ABOVE_EVERY_LAYER = {"tests", "bench", "examples", "clients", "scripts"}

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
SOURCES = {".cpp", ".hpp", ".h", ".cu", ".cuh"}


def folder_of(path: str):
    """The layer folder a repository-relative path lies in (longest match)."""
    best = None
    for folder in ALLOWED:
        if path == folder or path.startswith(folder + "/"):
            if best is None or len(folder) > len(best):
                best = folder
    return best


def check(root: pathlib.Path):
    problems = []
    for folder in sorted(ALLOWED):
        base = root / folder
        if not base.is_dir():
            continue
        for file in sorted(base.rglob("*")):
            if file.suffix not in SOURCES or not file.is_file():
                continue
            rel = file.relative_to(root).as_posix()
            if folder_of(rel) != folder:
                continue  # a nested layer folder checks its own files
            try:
                lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError as e:
                problems.append(f"{rel}: cannot be read: {e}")
                continue
            for number, line in enumerate(lines, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                kind, name = m.groups()
                close = ">" if kind == "<" else '"'
                where = f"{rel}:{number}: #include {kind}{name}{close}"
                if kind == "<":
                    if folder == "runtime/core" and CORE_FORBIDDEN.match(name):
                        problems.append(f"{where}: runtime/core is pure (no threads, sockets, "
                                        f"files, RocksDB, CAF or CUDA)")
                    elif folder in BELOW_ACTORS and name.startswith("caf/"):
                        problems.append(f"{where}: CAF stays in actors/ and node/")
                    continue
                target = name if "/" in name else f"{folder}/{name}"
                to = folder_of(target)
                if to is None:
                    if name.split("/")[0] in ABOVE_EVERY_LAYER or ("/" in name and (root / name).exists()):
                        problems.append(f"{where}: {folder} may include only "
                                        f"{', '.join(sorted(ALLOWED[folder])) or 'itself'}")
                    elif name.startswith("caf/") and folder in BELOW_ACTORS:
                        problems.append(f"{where}: CAF stays in actors/ and node/")
                    continue
                if to == folder or to in ALLOWED[folder]:
                    continue
                problems.append(f"{where}: {folder} may not include {to} (it may include "
                                f"{', '.join(sorted(ALLOWED[folder])) or 'only itself'})")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent),
                        help="the repository root (default: this script's repository)")
    args = parser.parse_args()
    root = pathlib.Path(args.root)
    if not (root / "runtime" / "core").is_dir():
        print(f"check-layers: {root} has no runtime/core: not a Stitch tree", file=sys.stderr)
        return 2
    problems = check(root)
    for p in problems:
        print(f"check-layers: {p}", file=sys.stderr)
    if problems:
        print(f"check-layers: {len(problems)} include(s) against the layering "
              f"(docs/architecture.md, 'Layers')", file=sys.stderr)
        return 1
    print("check-layers: every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
