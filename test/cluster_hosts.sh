#!/usr/bin/env bash
# scripts/netns_cluster.sh itself: it refuses clearly without root (exit 77), makes hosts that
# reach each other and nothing in the root namespace, always removes them, cleans up after a run
# that was killed before it could, and fails (exit 1, not 77) when a set-up step fails where
# namespaces can be made. Skipped (77) only where the script says this machine cannot make them
# (not root, no iproute2); any other failure of the script fails this test.
set -euo pipefail
S=$1/scripts/netns_cluster.sh
NAME=cluster-hosts-test
fail() { echo "FAILED: $*" >&2; exit 1; }

if command -v setpriv >/dev/null && [[ $(id -u) -eq 0 ]]; then
  set +e
  out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$S" run "$NAME" 2 true 2>&1)
  code=$?
  set -e
  [[ $code -eq 77 && $out == *"needs root"* ]] || fail "as uid 65534: exit $code, '$out'"
fi

# Hosts for a command, then gone; the hosts are named hosts and the subnet is only inside them.
set +e
inside=$("$S" run "$NAME" 2 sh -c '
  echo "cluster=$NETNS_CLUSTER hosts=$NETNS_CLUSTER_HOSTS"
  NETNS_CLUSTER=$NETNS_CLUSTER '"$S"' exec 10.213.19.2 hostname
  ip netns exec '"$NAME"'-h0 ip -4 -o addr show dev eth0 | grep -o "10.213.19.1/24"
  ip -4 -o addr | grep -c "10\.213\.19\." || true')
code=$?
set -e
[[ $code -eq 77 ]] && { echo "skipped: $inside"; exit 77; }
[[ $code -eq 0 ]] || fail "run: exit $code: $inside"
expected="cluster=$NAME hosts=10.213.19.1 10.213.19.2
$NAME-h1
10.213.19.1/24
0"
[[ $inside == "$expected" ]] || fail "inside the cluster: got
$inside
expected
$expected"
[[ $(ip netns list | grep -c "^$NAME-") -eq 0 ]] || fail "run left namespaces: $(ip netns list)"

# A run killed outright (SIGKILL: no trap runs) leaves its hosts; the next run removes them first.
pidfile=$(mktemp)
"$S" run "$NAME" 3 sh -c "echo \$\$ > $pidfile; exec sleep 60" &
runner=$!
for _ in $(seq 100); do [[ -s $pidfile ]] && break; sleep 0.1; done
kill -KILL "$runner"
wait "$runner" 2>/dev/null || true
kill -KILL "$(cat "$pidfile")"  # its command, orphaned
rm -f "$pidfile"
[[ $(ip netns list | grep -c "^$NAME-") -eq 4 ]] || fail "expected the killed run's 3 hosts and switch"
hosts=$("$S" run "$NAME" 2 sh -c "ip netns list | grep -c '^$NAME-'")
[[ $hosts -eq 3 ]] || fail "after a crash, run made $hosts namespaces instead of 2 hosts and a switch"
"$S" down "$NAME"
"$S" down "$NAME"  # nothing to remove: no error
[[ $(ip netns list | grep -c "^$NAME-") -eq 0 ]] || fail "down left namespaces"

# A machine that can make namespaces but whose `ip netns add` fails (an `ip` in front of the real
# one refuses it) is broken, not one to skip: exit 1 with the reason, and nothing left behind.
shim=$(mktemp -d)
printf '#!/bin/sh\n[ "$1 $2" = "netns add" ] && { echo "refused by the test" >&2; exit 2; }\nexec %s "$@"\n' \
  "$(command -v ip)" >"$shim/ip"
chmod +x "$shim/ip"
set +e
out=$(PATH="$shim:$PATH" "$S" run "$NAME" 2 true 2>&1)
code=$?
set -e
rm -r "$shim"
[[ $code -eq 1 && $out == *"refused by the test"* && $out == *"making host namespaces failed"* ]] ||
  fail "with 'ip netns add' failing: exit $code, '$out'"
[[ $(ip netns list | grep -c "^$NAME-") -eq 0 ]] || fail "a failed set-up left namespaces"
echo "netns_cluster.sh: refuses without root, isolates, cleans up (also after a crash), fails a broken set-up"
