#!/usr/bin/env bash
# Fault injection: take NODE's link down (its veth on the bridge), as if its network cable were
# pulled. Processes on NODE keep running but reach nothing; tests/cluster/heal.sh NODE undoes it.
#   tests/cluster/cut.sh node2
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"
need_root
node=${1:?usage: cut.sh NODE (node1..nodeN)}
check_node "$node"
ip link set "$(node_veth "$node")" down
echo "cut.sh: $node's link is down"
