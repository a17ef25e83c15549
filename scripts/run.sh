#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the
# main job. Until the node roles land this is a smoke run of `stitch-node`.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache hits across clones in other folders (CI builds a fresh clone).
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=true
scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target stitch-node stitch
build/bin/stitch-node --help
