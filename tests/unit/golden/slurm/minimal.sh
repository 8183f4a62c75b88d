#!/bin/bash
# Rendered by hpcrep slurm render; change the options, not this file.
#SBATCH --job-name=hpcrep
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
set -eo pipefail
export OMP_NUM_THREADS=1
echo "hpcrep: job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST}"
srun --mpi=pmix --ntasks=1 --ntasks-per-node=1 --cpus-per-task=1 python train.py
