#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the
# main job: `stitch demo --local`, an asynchronous RL run on an all-in-one node
# (a trainer learning a toy task by policy gradient while two replicas keep
# generating through the gateway within a staleness bound). Before it, a
# walk of a real all-in-one node through a policy's life by hand: write a boot
# checkpoint, start stitch-node (two built-in replicas, gateway, status) on
# free ports, publish version 0 (a full anchor), 1 (the same weights: an empty
# delta, no activation) and 2 (new weights), watch both replicas converge,
# generate through the gateway with a version constraint, show the status and
# export version 2.
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
build/bin/stitch init-model --preset tiny --seed 2 --out "$work/v2"
build/bin/stitch-node --data-dir "$work/data" --set replicas=2 \
  --set coordinator.listen=127.0.0.1:0 --set gateway.listen=127.0.0.1:0 \
  --set status.listen=127.0.0.1:0 --set replica.listen=127.0.0.1:0 --set replica.backstop=1 \
  >"$work/node.log" 2>&1 &
node_pid=$!
field() { sed -n "s/.*$1 http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p" "$work/node.log" | head -1; }
port="" gateway="" status=""
for _ in $(seq 1 200); do
  port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/node.log")
  gateway=$(field gateway)
  status=$(field status)
  [ -n "$port" ] && [ -n "$status" ] && break
  sleep 0.1
done
[ -n "$status" ] || { cat "$work/node.log"; echo "stitch-node did not start" >&2; exit 1; }
cat "$work/node.log"
echo "dashboard: http://127.0.0.1:$status/"
stitch=(build/bin/stitch --coordinator "127.0.0.1:$port")

# Waits until both replicas serve version $1.
await() {
  for _ in $(seq 1 600); do
    if curl -s "http://127.0.0.1:$gateway/pool" | grep -q "\"demo/weight_v00000$1\":2"; then
      return 0
    fi
    sleep 0.1
  done
  curl -s "http://127.0.0.1:$gateway/pool"; echo
  echo "replicas did not converge to version $1" >&2
  exit 1
}

"${stitch[@]}" publish --run demo --version 0 "$work/v0"
await 0
# The trainer's next step: here the same weights again, an empty delta.
"${stitch[@]}" publish --run demo --version 1 "$work/v0" --stream
# And a step that changes the weights.
"${stitch[@]}" publish --run demo --version 2 "$work/v2"
await 2
echo "--- a sample through the gateway, constrained to min_version 2:"
curl -s "http://127.0.0.1:$gateway/generate" -H 'Content-Type: application/json' \
  -d '{"text":"hello","sampling_params":{"max_new_tokens":16,"temperature":0},
       "weight_version":{"min_version":2,"exact_version":null}}'
echo
echo "--- a request for a version nobody serves yet (409, retryable):"
curl -s "http://127.0.0.1:$gateway/generate" -H 'Content-Type: application/json' \
  -d '{"text":"hello","weight_version":{"min_version":3}}'
echo
echo "--- /status (replicas):"
curl -s "http://127.0.0.1:$status/status" | grep -o '"replica_id":"[^"]*","pool":"[^"]*","ready":[a-z]*,"applied":"[^"]*"'
"${stitch[@]}" export --version demo/2 --out "$work/export"
ls -l "$work/export"

echo
echo "=== the async RL demo (stitch demo --local): the trainer publishes every step;"
echo "=== rollouts go through the gateway with min_version = latest - 2"
build/bin/stitch demo --local --steps 30 2>"$work/demo.log" || { cat "$work/demo.log"; exit 1; }
