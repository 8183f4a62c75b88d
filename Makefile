# hpcrep: `make test` and `make bench` install what is missing (tools/install.sh), then run.
PY      := .venv/bin/python
MPIRUN  := $(PY) -m hpcrep.launch.mpirun
PYTEST  := $(PY) -m pytest -p no:cacheprovider
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONUNBUFFERED := 1

.PHONY: install test test-unit test-mpi test-launch test-slurm bench clean

install:
	@bash tools/install.sh

test: install
	$(MAKE) --no-print-directory test-unit test-mpi test-launch test-slurm

test-unit:
	$(PYTEST) -q tests/unit

# The collective suite runs as one MPI job at 4 ranks and again at 1 rank.
test-mpi:
	$(MPIRUN) -n 4 -- $(PYTEST) -q tests/mpi
	$(MPIRUN) -n 1 -- $(PYTEST) -q tests/mpi

# Tests that start MPI jobs themselves (runner, failures injected, jobs/ examples).
test-launch:
	$(PYTEST) -q tests/launch

# A real one-node Slurm cluster (slurm/testcluster); needs root and apt.
test-slurm:
	@status=0; started=0; \
	if [ "$$(id -u)" = 0 ]; then bash slurm/testcluster/up.sh && started=1 || echo "test-slurm: cluster did not start"; \
	else echo "test-slurm: not root, no test cluster: tests skip (and fail under CI=true)"; fi; \
	SLURM_CONF=/tmp/hpcrep-slurm/slurm.conf $(PYTEST) -q tests/slurm || status=$$?; \
	[ "$$started" = 0 ] || bash slurm/testcluster/down.sh; exit $$status

# Quick weak-scaling benchmark of ResNet-50, SN-GAN and D4PG at 1 and 2 ranks (2 cores) with
# peers side by side and the allreduce benchmark; report in reports/<timestamp>/.
bench: install
	$(PY) -m hpcrep.cli bench all --quick --ranks 1,2

clean:
	rm -rf .venv reports
