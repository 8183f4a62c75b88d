#!/usr/bin/env bash
# Print the mpirun options that run a job across the nodes of tests/cluster (the ones mpirun.sh
# passes, less its hostfile), quoted for the shell, for `hpcrep run --mpi-args`:
#
#   hpcrep run -np 4 -H node1:2,node2:2 --mpi-args "$(tests/cluster/mpi-args.sh)" train.py
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/common.sh"
printf '%q ' "${CLUSTER_MPI_OPTIONS[@]}"
echo
