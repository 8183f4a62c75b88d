#!/usr/bin/env bash
# Undo tests/cluster/cut.sh: bring NODE's link up again (its rate cap, if any, is kept).
#   tests/cluster/heal.sh node2
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"
need_root
node=${1:?usage: heal.sh NODE (node1..nodeN)}
check_node "$node"
ip link set "$(node_veth "$node")" up
# Slurm marks a node that stopped answering DOWN (after SlurmdTimeout) and keeps it so: resume it.
if [ -f "$CLUSTER_DIR/slurm.conf" ]; then
  state=$(SLURM_CONF=$CLUSTER_DIR/slurm.conf sinfo -h -n "$node" -o %t 2>/dev/null || true)
  case "$state" in down*|drain*|fail*)
    SLURM_CONF=$CLUSTER_DIR/slurm.conf scontrol update NodeName="$node" State=RESUME || true;;
  esac
fi
echo "heal.sh: $node's link is up"
