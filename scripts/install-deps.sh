#!/usr/bin/env bash
# Installs the Debian packages Stitch builds and tests with. Idempotent and quiet
# when everything is already present. Usage: scripts/install-deps.sh [--fuzz]
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libcaf-dev libboost-dev libmsgpack-cxx-dev librocksdb-dev libucx-dev
  libgtest-dev libgmock-dev libxxhash-dev libzstd-dev libssl-dev
  libtomlplusplus-dev nlohmann-json3-dev libexpat1-dev libspdlog-dev libfmt-dev libcli11-dev
  clang-14 libclang-rt-14-dev clang-format-14
  chromium fonts-dejavu-core curl iproute2 nginx-light
  python3 python3-venv python3-setuptools python3-wheel python3-torch libopenblas0-pthread
  python3-botocore
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
