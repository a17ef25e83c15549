#!/usr/bin/env bash
# Fuzzes every parser an outsider can reach (tests/fuzz/, libFuzzer with ASan
# and UBSan, clang from Debian): SECONDS per target (default 60), each
# starting from its seed corpus in tests/fuzz/corpus/<target>. Prints the
# executions per target; a crash, leak, timeout or allocation over the limit
# stops the run with the fuzzer's report, the input kept under
# build-fuzz/findings/<target>/ (reproduce: build-fuzz/bin/<target> FILE).
#   scripts/fuzz.sh [SECONDS] [TARGET...]
# STITCH_FUZZ_KEEP=DIR keeps each target's grown corpus under DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds=${1:-60}
shift || true
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=true

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)"

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in build-fuzz/bin/fuzz_*; do targets+=("$(basename "$f")"); done
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
total=0
for name in "${targets[@]}"; do
  fuzzer=$root/build-fuzz/bin/$name
  [ -x "$fuzzer" ] || { echo "no fuzz target $name (build-fuzz/bin/)" >&2; exit 2; }
  corpus=$work/$name
  mkdir -p "$corpus"
  [ -d "tests/fuzz/corpus/$name" ] && cp -r "tests/fuzz/corpus/$name/." "$corpus/"
  seeds=$(find "$corpus" -type f | wc -l)
  findings=$root/build-fuzz/findings/$name
  mkdir -p "$findings"
  if ! (cd "$work" && "$fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 \
          -timeout=10 -print_final_stats=1 -artifact_prefix="$findings/" "$corpus" \
          >"$work/$name.log" 2>&1); then
    tail -n 60 "$work/$name.log"
    echo "fuzzer $name found a problem: $(ls "$findings")" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$name.log")
  echo "$name: ${runs:-0} executions in ${seconds}s, corpus $seeds seeds -> $(find "$corpus" -type f | wc -l) inputs, no findings"
  total=$((total + ${runs:-0}))
  rmdir "$findings" 2>/dev/null || true
  if [ -n "${STITCH_FUZZ_KEEP:-}" ]; then
    mkdir -p "$STITCH_FUZZ_KEEP/$name" && cp -r "$corpus/." "$STITCH_FUZZ_KEEP/$name/"
  fi
done
echo "fuzzing: ${#targets[@]} targets, $total executions, no findings"
