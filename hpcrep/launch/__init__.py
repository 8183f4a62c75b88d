"""Environment detection and launching: which MPI, whether inside Slurm, how to start N ranks."""
