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
echo "heal.sh: $node's link is up"
