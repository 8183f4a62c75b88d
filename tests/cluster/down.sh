#!/usr/bin/env bash
# Remove everything tests/cluster/up.sh made: processes in the node namespaces, the Slurm daemons,
# the namespaces and their links, the bridge, our /etc/hosts lines and the state directory.
# Idempotent, and safe after a crashed run (it looks for each piece by name). Needs root.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"
need_root

if [ -f "$CLUSTER_DIR/slurm.conf" ]; then
  SLURM_CONF=$CLUSTER_DIR/slurm.conf scancel --user=root >/dev/null 2>&1 || true
fi
# Every process inside a node namespace (slurmd, jobs, orted, ranks), then the controller.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^hpcrep-node[0-9]+$'); do
  pids=$(ip netns pids "$ns" 2>/dev/null)
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null
done
if [ -f "$CLUSTER_DIR/slurmctld.pid" ]; then
  pid=$(cat "$CLUSTER_DIR/slurmctld.pid")
  kill "$pid" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null
fi
sleep 0.2
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^hpcrep-node[0-9]+$'); do
  ip netns delete "$ns" 2>/dev/null
done
for dev in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E '^hpcv-node[0-9]+$'); do
  ip link delete "$dev" 2>/dev/null
done
ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"
sed -i "/$HOSTS_TAG\$/d" /etc/hosts 2>/dev/null
if [ -f "$CLUSTER_DIR/etc-link-created" ] && [ -L /etc/slurm/slurm.conf ]; then rm -f /etc/slurm/slurm.conf; fi
rm -rf "$CLUSTER_DIR"
echo "down.sh: cluster removed"
exit 0
