#!/usr/bin/env bash
# Print the mpirun options that run a job across the nodes of tests/cluster (the ones mpirun.sh
# passes, less its hostfile), quoted for the shell, for `hpcrep run --mpi-args`:
#
#   hpcrep run -np 4 -H node1:2,node2:2 --mpi-args "$(tests/cluster/mpi-args.sh)" train.py
#
# For Open MPI 5 (.venv-ulfm), name its mpirun: tests/cluster/mpi-args.sh .venv-ulfm/bin/mpirun
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
options=("${CLUSTER_MPI_OPTIONS[@]}")
if [ -n "${1:-}" ] && "$1" --version 2>/dev/null | grep -q "(Open MPI) 5"; then
  options=("${CLUSTER_MPI5_OPTIONS[@]}")
fi
printf '%q ' "${options[@]}"
echo
