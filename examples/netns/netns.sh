#!/usr/bin/env bash
# Network namespaces for a Stitch cluster on one machine: namespace TAG-I
# (I = 1..N) has interface st0 at 10.231.0.(10+I)/24, joined by a veth pair
# to the bridge TAG-br (10.231.0.1 in the root namespace), so every node has
# its own address and bytes between nodes cross real links. Needs root.
#
#   netns.sh up TAG N             create (removes a leftover TAG first)
#   netns.sh down TAG             remove everything TAG made (always safe)
#   netns.sh link TAG I up|down   take namespace I's link down (a partition) or up
#   netns.sh throttle TAG I RATE  limit namespace I's egress (tc tbf, e.g. 80mbit)
#   netns.sh addr I               the address of namespace I
#   netns.sh exec TAG I CMD...    run CMD in namespace I
#   netns.sh probe                whether namespaces can be made and entered
#                                 here (a chroot cannot remount / for `ip -n`);
#                                 on failure prints why and exits 1
#
# TAG: at most 8 characters (interface names are at most 15).
set -euo pipefail

addr() { echo "10.231.0.$((10 + $1))"; }

down() {
  local tag=$1
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$tag-[0-9]*$" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^$tag-" || true); do
    ip link del "$l" 2>/dev/null || true
  done
}

up() {
  local tag=$1 n=$2
  [[ ${#tag} -le 8 ]] || { echo "netns.sh: TAG '$tag' is longer than 8 characters" >&2; exit 2; }
  down "$tag"
  ip link add "$tag-br" type bridge
  ip addr add 10.231.0.1/24 dev "$tag-br"
  ip link set "$tag-br" up
  for i in $(seq 1 "$n"); do
    local ns="$tag-$i"
    ip netns add "$ns"
    ip link add "$tag-v$i" type veth peer name st0 netns "$ns"
    ip link set "$tag-v$i" master "$tag-br"
    ip link set "$tag-v$i" up
    ip -n "$ns" addr add "$(addr "$i")/24" dev st0
    ip -n "$ns" link set st0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" route add default via 10.231.0.1
  done
}

probe() {
  local ns="stp$$-p" why
  if why=$(ip netns add "$ns" 2>&1 && ip -n "$ns" link set lo up 2>&1 && ip netns del "$ns" 2>&1); then
    return 0
  fi
  ip netns del "$ns" >/dev/null 2>&1 || true
  echo "$why"
  return 1
}

cmd=${1:-}
shift || true
case "$cmd" in
  up) up "$1" "$2" ;;
  down) down "$1" ;;
  link) ip -n "$1-$2" link set st0 "$3" ;;
  throttle) ip netns exec "$1-$2" tc qdisc replace dev st0 root tbf rate "$3" burst 64kb latency 400ms ;;
  addr) addr "$1" ;;
  exec) tag=$1 i=$2; shift 2; exec ip netns exec "$tag-$i" "$@" ;;
  probe) probe ;;
  *) sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
