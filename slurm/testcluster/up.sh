#!/usr/bin/env bash
# Start a one-node Slurm cluster on this machine for tests/slurm (needs root and apt).
#   slurm/testcluster/up.sh [STATE_DIR]     (default /tmp/hpcrep-slurm)
# Installs slurmctld, slurmd, slurm-client, munge and libpmix-dev when missing, writes
# STATE_DIR/slurm.conf (and /etc/slurm/slurm.conf when none exists, so plain `sinfo` works),
# starts munged, slurmctld and slurmd, and waits for the node to be idle.
# Clients find the cluster with: export SLURM_CONF=STATE_DIR/slurm.conf
# Exit codes: 0 up; 3 not root or no apt (the caller skips); other: failed to start.
set -euo pipefail
DIR=$(realpath -m "${1:-/tmp/hpcrep-slurm}")
if [ "$(id -u)" != 0 ]; then echo "up.sh: needs root (starts daemons, may apt-get install)" >&2; exit 3; fi

PACKAGES="slurmctld slurmd slurm-client munge libpmix-dev openmpi-bin"
missing=()
for p in $PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || { echo "up.sh: no apt-get to install ${missing[*]}" >&2; exit 3; }
  echo "up.sh: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

HOST=$(hostname -s)
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
cat > "$DIR/slurm.conf" <<CONF
ClusterName=hpcrep
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=pmix
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.log
JobRequeue=1
ReturnToService=2
KillWait=5
MinJobAge=300
SchedulerType=sched/backfill
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP
CONF
if [ ! -e /etc/slurm/slurm.conf ]; then
  mkdir -p /etc/slurm
  ln -s "$DIR/slurm.conf" /etc/slurm/slurm.conf
  touch "$DIR/etc-link-created"
fi
export SLURM_CONF="$DIR/slurm.conf"

# munge: a key, then the daemon as the munge user.
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 status=none
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge && chown munge:munge /run/munge
if ! munge -n </dev/null >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
fi

pkill_pidfile() { [ -f "$1" ] && kill "$(cat "$1")" 2>/dev/null || true; }
pkill_pidfile "$DIR/slurmctld.pid"; pkill_pidfile "$DIR/slurmd.pid"; sleep 0.5
/usr/sbin/slurmctld -f "$SLURM_CONF" -i
/usr/sbin/slurmd -f "$SLURM_CONF"
for _ in $(seq 100); do
  state=$(sinfo -h -N -o %t 2>/dev/null | head -1 || true)
  if [ "$state" = idle ]; then
    echo "up.sh: one-node cluster up ($HOST, state $state); export SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 0.2
done
echo "up.sh: node not idle after 20 s (state '${state:-?}'); logs in $DIR/log" >&2
tail -20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
exit 1
