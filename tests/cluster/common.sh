# Shared names of the multi-node test cluster (sourced by the scripts in tests/cluster/).
# Everything the cluster makes is named here, so that down.sh removes exactly that.
CLUSTER_DIR=${HPCREP_CLUSTER_DIR:-/tmp/hpcrep-cluster}   # state: slurm.conf, hostfile, logs
SUBNET_PREFIX=10.213.7                                    # the project's own bridge, nothing else
SUBNET=$SUBNET_PREFIX.0/24
BRIDGE=hpcrep-br0
HEAD_IP=$SUBNET_PREFIX.1                                  # the host's address on the bridge
HEAD_NAME=hpcrep-head
HOSTS_TAG="# hpcrep-cluster"                              # marks our /etc/hosts lines
CLUSTER_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Open MPI 4.1's options for jobs across the nodes: start ranks in the nodes' namespaces (the
# launch agent) and keep MPI traffic on the bridge (TCP between nodes, shared memory within
# one). mpirun.sh passes them; mpi-args.sh prints them for `hpcrep run --mpi-args`.
#
# The nodes are namespaces of this one machine and share its cores, but the hostfile gives each
# node 2 slots, so Open MPI does not see that 4 ranks on 2 nodes oversubscribe the machine and
# keeps waiting ranks spinning (it yields the processor only when ranks outnumber slots). A
# spinning rank takes the core from the one it waits for: mpi_yield_when_idle says what a real
# node of this size would. Measured (docs/measurements.md): a Keras step of the Python path
# (a job under --with-ft ulfm) 32-40 ms with spinning ranks, 5-9 ms yielding.
CLUSTER_MPI_OPTIONS=(--mca plm_rsh_agent "$CLUSTER_SCRIPTS/rsh-agent.sh"
  --mca btl tcp,self,vader --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET"
  --mca mpi_yield_when_idle 1)

# Open MPI 5's (the .venv-ulfm of `make ulfm`): PRRTE starts the node daemons and names its
# launch agent plm_ssh_agent; shared memory is "sm". mpirun.sh picks these for a 5.x mpirun.
CLUSTER_MPI5_OPTIONS=(--prtemca plm_ssh_agent "$CLUSTER_SCRIPTS/rsh-agent.sh"
  --prtemca oob_tcp_if_include "$SUBNET"
  --mca btl tcp,self,sm --mca btl_tcp_if_include "$SUBNET" --mca mpi_yield_when_idle 1)

node_ip()   { echo "$SUBNET_PREFIX.$((10 + ${1#node}))"; }   # node3 -> 10.213.7.13
node_ns()   { echo "hpcrep-$1"; }                            # its network namespace
node_veth() { echo "hpcv-$1"; }                              # host end of its link

# The nodes up.sh made, one name a line (empty when the cluster is down).
cluster_nodes() { [ -f "$CLUSTER_DIR/nodes" ] && cat "$CLUSTER_DIR/nodes" || true; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "$(basename "$0"): needs root (network namespaces, a bridge, tc, Slurm daemons); run it with sudo or as root" >&2
    exit 3
  fi
}

check_node() {
  local node=$1
  case "$node" in node[1-9]|node[1-9][0-9]) ;; *)
    echo "$(basename "$0"): '$node' is not a node name: the cluster's nodes are node1..nodeN" >&2; exit 2;;
  esac
  ip netns list | awk '{print $1}' | grep -qx "$(node_ns "$node")" || {
    echo "$(basename "$0"): $node is not up (no namespace $(node_ns "$node")); start the cluster with tests/cluster/up.sh --nodes N" >&2
    exit 2; }
}

# Run a shell command line "on" a node: in its network namespace, with its own hostname and a
# private mount namespace (for slurmd's node-local TmpFS). nsenter, not `ip netns exec`: the latter
# remounts /sys, which hides /sys/fs/cgroup from slurmd.
on_node() {
  local node=$1; shift
  nsenter --net="/run/netns/$(node_ns "$node")" unshare --uts --mount bash -c "hostname $node && $*"
}
