#!/bin/bash
# Rendered by hpcrep slurm render; change the options, not this file.
#SBATCH --job-name=resnet50
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --gpus-per-node=4
#SBATCH --time=1-12:00:00
#SBATCH --partition=gpu
#SBATCH --account=proj.42
#SBATCH --qos=normal
#SBATCH --output="logs/run %j.out"
#SBATCH --error=logs/run-%j.err
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
set -eo pipefail
module load gcc/12
module load openmpi/4.1
source $HOME/venv/bin/activate
export DATA='/scratch/my data'
export HPCREP_CHECKPOINT_DIR='/scratch/ckpt'"'"'s'
export OMP_NUM_THREADS=8
echo "hpcrep: job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST}"
# Each rank sees one GPU: its local rank modulo the GPUs of its node.
pin_gpu=(bash -c 'export CUDA_VISIBLE_DEVICES=$(( ${SLURM_LOCALID:-${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-0}}} % 4 )); exec "$@"' hpcrep-rank)
srun --mpi=pmix --ntasks=8 --ntasks-per-node=4 --cpus-per-task=8 "${pin_gpu[@]}" python train.py --note 'a b; rm -rf / $(id)'
