#!/usr/bin/env bash
# A local S3-protocol server for the S3 store tests: s3rver (npm) on 127.0.0.1
# with a free port and a temporary data directory.
#
#   scripts/s3-test-server.sh start   prints the endpoint (also in .cache/s3rver/endpoint)
#   scripts/s3-test-server.sh stop
#
# `start` is idempotent: a running server is reused. Installs Node.js/npm from
# Debian and s3rver into .cache/s3rver when they are missing. Use it as
#   STITCH_S3_ENDPOINT=$(scripts/s3-test-server.sh start) ctest -L store
# s3rver accepts the credentials S3RVER/S3RVER and ignores SigV4 signatures
# and conditional writes (see runtime/store/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$PWD/.cache/s3rver
pid_file=$dir/pid
endpoint_file=$dir/endpoint
data_file=$dir/data-dir
log_file=$dir/server.log

running() {
  [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null
}

install() {
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm >/dev/null
  fi
  if [ ! -x "$dir/node_modules/.bin/s3rver" ]; then
    mkdir -p "$dir"
    # The system's CA bundle (not node's built-in one), so registries behind a
    # TLS-inspecting proxy whose CA the machine trusts work too.
    local ca=()
    [ -f /etc/ssl/certs/ca-certificates.crt ] && ca=(--cafile /etc/ssl/certs/ca-certificates.crt)
    npm install "${ca[@]}" --prefix "$dir" --no-audit --no-fund --silent s3rver@3 >/dev/null
  fi
}

start() {
  if running && [ -s "$endpoint_file" ]; then
    cat "$endpoint_file"
    return
  fi
  stop
  install
  local data
  data=$(mktemp -d "${TMPDIR:-/tmp}/stitch-s3rver.XXXXXX")
  echo "$data" >"$data_file"
  : >"$log_file"
  # setsid: the server outlives this script and its process group. s3rver's
  # list continuation tokens use DES, which OpenSSL 3 keeps in its legacy provider.
  local legacy=""
  node --openssl-legacy-provider -e '' 2>/dev/null && legacy=--openssl-legacy-provider
  setsid node $legacy "$dir/node_modules/.bin/s3rver" -d "$data" -a 127.0.0.1 -p 0 -s \
    >"$log_file" 2>&1 </dev/null &
  echo $! >"$pid_file"
  local port=""
  for _ in $(seq 1 200); do
    port=$(sed -n 's/^S3rver listening on [^:]*:\([0-9][0-9]*\).*/\1/p' "$log_file" | head -n 1)
    [ -n "$port" ] && break
    if ! running; then
      cat "$log_file" >&2
      echo "s3-test-server: s3rver exited while starting" >&2
      exit 1
    fi
    sleep 0.1
  done
  if [ -z "$port" ]; then
    echo "s3-test-server: s3rver did not report its port within 20 s" >&2
    stop
    exit 1
  fi
  echo "http://127.0.0.1:$port" >"$endpoint_file"
  cat "$endpoint_file"
}

stop() {
  if running; then
    local pid
    pid=$(cat "$pid_file")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  if [ -f "$data_file" ]; then
    local data
    data=$(cat "$data_file")
    case "$data" in
      */stitch-s3rver.*) rm -rf "$data" ;;
    esac
  fi
  rm -f "$pid_file" "$endpoint_file" "$data_file"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
