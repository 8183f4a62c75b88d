#!/bin/bash
# Rendered by hpcrep slurm render; change the options, not this file.
#SBATCH --job-name="run #3 of sweep"
#SBATCH --nodes=2
#SBATCH --ntasks=6
#SBATCH --cpus-per-task=3
#SBATCH --gres=gpu:a100:2
#SBATCH --mem=16G
#SBATCH --exclusive
#SBATCH --constraint=a100&ib
#SBATCH --time=2:00:00
#SBATCH --partition=gpu,debug
#SBATCH --account=proj
#SBATCH --qos=high
#SBATCH --output="logs/out %j.txt"
#SBATCH --error=logs/err-%j.txt
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --mail-type=END
#SBATCH -w node[1-2]
#SBATCH --comment="nightly run"
set -eo pipefail
export OMP_NUM_THREADS=3
echo "hpcrep: job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST}"
# Each rank sees one GPU: its local rank modulo the GPUs of its node.
pin_gpu=(bash -c 'export CUDA_VISIBLE_DEVICES=$(( ${SLURM_LOCALID:-${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-0}}} % 2 )); exec "$@"' hpcrep-rank)
srun --mpi=pmix --ntasks=6 --cpus-per-task=3 "${pin_gpu[@]}" python train.py
