#!/usr/bin/env bash
# Start a multi-node cluster on this one machine: N "nodes", each a network namespace with its own
# hostname (node1..nodeN) and address on a bridge this script makes, optionally with a capped link,
# plus a Slurm controller (on the host) and one slurmd per node.
#
#   tests/cluster/up.sh --nodes N [--link RATE] [--no-slurm]
#
#   --nodes N     how many nodes (1-20; default 2). node1..nodeN resolve by name (/etc/hosts)
#                 from the host and from every node.
#   --link RATE   cap each node's link in both directions (tc tbf): 1gbit, 2gbit, 10gbit, 500mbit...
#                 Default: uncapped.
#   --no-slurm    only the network (for mpirun.sh); no Slurm daemons.
#
# Then: tests/cluster/mpirun.sh -n 4 -- CMD    (MPI across the nodes)
#       SLURM_CONF=/tmp/hpcrep-cluster/slurm.conf sbatch -N 2 --ntasks-per-node 2 job.sh
#       tests/cluster/cut.sh node2 / heal.sh node2 (fault injection), tests/cluster/down.sh.
# Idempotent: run again with the same options and it checks and returns; with other options it
# rebuilds. Needs root. Exit codes: 0 up; 3 not root or a capability missing; 1 failed to start.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"

NODES=2; LINK=""; SLURM=1
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=${2:?--nodes needs a number}; shift 2;;
    --link) LINK=${2:?--link needs a rate such as 1gbit}; shift 2;;
    --no-slurm) SLURM=0; shift;;
    -h|--help) sed -n '2,21p' "$0"; exit 0;;
    *) echo "up.sh: unknown option '$1' (see --help)" >&2; exit 2;;
  esac
done
[[ "$NODES" =~ ^[0-9]+$ ]] && [ "$NODES" -ge 1 ] && [ "$NODES" -le 20 ] || {
  echo "up.sh: --nodes must be a whole number from 1 to 20, got '$NODES'" >&2; exit 2; }
if [ -n "$LINK" ] && ! [[ "$LINK" =~ ^[0-9]+(\.[0-9]+)?(k|m|g)?bit$ ]]; then
  echo "up.sh: --link must be a rate such as 500mbit, 1gbit or 10gbit, got '$LINK'" >&2; exit 2
fi
need_root

# --- what this needs: install what apt can give, then check the kernel can do it -------------
PACKAGES="iproute2 iputils-ping util-linux openmpi-bin libopenmpi-dev"
[ "$SLURM" = 1 ] && PACKAGES="$PACKAGES slurmctld slurmd slurm-client munge libpmix-dev"
missing=()
for p in $PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || { echo "up.sh: missing ${missing[*]} and no apt-get to install them" >&2; exit 3; }
  echo "up.sh: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

shape="nodes=$NODES link=${LINK:-none} slurm=$SLURM"
if [ -f "$CLUSTER_DIR/shape" ] && [ "$(cat "$CLUSTER_DIR/shape")" = "$shape" ]; then
  ok=1
  for i in $(seq "$NODES"); do
    ip netns exec "$(node_ns node$i)" true 2>/dev/null || ok=0
  done
  if [ "$SLURM" = 1 ] && [ "$ok" = 1 ]; then
    idle=$(SLURM_CONF=$CLUSTER_DIR/slurm.conf sinfo -h -N -o '%t' 2>/dev/null | grep -cE '^(idle|mix|alloc)' || true)
    [ "$idle" = "$NODES" ] || ok=0
  fi
  if [ "$ok" = 1 ]; then echo "up.sh: cluster already up ($shape)"; exit 0; fi
fi
bash "$HERE/down.sh" >/dev/null 2>&1 || true

fail() { echo "up.sh: $1" >&2; [ -n "${HPCREP_CLUSTER_KEEP_ON_FAIL:-}" ] && exit "${2:-1}"; echo "up.sh: cleaning up: tests/cluster/down.sh" >&2; bash "$HERE/down.sh" >/dev/null 2>&1 || true; exit "${2:-1}"; }
mkdir -p "$CLUSTER_DIR/log"
echo "$shape" > "$CLUSTER_DIR/shape"
: > "$CLUSTER_DIR/nodes"

# --- the network: a bridge, one namespace and veth link per node ----------------------------
ip link add "$BRIDGE" type bridge 2>/dev/null || fail "cannot create a Linux bridge (ip link add type bridge): this kernel or sandbox lacks it" 3
ip addr add "$HEAD_IP/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
cap() {  # cap() DEV: limit DEV's egress to $LINK with a token bucket
  local dev=$1 ns=${2:-}
  local bytes_per_s
  bytes_per_s=$(awk -v r="$LINK" 'BEGIN { n = r + 0; u = r; sub(/^[0-9.]+/, "", u);
    m = (u ~ /^k/) ? 1e3 : (u ~ /^m/) ? 1e6 : (u ~ /^g/) ? 1e9 : 1; printf "%d", n * m / 8 }')
  local burst=$(( bytes_per_s / 100 > 65536 ? bytes_per_s / 100 : 65536 ))  # 10 ms at rate
  ${ns:+ip netns exec "$ns"} tc qdisc replace dev "$dev" root tbf rate "$LINK" burst "$burst" latency 50ms \
    || fail "cannot cap $dev with tc tbf (is the sch_tbf qdisc available?)" 3
}
for i in $(seq "$NODES"); do
  node=node$i; ns=$(node_ns $node); veth=$(node_veth $node)
  ip netns add "$ns" || fail "cannot create network namespace $ns (ip netns add)" 3
  echo "$node" >> "$CLUSTER_DIR/nodes"
  ip link add "$veth" type veth peer name "$veth-in" || fail "cannot create a veth pair" 3
  ip link set "$veth-in" netns "$ns"
  ip netns exec "$ns" ip link set "$veth-in" name eth0
  ip netns exec "$ns" ip addr add "$(node_ip $node)/24" dev eth0
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip link set eth0 up
  ip link set "$veth" master "$BRIDGE"
  ip link set "$veth" up
  if [ -n "$LINK" ]; then cap "$veth"; cap eth0 "$ns"; fi
