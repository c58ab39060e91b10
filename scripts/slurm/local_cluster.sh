#!/usr/bin/env bash
# A real Slurm on this one machine, for tests and for trying scripts/slurm/picotrain.sbatch:
# munged, slurmctld and slurmd of Debian's slurm-wlm, run as root from a directory of our own
# (config, state, logs, sockets), on loopback and ports of our own, with no systemd.
#
#   scripts/slurm/local_cluster.sh up DIR [--cpus N] [--gpus N]   # start; prints the SLURM_CONF line
#   scripts/slurm/local_cluster.sh down DIR                       # stop everything started from DIR
#   SLURM_CONF=DIR/slurm.conf sbatch ...                          # talk to it
#
# The cluster is one node, pt-node0, with --cpus CPUs (default: this machine's) and --gpus
# "GPUs" (default 2): gres entries backed by character devices made in DIR, so that jobs asking
# for --gpus-per-task schedule as on a GPU cluster (there is no GPU behind them; run picotrain
# with --device cpu). `up` waits until the node is idle (at most 30 s) and fails with the
# daemons' logs otherwise; `down` is safe to run twice, or after a crash. Needs root (the daemons
# run as root here), and the packages of scripts/setup.sh --cluster.
# Exit codes: 0 done, 1 failed (the reason on stderr), 2 bad usage, 77 cannot run here (not
# root, or Slurm/munge not installed): tests skip then. Where both are there, a set-up that fails
# (no munge key, a daemon that does not start, ...) is 1: a broken machine is not skipped.
set -euo pipefail

usage() { sed -n '5,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 2 ] || usage
ACTION=$1 DIR=$2
shift 2
CPUS=$(nproc) GPUS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --cpus) CPUS=${2:?--cpus needs a count}; shift 2 ;;
    --gpus) GPUS=${2:?--gpus needs a count}; shift 2 ;;
    *) echo "local_cluster.sh: unknown argument '$1'" >&2; usage ;;
  esac
done

stop_daemons() {
  # slurmd before slurmctld (it reports to it), munged last (both authenticate through it).
  local f pid
  for f in slurmd slurmctld munge/munged; do
    [ -f "$DIR/$f.pid" ] || continue
    pid=$(cat "$DIR/$f.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$DIR/$f.pid"
  done
}

if [ "$ACTION" = down ]; then
  [ -d "$DIR" ] || exit 0
  # Jobs first, so that no batch script or task outlives the daemons that would stop it.
  if [ -f "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
    export SLURM_CONF="$DIR/slurm.conf"
    scancel --full --signal=KILL --user=root 2>/dev/null || true
    for _ in $(seq 100); do [ -z "$(squeue -h -t running,completing 2>/dev/null)" ] && break; sleep 0.1; done
  fi
  stop_daemons
  exit 0
fi
[ "$ACTION" = up ] || usage

[ "$(id -u)" -eq 0 ] || { echo "local_cluster.sh: needs root (the Slurm daemons run as root here)" >&2; exit 77; }
for tool in munged slurmctld slurmd sbatch srun scontrol sinfo; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "local_cluster.sh: $tool is missing (scripts/setup.sh --cluster installs Slurm and munge)" >&2
    exit 77
  }
done
[ -r /etc/munge/munge.key ] || { echo "local_cluster.sh: no /etc/munge/munge.key (reinstall munge)" >&2; exit 1; }

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
stop_daemons  # a previous `up` of the same directory
rm -rf "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/munge" "$DIR/dev"
mkdir -p "$DIR/state" "$DIR/spool/pt-node0" "$DIR/log" "$DIR/munge" "$DIR/dev"
# munged checks that its directories are safe: owned by us, not writable by others.
chmod 711 "$DIR/munge"
install -m 600 /etc/munge/munge.key "$DIR/munge/key"

# Two free TCP ports next to each other for slurmctld and slurmd, away from the defaults
# (6817/6818) so a real Slurm on the machine is never touched.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
PORT=""
for _ in $(seq 50); do
  p=$((20000 + RANDOM % 20000))
  if port_free "$p" && port_free $((p + 1)); then PORT=$p; break; fi
done
[ -n "$PORT" ] || { echo "local_cluster.sh: no two free ports found" >&2; exit 1; }

HOST=$(hostname)
GRES_NODE="" GRES_TYPES=""
if [ "$GPUS" -gt 0 ]; then
  # Character devices (like /dev/null) that Slurm hands out as GPUs: it needs a file per GPU.
  for i in $(seq 0 $((GPUS - 1))); do mknod "$DIR/dev/gpu$i" c 1 3; done
  GRES_NODE="Gres=gpu:$GPUS" GRES_TYPES="GresTypes=gpu"
  printf 'AutoDetect=off\nNodeName=pt-node0 Name=gpu File=%s/dev/gpu[0-%d]\n' "$DIR" $((GPUS - 1)) >"$DIR/gres.conf"
else
  rm -f "$DIR/gres.conf"
fi

cat >"$DIR/slurm.conf" <<EOF
# Written by scripts/slurm/local_cluster.sh: one node on loopback, everything under $DIR.
ClusterName=picotrain-local
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/sock
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# No cgroups (none to be had in a container): processes are tracked by parent, not confined.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobRequeue=1
# Test every pending job each second (default: a minute), so a job starts as soon as it may.
SchedulerParameters=sched_interval=1
$GRES_TYPES
NodeName=pt-node0 NodeHostname=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS $GRES_NODE State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF

fail() {
  echo "local_cluster.sh: $1; logs:" >&2
  tail -n 20 "$DIR"/log/*.log >&2 2>/dev/null || true
  stop_daemons
  exit 1
}

munged --force --key-file="$DIR/munge/key" --socket="$DIR/munge/sock" --pid-file="$DIR/munge/munged.pid" \
  --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/seed" || fail "munged did not start"
export SLURM_CONF="$DIR/slurm.conf"
slurmctld -i || fail "slurmctld did not start"
slurmd -N pt-node0 || fail "slurmd did not start"
for _ in $(seq 300); do
  state=$(sinfo -h -n pt-node0 -o %T 2>/dev/null || true)
  [ "$state" = idle ] && { echo "export SLURM_CONF=$SLURM_CONF"; exit 0; }
  sleep 0.1
done
fail "node pt-node0 is '${state:-unknown}', not idle, after 30 s"
