#!/usr/bin/env bash
# Stop the one-node cluster started by up.sh [STATE_DIR] and remove its state.
# Stops only the daemons whose pid files up.sh's slurm.conf names; leaves munged running
# (other users of munge may exist) unless --all is given.
set -uo pipefail
ALL=0
if [ "${1:-}" = --all ]; then ALL=1; shift; fi
DIR=$(realpath -m "${1:-/tmp/hpcrep-slurm}")
[ -d "$DIR" ] || { echo "down.sh: $DIR not found; nothing to stop"; exit 0; }
export SLURM_CONF="$DIR/slurm.conf"
scancel --user=root 2>/dev/null || true
for name in slurmd slurmctld; do
  pidfile="$DIR/$name.pid"
  if [ -f "$pidfile" ]; then
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
done
if [ -f "$DIR/etc-link-created" ] && [ -L /etc/slurm/slurm.conf ]; then rm -f /etc/slurm/slurm.conf; fi
if [ "$ALL" = 1 ] && [ -f /run/munge/munged.pid ]; then kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true; fi
rm -rf "$DIR"
echo "down.sh: cluster in $DIR stopped"
