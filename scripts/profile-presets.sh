#!/usr/bin/env bash
# `stitch profile` of a built-in replica for each model preset, as the table
# and charts in bench/README.md: starts a one-replica stitch-node per preset,
# publishes the preset's random-init checkpoint, profiles the replica and
# writes <out>/<preset>.json and <out>/<preset>.svg.
#
#   scripts/profile-presets.sh [--out DIR] [--peers ucx|off] [PRESET...]
#
# Default presets: tiny small medium. Needs a built tree (build/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin
out=bench/profile
peers=ucx
presets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --peers) peers=$2; shift 2 ;;
    *) presets+=("$1"); shift ;;
  esac
done
[[ ${#presets[@]} -gt 0 ]] || presets=(tiny small medium)
mkdir -p "$out"
work=$(mktemp -d)
node_pid=
cleanup() {
  [[ -n $node_pid ]] && kill "$node_pid" 2>/dev/null && wait "$node_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

for preset in "${presets[@]}"; do
  dir=$work/$preset
  mkdir -p "$dir"
  port=$((20000 + RANDOM % 20000))
  "$bin/stitch-node" --data-dir="$dir/data" --set coordinator.listen=127.0.0.1:$port \
    --set gateway.listen=127.0.0.1:0 --set status.listen=127.0.0.1:0 \
    --set replica.listen=127.0.0.1:0 --set replicas=1 --set model.preset="$preset" \
    --set transfer.peers="$peers" >"$dir/node.log" 2>&1 &
  node_pid=$!
  cli=("$bin/stitch" --coordinator 127.0.0.1:$port)
  for _ in $(seq 100); do
    "${cli[@]}" status >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$bin/stitch" init-model --preset "$preset" --out "$dir/boot" >/dev/null
  "${cli[@]}" publish --run boot --version 1 "$dir/boot" >/dev/null
  for _ in $(seq 600); do
    "${cli[@]}" status 2>/dev/null | grep -q '^replica-0 *yes' && break
    sleep 0.1
  done
  echo "== $preset ($(du -sh "$dir/boot" | cut -f1), transfer.peers=$peers)"
  "${cli[@]}" profile --replica replica-0 --take-out --out "$out/$preset.json" \
    --work-dir "$dir/profile"
  kill "$node_pid"
  wait "$node_pid" 2>/dev/null || true
  node_pid=
  rm -rf "$dir"
done
