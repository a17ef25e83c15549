#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the
# main job. Until the node roles land this is a smoke run of `stitch-node`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target stitch-node stitch
build/bin/stitch-node --help
