#!/bin/bash
# Rendered by hpcrep slurm render; change the options, not this file.
#SBATCH --job-name=hpcrep
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=1
#SBATCH --time=30
#SBATCH --signal=B:USR1@90
#SBATCH --requeue
#SBATCH --open-mode=append
set -eo pipefail
export OMP_NUM_THREADS=1
echo "hpcrep: job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST}"
# mpirun gets the pre-timeout signal in this shell (B:USR1) and forwards it to every rank.
mpirun -n 4 --map-by ppr:4:node python -m hpcrep fit.py &
launcher=$!
trap 'kill -USR1 "$launcher" 2>/dev/null || true' USR1
status=0
while true; do
  wait "$launcher" && status=0 || status=$?
  kill -0 "$launcher" 2>/dev/null || break  # wait returned for a trapped signal: wait again
done
exit "$status"
