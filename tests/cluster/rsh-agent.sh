#!/usr/bin/env bash
# Open MPI's launch agent for tests/cluster (--mca plm_rsh_agent): where mpirun would
# `ssh HOST COMMAND...`, run COMMAND in HOST's namespace with HOST's hostname instead.
# Like ssh, the words after HOST form one shell command line.
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"
host=$1; shift
check_node "$host" >&2
on_node "$host" "$*"
