"""Options of a Slurm batch job, validated before anything is rendered or submitted."""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

from hpcrep.errors import SlurmOptionError

# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_TIME = re.compile(r"^(\d+)(:[0-5]?\d){0,2}$|^\d+-\d{1,2}(:[0-5]?\d(:[0-5]?\d)?)?$")
_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LAUNCHERS = ("srun", "mpirun")
MPI_PLUGINS = ("pmix", "pmi2", "pmix_v3", "pmix_v4", "pmix_v5", "none")


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """What a job asks of Slurm and how it launches its ranks.

    Attributes:
        command: the program every rank runs (argv list; quoted with shlex when rendered).
        job_name: ``--job-name``.
        nodes, tasks_per_node, cpus_per_task: the allocation; ranks = nodes * tasks_per_node.
        gpus_per_node: ``--gpus-per-node``; each rank then sees only GPU
            ``local rank % gpus_per_node`` through ``CUDA_VISIBLE_DEVICES``.
        time: ``--time`` in a Slurm format (``M``, ``H:M:S``, ``D-H:M`` ...), or None.
        partition, account, qos: as in sbatch, or None.
        output, error: log paths (``%j`` etc. allowed), or None for Slurm's default.
        modules: ``module load`` these, in order.
        setup: shell lines run before launching (e.g. ``source venv/bin/activate``); they are
            shell code by design and are inserted verbatim.
        env: variables to export (values are quoted).
        launcher: ``srun`` (``srun --mpi=<mpi>``) or ``mpirun``.
        mpi: srun's ``--mpi`` plugin: ``pmix`` for Open MPI, ``pmi2`` for MPICH.
        signal_lead: seconds before the time limit at which ranks receive SIGUSR1 (they
            checkpoint and requeue); None for no signal.
        requeue: allow the job to be requeued (``--requeue``; logs open in append mode).
        checkpoint_dir: exported as ``HPCREP_CHECKPOINT_DIR`` when set.
    """

    command: tuple[str, ...]
    job_name: str = "hpcrep"
    nodes: int = 1
    tasks_per_node: int = 1
    cpus_per_task: int = 1
    gpus_per_node: int = 0
    time: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    output: Optional[str] = None
    error: Optional[str] = None
    modules: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    launcher: str = "srun"
    mpi: str = "pmix"
    signal_lead: Optional[int] = None
    requeue: bool = False
    checkpoint_dir: Optional[str] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "modules", tuple(self.modules))
        object.__setattr__(self, "setup", tuple(self.setup))
        object.__setattr__(self, "env", tuple((str(k), str(v)) for k, v in
                                              (dict(self.env).items() if isinstance(self.env, dict)
                                               else self.env)))
        validate(self)

    @property
    def ntasks(self) -> int:
        """Total ranks."""
        return self.nodes * self.tasks_per_node


def _fail(option: str, expected: str, got: object) -> None:
    raise SlurmOptionError(f"invalid {option}: expected {expected}; got {got!r}")


def validate(o: JobOptions) -> None:
    """Raise :class:`SlurmOptionError` naming the first invalid option of ``o``."""
    if not o.command or not all(isinstance(a, str) and a for a in o.command):
        _fail("command", "the program to run and its arguments (after --)", list(o.command))
    for name in ("nodes", "tasks_per_node", "cpus_per_task"):
        value = getattr(o, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            _fail(name.replace("_", "-"), "an integer >= 1", value)
    if not isinstance(o.gpus_per_node, int) or o.gpus_per_node < 0:
        _fail("gpus-per-node", "an integer >= 0", o.gpus_per_node)
    if o.time is not None and (not _TIME.match(o.time) or not any(c != "0" for c in o.time
                                                                  if c.isdigit())):
        _fail("time", "a non-zero Slurm time such as 30, 1:30:00, 2-00:00 or 1-12:00:00", o.time)
    for name in ("job_name", "partition", "account", "qos"):
        value = getattr(o, name)
        if value is not None and not _NAME.match(value):
            _fail(name.replace("_", "-"), "letters, digits, '_', '.', '+' or '-'", value)
    for name in ("output", "error", "checkpoint_dir"):
        value = getattr(o, name)
        if value is not None and (not value or any(c in value for c in "\n\r\"")):
            _fail(name.replace("_", "-"), "a non-empty path without newlines or double quotes",
                  value)
    for m in o.modules:
        if not m or any(c.isspace() for c in m):
            _fail("module", "one module name without spaces per --module", m)
    for line in o.setup:
        if "\n" in line or "\r" in line:
            _fail("setup line", "a single line (repeat --setup for more)", line)
    for key, _ in o.env:
        if not _ENV_KEY.match(key):
            _fail("env", "NAME=VALUE with NAME a shell identifier", key)
    if o.launcher not in LAUNCHERS:
        _fail("launcher", " or ".join(LAUNCHERS), o.launcher)
    if o.mpi not in MPI_PLUGINS:
        _fail("mpi", ", ".join(MPI_PLUGINS), o.mpi)
    if o.signal_lead is not None and (not isinstance(o.signal_lead, int) or
                                      not 1 <= o.signal_lead <= 65535):
        _fail("signal-lead", "seconds between 1 and 65535 (Slurm checks about every 30 s: "
              "use 60 or more)", o.signal_lead)
