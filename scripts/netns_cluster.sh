#!/usr/bin/env bash
# Test hosts on one machine: N Linux network namespaces joined by a switch, so that MPI ranks on
# different "hosts" talk over TCP through a real network stack (veth links, a bridge), and a
# test can take a host's link down or slow it (tc).
#
#   scripts/netns_cluster.sh up NAME N        create hosts NAME-h0 .. NAME-h(N-1) (replaces a
#                                             cluster of that NAME left by a crash)
#   scripts/netns_cluster.sh down NAME        remove everything `up` made (no error if none)
#   scripts/netns_cluster.sh run NAME N CMD.. up, run CMD in the root namespace, always down
#   NETNS_CLUSTER=NAME scripts/netns_cluster.sh exec ADDR CMD..
#                                             run CMD on the host with address ADDR: the "rsh"
#                                             Open MPI starts its daemons with (plm_rsh_agent)
#   scripts/netns_cluster.sh addr NAME I      host I's address
#   scripts/netns_cluster.sh link NAME I up|down            host I's link to the switch
#   scripts/netns_cluster.sh slow NAME I MBIT|off           host I's link sends at most MBIT Mbit/s
#
# Layout: host I is namespace NAME-hI with one interface eth0 = 10.213.19.(I+1)/24, the other end
# of its veth pair sits in namespace NAME-sw on bridge br0. The switch lives in a namespace of its
# own, so nothing is added to the root namespace: the /24 exists only inside these namespaces and
# no packet to or from it can leave them. Deleting the namespaces deletes the links and the bridge.
# Clusters of different NAMEs may coexist: each host's address is only seen inside its namespace.
#
# Exit codes: 0 ok (`run`: CMD's own), 77 this machine cannot make namespaces (not root, or root
# without CAP_SYS_ADMIN and CAP_NET_ADMIN as in an unprivileged container; no iproute2 `ip`: the
# reason is printed; tests pass 77 on as "skipped"), 1 anything else: where namespaces can be
# made, a set-up that fails (`ip netns add` refused, a link not made...) is an error, never a skip.
set -euo pipefail

SUBNET=10.213.19
readonly SUBNET

die() { echo "netns_cluster: $*" >&2; exit 1; }
cannot() { echo "netns_cluster: cannot make test hosts here: $*" >&2; exit 77; }

