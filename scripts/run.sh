#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the
# main job. Until the async RL demo lands (node and coordinator work), the
# main job is a round trip through a real node: write a boot checkpoint, start
# stitch-node on a free port, publish version 0 (a full anchor) and version 1
# (a delta), export version 1 and stop the node.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache hits across clones in other folders (CI builds a fresh clone).
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=true
scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target stitch-node stitch

work=$(mktemp -d)
node_pid=""
cleanup() {
  [ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null && wait "$node_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

build/bin/stitch init-model --preset tiny --seed 1 --out "$work/v0"
build/bin/stitch-node --data-dir "$work/data" --set coordinator.listen=127.0.0.1:0 \
  >"$work/node.log" 2>&1 &
node_pid=$!
port=""
for _ in $(seq 1 100); do
  port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/node.log")
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { cat "$work/node.log"; echo "stitch-node did not start" >&2; exit 1; }
cat "$work/node.log"
stitch=(build/bin/stitch --coordinator "127.0.0.1:$port")
"${stitch[@]}" publish --run demo --version 0 "$work/v0"
# The trainer's next step: here the same weights again, an empty delta.
"${stitch[@]}" publish --run demo --version 1 "$work/v0" --stream
"${stitch[@]}" export --version demo/1 --out "$work/export"
ls -l "$work/export"