done

# --- names: /etc/hosts lines of ours (shared by every namespace), a hostfile for mpirun --------
sed -i "/$HOSTS_TAG\$/d" /etc/hosts
{
  echo "$HEAD_IP $HEAD_NAME $HOSTS_TAG"
  for i in $(seq "$NODES"); do echo "$(node_ip node$i) node$i $HOSTS_TAG"; done
} >> /etc/hosts
for i in $(seq "$NODES"); do echo "node$i slots=2"; done > "$CLUSTER_DIR/hostfile"
for i in $(seq "$NODES"); do
  ip netns exec "$(node_ns node$i)" ping -c 1 -W 2 "$HEAD_NAME" >/dev/null 2>&1 \
    || fail "node$i cannot reach $HEAD_NAME ($HEAD_IP) over the bridge"
done

# --- Slurm: slurmctld on the host, one slurmd per node inside its namespace ---------------
if [ "$SLURM" = 1 ]; then
  mkdir -p "$CLUSTER_DIR/state" "$CLUSTER_DIR/spool"
  # The nodes declare 8 CPUs each so that tests can place 4 ranks on one, but they share this
  # machine's cores: as with mpirun (common.sh), Open MPI would keep waiting ranks spinning.
  # The task prolog makes every srun task's MPI yield, as a real node of this size would need.
  cat > "$CLUSTER_DIR/task-prolog.sh" <<'PROLOG'
#!/bin/sh
echo "export OMPI_MCA_mpi_yield_when_idle=1"
PROLOG
  chmod 755 "$CLUSTER_DIR/task-prolog.sh"
  cat > "$CLUSTER_DIR/slurm.conf" <<CONF
ClusterName=hpcrep
SlurmctldHost=$(hostname -s)($HEAD_IP)
SlurmUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation=$CLUSTER_DIR/state
SlurmdSpoolDir=$CLUSTER_DIR/spool/%n
TmpFS=$CLUSTER_DIR/node-tmp
SlurmctldPidFile=$CLUSTER_DIR/slurmctld.pid
SlurmdPidFile=$CLUSTER_DIR/slurmd-%n.pid
SlurmctldLogFile=$CLUSTER_DIR/log/slurmctld.log
SlurmdLogFile=$CLUSTER_DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog=$CLUSTER_DIR/task-prolog.sh
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=pmix
JobCompType=jobcomp/filetxt
JobCompLoc=$CLUSTER_DIR/log/jobcomp.log
JobRequeue=1
ReturnToService=2
KillWait=5
MinJobAge=600
SchedulerType=sched/backfill
NodeName=node[1-$NODES] CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP
CONF
  if [ ! -e /etc/slurm/slurm.conf ]; then
    mkdir -p /etc/slurm && ln -s "$CLUSTER_DIR/slurm.conf" /etc/slurm/slurm.conf
    touch "$CLUSTER_DIR/etc-link-created"
  fi
  export SLURM_CONF=$CLUSTER_DIR/slurm.conf
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 status=none
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge && chown munge:munge /run/munge
  if ! munge -n </dev/null >/dev/null 2>&1; then
    # munged outlives the cluster (down.sh leaves it running), so it must not inherit our file
    # descriptors: with `flock LOCK -c 'up.sh ...; down.sh'` it would hold LOCK for its whole life.
    (for fd in $(seq 3 63); do eval "exec $fd>&-"; done 2>/dev/null
     exec runuser -u munge -- /usr/sbin/munged)
    for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  /usr/sbin/slurmctld -f "$SLURM_CONF" -i || fail "slurmctld did not start; see $CLUSTER_DIR/log/slurmctld.log"
  for i in $(seq "$NODES"); do
    # Each node's TmpFS is its own (Slurm's PMIx plugin makes per-step directories there whose
    # names would collide between nodes); the rest of the file system stays shared, like NFS.
    mkdir -p "$CLUSTER_DIR/spool/node$i" "$CLUSTER_DIR/tmp-node$i" "$CLUSTER_DIR/node-tmp"
    on_node node$i "mount --bind '$CLUSTER_DIR/tmp-node$i' '$CLUSTER_DIR/node-tmp' && exec /usr/sbin/slurmd -f '$SLURM_CONF' -N node$i" \
      || fail "slurmd did not start on node$i; see $CLUSTER_DIR/log/slurmd-node$i.log"
  done
  state=""
  for _ in $(seq 150); do
    state=$(sinfo -h -N -o '%N=%t' 2>/dev/null | sort -u | tr '\n' ' ' || true)
    [ "$(echo "$state" | grep -oE '=idle' | wc -l)" = "$NODES" ] && break
    sleep 0.2
  done
  if [ "$(echo "$state" | grep -oE '=idle' | wc -l)" != "$NODES" ]; then
    tail -n 20 "$CLUSTER_DIR"/log/*.log >&2 || true
    fail "Slurm nodes not idle after 30 s (states: ${state:-none})"
  fi
  echo "export SLURM_CONF=$SLURM_CONF" > "$CLUSTER_DIR/env.sh"
fi
echo "up.sh: $NODES node(s) up on $BRIDGE ($SUBNET), link ${LINK:-uncapped}$([ "$SLURM" = 1 ] && echo ", Slurm: export SLURM_CONF=$CLUSTER_DIR/slurm.conf")"
