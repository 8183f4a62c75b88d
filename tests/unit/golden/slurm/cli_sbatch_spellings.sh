#!/bin/bash
# Rendered by hpcrep slurm render; change the options, not this file.
#SBATCH --job-name="a b"
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=1
#SBATCH --time=00:05:00
set -eo pipefail
export OMP_NUM_THREADS=1
echo "hpcrep: job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST}"
srun --mpi=pmix --ntasks=4 --ntasks-per-node=4 --cpus-per-task=1 cmd
