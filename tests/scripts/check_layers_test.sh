#!/usr/bin/env bash
# The layering check (scripts/check-layers.py) passes on the tree and fails,
# naming the file and the rule, on each planted include that breaks a layer.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
check="/usr/bin/python3 $root/scripts/check-layers.py"

$check --root "$root" >/dev/null

fresh_copy() {
  rm -rf "$work/tree"
  mkdir -p "$work/tree"
  (cd "$root" && cp -r --parents runtime gpu transport config actors node "$work/tree/")
}

# plant <file> <include line> <words the refusal must say...>
plant() {
  local file=$1 line=$2
  shift 2
  fresh_copy
  printf '%s\n' "$line" >>"$work/tree/$file"
  local rc=0
  $check --root "$work/tree" 2>"$work/err" >/dev/null || rc=$?
  if [ "$rc" -ne 1 ]; then
    echo "FAIL: '$line' in $file: exit $rc, expected 1"; cat "$work/err"; exit 1
  fi
  grep -qF "$file:" "$work/err" || { echo "FAIL: the refusal does not name $file"; cat "$work/err"; exit 1; }
  for word in "$@"; do
    grep -qF "$word" "$work/err" || { echo "FAIL: the refusal does not say '$word'"; cat "$work/err"; exit 1; }
  done
  echo "refused as it should be: '$line' in $file"
}

plant runtime/core/manifest.hpp '#include "node/node.hpp"' 'runtime/core may not include node'
plant runtime/core/reconciler.cpp '#include "actors/replica.hpp"' 'may not include actors'
plant runtime/core/retention.cpp '#include <thread>' 'runtime/core is pure'
plant runtime/core/manifest.cpp '#include <rocksdb/db.h>' 'runtime/core is pure'
plant runtime/engine/model.cpp '#include "runtime/store/rocksdb_store.hpp"' 'runtime/engine may not include runtime/store'
plant runtime/pipeline/publisher.cpp '#include "runtime/store/store_base.hpp"' 'runtime/pipeline may not include runtime/store'
plant transport/ucx.cpp '#include <caf/all.hpp>' 'CAF stays in actors/ and node/'
plant gpu/stager.cpp '#include "runtime/engine/model.hpp"' 'gpu may not include runtime/engine'
plant actors/replica.cpp '#include "node/node.hpp"' 'actors may not include node'
plant config/node_config.cpp '#include "tests/common/eventually.hpp"' 'config may include only runtime/core'
# Same-folder includes resolve to the including folder.
fresh_copy
printf '#include "%s"\n' manifest.hpp >>"$work/tree/runtime/core/token.cpp"
$check --root "$work/tree" >/dev/null
echo "check_layers_test: passed"
