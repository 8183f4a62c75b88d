#!/usr/bin/env bash
# Run an MPI job across the nodes of tests/cluster (start them with up.sh first):
#
#   tests/cluster/mpirun.sh [mpirun options] -- command ...
#   tests/cluster/mpirun.sh -n 4 --map-by ppr:2:node -x HPCREP_THREADS -- python -m hpcrep train.py
#
# Ranks run on node1..nodeN (2 slots each; the hostfile is $CLUSTER_DIR/hostfile), TCP between
# nodes over the bridge and shared memory within a node. mpirun's own options pass through; the
# environment reaches every rank (the launch agent runs on this machine). Needs root.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"
need_root
[ -s "$CLUSTER_DIR/hostfile" ] || { echo "mpirun.sh: no cluster is up ($CLUSTER_DIR/hostfile missing): run tests/cluster/up.sh --nodes N first" >&2; exit 2; }
opts=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
[ $# -gt 0 ] || { echo "mpirun.sh: give the command after --, e.g. mpirun.sh -n 4 -- hostname" >&2; exit 2; }
MPIRUN=${MPIRUN:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# mpirun's connections to its node daemons are idle during a job; with TCP keepalive probing
# them every few seconds, a node that loses its link is noticed (and the job torn down) within
# about 25 s instead of only when the link comes back. Options given on the command line win.
export OMPI_MCA_oob_tcp_keepalive_time=${OMPI_MCA_oob_tcp_keepalive_time:-10}
export OMPI_MCA_oob_tcp_keepalive_intvl=${OMPI_MCA_oob_tcp_keepalive_intvl:-5}
export OMPI_MCA_oob_tcp_keepalive_probes=${OMPI_MCA_oob_tcp_keepalive_probes:-3}
# After a rank has aborted the job, Open MPI 4.1's mpirun waits for the daemon of a node it
# cannot reach (a cut link) until the link returns: mpirun runs under hpcrep's launcher
# supervisor, which ends it HPCREP_LAUNCHER_GRACE seconds (default 10) after a rank's abort
# notice (hpcrep/launch/supervise.py). It runs on $PYTHON, else this checkout's .venv, else python3.
ROOT=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python; else PY=python3; fi
fi
# MPIRUN=.venv-ulfm/bin/mpirun (Open MPI 5, ULFM: add --with-ft ulfm) takes PRRTE's names.
options=("${CLUSTER_MPI_OPTIONS[@]}")
if "$MPIRUN" --version 2>/dev/null | grep -q "(Open MPI) 5"; then
  options=("${CLUSTER_MPI5_OPTIONS[@]}")
fi
exec env PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m hpcrep.launch.supervise -- \
  "$MPIRUN" --allow-run-as-root --oversubscribe --bind-to none \
  --hostfile "$CLUSTER_DIR/hostfile" "${options[@]}" \
  "${opts[@]}" "$@"
