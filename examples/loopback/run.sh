#!/usr/bin/env bash
# Starts the loopback cluster (six stitch-node processes), submits the
# experiment and follows it until the trainer finishes. Logs and data under
# ./loopback-data. Ctrl-C stops every node.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=build/bin
[[ -x $bin/stitch-node ]] || { echo "build first: cmake --preset default && cmake --build build" >&2; exit 2; }
mkdir -p loopback-data
pids=()
stop() { kill -TERM "${pids[@]}" 2>/dev/null || true; wait || true; }
trap stop EXIT
for n in coordinator frontdoor replica-a replica-b driver trainer; do
  $bin/stitch-node --config examples/loopback/$n.toml > loopback-data/$n.log 2>&1 &
  pids+=($!)
  [[ $n == coordinator ]] && sleep 1
done
sleep 2
$bin/stitch --coordinator 127.0.0.1:4300 submit examples/loopback/experiment.toml
echo "dashboard: http://127.0.0.1:8181/   gateway: http://127.0.0.1:8180/"
for _ in $(seq 1 600); do
  out=$($bin/stitch --coordinator 127.0.0.1:4300 status)
  echo "$out" | grep '^experiment' || true
  echo "$out" | grep -q 'trainer finished' && break
  sleep 1
done
$bin/stitch --coordinator 127.0.0.1:4300 status