# Only what this machine lacks makes it unable (77); whatever fails after these checks is a fault.
check_can() {
  [[ $(id -u) -eq 0 ]] || cannot "needs root (network namespaces and veth links), running as uid $(id -u)"
  local caps
  caps=$((16#$(awk '/^CapEff:/ {print $2}' /proc/self/status)))
  (((caps >> 21) & 1 && (caps >> 12) & 1)) ||
    cannot "root without CAP_SYS_ADMIN and CAP_NET_ADMIN (an unprivileged container)"
  command -v ip >/dev/null || cannot "no 'ip' command (apt-get install iproute2)"
  ip netns list >/dev/null 2>&1 || cannot "this 'ip' has no netns (apt-get install iproute2): $(ip netns list 2>&1 | head -1)"
}

host_ns() { echo "$1-h$2"; }
switch_ns() { echo "$1-sw"; }
addr_of() { echo "$SUBNET.$(($2 + 1))"; }

# Every process still inside one of the cluster's namespaces (ours: nothing else enters them).
kill_inside() {
  local ns pids
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$1-(h[0-9]+|sw)$" || true); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -n $pids ]] && kill -KILL $pids 2>/dev/null || true
  done
}

down() {
  local name=$1 ns
  kill_inside "$name"
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$name-(h[0-9]+|sw)$" || true); do
    ip netns del "$ns"
  done
}

up() {
  local name=$1 n=$2 i ns sw
  [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 200 ]] || die "N must be 1..200, got '$n'"
  # NAME-hI is also the host's host name (exec): letters, digits and '-' only.
  [[ $name =~ ^[a-z0-9][a-z0-9-]{0,40}$ ]] || die "NAME must be lower-case letters, digits and '-', got '$name'"
  check_can
  down "$name"  # idempotent after a crash: start from nothing
  sw=$(switch_ns "$name")
  # A failure half-way removes what was made before reporting it (exit 1, `ip` says why above).
  trap 'down "$name"; die "making host namespaces failed"' ERR
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((i = 0; i < n; i++)); do
    ns=$(host_ns "$name" "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # TCP gives up on a peer that stopped acknowledging after ~6 s instead of Linux's default
    # ~15 min (tcp_retries2 4 instead of 15; this setting is per namespace). Clusters tune it the
    # same way: without it, when a host drops off the network, mpirun's order to end the job
    # waits for that host for 15 minutes after every rank has ended.
    ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_retries2=4
    # Created inside the host's namespace, its peer moved to the switch: no interface ever
    # appears in the root namespace.
    ip -n "$ns" link add eth0 type veth peer name "p$i" netns "$sw"
    ip -n "$ns" addr add "$(addr_of "$name" "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$sw" link set "p$i" master br0 up
  done
  trap - ERR
}

# ADDR -> its host's namespace in cluster $NETNS_CLUSTER (mpirun passes its environment on to
# the agent, so the test names the cluster once).
ns_of_addr() {
  local name=${NETNS_CLUSTER:?set NETNS_CLUSTER to the cluster NAME} last=${1##*.}
  [[ ${1%.*} == "$SUBNET" && $last =~ ^[0-9]+$ ]] || die "$1 is not a test host address ($SUBNET.x)"
  local ns
  ns=$(host_ns "$name" $((last - 1)))
  ip netns list | awk '{print $1}' | grep -qx "$ns" || die "no test host $ns (address $1)"
  echo "$ns"
}

cmd=${1:-}
shift || true
case $cmd in
  up) [[ $# -eq 2 ]] || die "usage: up NAME N"; up "$1" "$2" ;;
  down) [[ $# -eq 1 ]] || die "usage: down NAME"; down "$1" ;;
  run)
    [[ $# -ge 3 ]] || die "usage: run NAME N CMD..."
    name=$1 n=$2
    shift 2
    check_can
    trap 'down "$name"' EXIT
    trap 'exit 130' INT TERM  # runs the EXIT trap
    up "$name" "$n"
    hosts=""
    for ((i = 0; i < n; i++)); do hosts+="${hosts:+ }$(addr_of "$name" "$i")"; done
    # What the command needs to use the cluster: its name (for `exec`) and the hosts' addresses.
    NETNS_CLUSTER=$name NETNS_CLUSTER_HOSTS=$hosts "$@"
    ;;
  exec)
    # Open MPI's rsh launcher calls `agent [flags] HOST COMMAND...` with COMMAND a shell line.
    while [[ ${1:-} == -* ]]; do shift; done
    [[ $# -ge 2 ]] || die "usage: exec ADDR CMD..."
    ns=$(ns_of_addr "$1")
    shift
    # Its own host name too (a UTS namespace per command, named after the host), as a real host
    # has: MPI tells nodes apart by name, and messages then say which host a rank is on.
    exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $ns && $*"
    ;;
  addr) [[ $# -eq 2 ]] || die "usage: addr NAME I"; addr_of "$1" "$2" ;;
  link)
    [[ $# -eq 3 && ($3 == up || $3 == down) ]] || die "usage: link NAME I up|down"
    ip -n "$(host_ns "$1" "$2")" link set eth0 "$3"
    ;;
  slow)
    # A token bucket (tbf) on the host's side of its link: what it sends waits for tokens, so
    # every collective it is part of slows down. (netem's fixed delay would be the other way to
    # slow a host; this kernel has no sch_netem, and tbf is in every kernel that has tc.)
    [[ $# -eq 3 && ($3 == off || $3 =~ ^[0-9]+$) ]] || die "usage: slow NAME I MBIT|off"
    ns=$(host_ns "$1" "$2")
    if [[ $3 == off ]]; then
      ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
    else
      ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "${3}mbit" burst 16kb latency 10s
    fi
    ;;
  *) die "usage: up NAME N | down NAME | run NAME N CMD... | exec ADDR CMD... | addr NAME I | link NAME I up|down | slow NAME I MBIT|off" ;;
esac
