"""Options of a Slurm batch job, validated before anything is rendered or submitted."""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Optional

from hpcrep.errors import SlurmOptionError

# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_TIME = re.compile(r"^(\d+)(:[0-5]?\d){0,2}$|^\d+-\d{1,2}(:[0-5]?\d(:[0-5]?\d)?)?$")
_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")
_NAMES = re.compile(r"^[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*$")  # partition: a comma list
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GRES = re.compile(r"^[A-Za-z0-9_.:/+-]+(,[A-Za-z0-9_.:/+-]+)*$")
_MEM = re.compile(r"^\d+[KMGT]?B?$", re.IGNORECASE)
# sbatch --signal=[{R|B}:]<sig_num>[@sig_time]; R and B may both be given.
_SIGNAL = re.compile(r"^(?:(?P<flags>[RB]{1,2}):)?(?P<sig>(?:SIG)?[A-Z0-9]+)(?:@(?P<time>\d+))?$")
# One sbatch option for the pass-through: --name, --name=value, -x or -x value.
_PASS = re.compile(r"^(?P<name>--[A-Za-z][A-Za-z0-9-]*|-[A-Za-z])(?:(?P<sep>[= ])(?P<value>.*))?$")
LAUNCHERS = ("srun", "mpirun")
MPI_PLUGINS = ("pmix", "pmi2", "pmix_v3", "pmix_v4", "pmix_v5", "none")


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """What a job asks of Slurm and how it launches its ranks.

    Attributes:
        command: the program every rank runs (argv list; quoted with shlex when rendered).
        job_name: ``--job-name`` (any printable text; quoted when it has spaces).
        nodes, tasks_per_node, cpus_per_task: the allocation; ranks = nodes * tasks_per_node
            unless ``ntasks`` is given. ``tasks_per_node`` None: Slurm spreads ``ntasks``.
        ntasks: ``--ntasks`` (total ranks), or None for nodes * tasks_per_node.
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
        gres: ``--gres`` (e.g. ``gpu:4``); ``gpu[:type]:N`` also pins each rank to one GPU.
        mem: ``--mem`` (e.g. ``16G``). exclusive: ``--exclusive``. constraint: ``--constraint``.
        signal_lead: seconds before the time limit at which ranks receive SIGUSR1 (they
            checkpoint and requeue); None for no signal.
        signal: any other ``--signal`` value, rendered as given (hpcrep's checkpointing
            watches SIGUSR1: give that as ``signal_lead``).
        sbatch_options: further ``#SBATCH`` lines, one option each (``--mail-type=END``,
            ``-w node1``, ``comment=my run``); rendered by :func:`normalize_sbatch_option`.
        requeue: allow the job to be requeued (``--requeue``; logs open in append mode).
        checkpoint_dir: exported as ``HPCREP_CHECKPOINT_DIR`` when set.
    """

    command: tuple[str, ...]
    job_name: str = "hpcrep"
    nodes: int = 1
    tasks_per_node: Optional[int] = 1
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
    ntasks: Optional[int] = None
    gres: Optional[str] = None
    mem: Optional[str] = None
    exclusive: bool = False
    constraint: Optional[str] = None
    signal: Optional[str] = None
    sbatch_options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "sbatch_options", tuple(self.sbatch_options))
        object.__setattr__(self, "modules", tuple(self.modules))
        object.__setattr__(self, "setup", tuple(self.setup))
        object.__setattr__(self, "env", tuple((str(k), str(v)) for k, v in
                                              (dict(self.env).items() if isinstance(self.env, dict)
                                               else self.env)))
        validate(self)

    @property
    def tasks(self) -> int:
        """Total ranks: ``ntasks``, or nodes * tasks_per_node."""
        return self.ntasks if self.ntasks is not None else self.nodes * (self.tasks_per_node or 1)

    @property
    def sbatch_lines(self) -> tuple[str, ...]:
        """The pass-through options as rendered (``--name=value``, spaces quoted)."""
        return tuple(normalize_sbatch_option(o) for o in self.sbatch_options)

    @property
    def gpus_to_pin(self) -> int:
        """GPUs per node to spread the ranks over: ``gpus_per_node``, or N of ``gres=gpu:N``."""
        if self.gpus_per_node:
            return self.gpus_per_node
        for item in (self.gres or "").split(","):
            parts = item.split(":")
            if parts[0] == "gpu" and len(parts) > 1 and parts[-1].isdigit():
                return int(parts[-1])
        return 0


def _fail(option: str, expected: str, got: object) -> None:
    raise SlurmOptionError(f"invalid {option}: expected {expected}; got {got!r}")


# Characters sbatch reads specially on an #SBATCH line even inside quotes, or that end the line.
_UNSAFE_IN_SBATCH = ('"', "\\", "\n", "\r", "\0")


def check_sbatch_value(option: str, value: str) -> None:
    """Refuse an ``#SBATCH`` value that quoting cannot make safe (newlines, double quotes,
    backslashes, control characters). Spaces and ``#`` are fine: the renderer quotes them."""
    if not value or any(c in value for c in _UNSAFE_IN_SBATCH) or not value.isprintable():
        _fail(option, "non-empty printable text without double quotes, backslashes or newlines "
              "(spaces are fine: the value is quoted)", value)


def parse_signal(value: str) -> tuple[Optional[int], Optional[str]]:
    """Split sbatch's ``--signal`` value: ``(lead, None)`` for SIGUSR1 (hpcrep's checkpoint
    signal; ``B:`` is added for the mpirun launcher), else ``(None, value)`` to pass through.

    Raises:
        SlurmOptionError: not of the form ``[{R|B}:]<signal>[@<seconds>]``.
    """
    m = _SIGNAL.match(value.strip().upper())
    if not m:
        _fail("signal", "[{R|B}:]<signal>[@<seconds>], e.g. USR1@120", value)
    if m.group("sig") in ("USR1", "SIGUSR1", "10") and "R" not in (m.group("flags") or ""):
        return int(m.group("time") or 60), None  # sbatch's default lead is 60 s
    return None, value


# Options hpcrep sets itself: the pass-through must not set them a second time.
OWN_OPTIONS = {"--job-name": "-J", "--nodes": "-N", "--ntasks": "-n", "--ntasks-per-node": "",
               "--cpus-per-task": "-c", "--gpus-per-node": "", "--gres": "", "--time": "-t",
               "--partition": "-p", "--account": "-A", "--qos": "-q", "--output": "-o",
               "--error": "-e", "--mem": "", "--exclusive": "", "--constraint": "-C",
               "--signal": "", "--requeue": "", "--open-mode": ""}


def normalize_sbatch_option(text: str) -> str:
    """Return one pass-through ``#SBATCH`` option in the form it is rendered (values with
    spaces quoted). ``mail-type=END`` is taken as ``--mail-type=END``.

    Raises:
        SlurmOptionError: not exactly one option, an unsafe value, or an option that has its
            own flag in hpcrep (use that flag instead).
    """
    stripped = text.strip()
    if stripped and not stripped.startswith("-"):
        stripped = "--" + stripped
    m = _PASS.match(stripped)
    if not m or "\n" in text or "\r" in text:
        _fail("sbatch-option", "one sbatch option such as --mail-type=END or -w node1 (repeat "
              "--sbatch-option for more)", text)
    name, value = m.group("name"), m.group("value")
    short = {v: k for k, v in OWN_OPTIONS.items() if v}
    own = short.get(name, name)
    if own in OWN_OPTIONS:
        _fail("sbatch-option", f"an option hpcrep does not set itself; use hpcrep's {own} "
              "instead", text)
    if value is None:
        return name
    if value.strip() != value or not value or re.search(r"\s--?[A-Za-z]", value):
        _fail("sbatch-option", "one option and its value (repeat --sbatch-option for more)",
              text)
    check_sbatch_value(f"sbatch-option {name}", value)
    sep = "=" if name.startswith("--") else " "
    return f"{name}{sep}{quote_sbatch(value)}"


def quote_sbatch(value: str) -> str:
    """Double-quote an ``#SBATCH`` value that holds spaces or ``#`` (sbatch strips the quotes)."""
    return f'"{value}"' if any(c.isspace() or c == "#" for c in value) else value


def validate(o: JobOptions) -> None:
    """Raise :class:`SlurmOptionError` naming the first invalid option of ``o``."""
    if not o.command or not all(isinstance(a, str) and a for a in o.command):
        _fail("command", "the program to run and its arguments (after --)", list(o.command))
    for name in ("nodes", "tasks_per_node", "cpus_per_task", "ntasks"):
        value = getattr(o, name)
        if value is None and name in ("tasks_per_node", "ntasks"):
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            _fail(name.replace("_", "-").replace("tasks-per", "ntasks-per"), "an integer >= 1",
                  value)
    if o.ntasks is None and o.tasks_per_node is None:
        _fail("ntasks-per-node", "a number when --ntasks is not given", None)
    if o.ntasks is not None and o.ntasks < o.nodes:
        _fail("ntasks", f"at least one task per node (--nodes={o.nodes})", o.ntasks)
    if o.ntasks is not None and o.tasks_per_node is not None and (
            o.ntasks > o.nodes * o.tasks_per_node):
        _fail("ntasks", f"at most nodes x ntasks-per-node = {o.nodes * o.tasks_per_node}",
              o.ntasks)
    if not isinstance(o.gpus_per_node, int) or o.gpus_per_node < 0:
        _fail("gpus-per-node", "an integer >= 0", o.gpus_per_node)
    if o.time is not None and (not _TIME.match(o.time) or not any(c != "0" for c in o.time
                                                                  if c.isdigit())):
        _fail("time", "a non-zero Slurm time such as 30, 1:30:00, 2-00:00 or 1-12:00:00", o.time)
    check_sbatch_value("job-name", o.job_name)
    for name, pattern in (("partition", _NAMES), ("account", _NAME), ("qos", _NAME)):
        value = getattr(o, name)
        if value is not None and not pattern.match(value):
            _fail(name, "letters, digits, '_', '.', '+' or '-'"
                  + (" (a comma list)" if name == "partition" else ""), value)
    if o.gres is not None and not _GRES.match(o.gres):
        _fail("gres", "a comma list such as gpu:4 or gpu:a100:2", o.gres)
    if o.mem is not None and not _MEM.match(o.mem):
        _fail("mem", "a size such as 16000, 16G or 512M", o.mem)
    if o.constraint is not None:
        check_sbatch_value("constraint", o.constraint)
    if o.signal is not None:
        if o.signal_lead is not None:
            _fail("signal", "either signal_lead (SIGUSR1) or another signal, not both", o.signal)
        if not _SIGNAL.match(o.signal.upper()):
            _fail("signal", "[{R|B}:]<signal>[@<seconds>], e.g. USR2@300", o.signal)
    for line in o.sbatch_options:
        normalize_sbatch_option(line)
    for name in ("output", "error"):
        if getattr(o, name) is not None:
            check_sbatch_value(name, getattr(o, name))
    if o.checkpoint_dir is not None and (not o.checkpoint_dir or any(
            c in o.checkpoint_dir for c in "\n\r\"")):
        _fail("checkpoint-dir", "a non-empty path without newlines or double quotes",
              o.checkpoint_dir)
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


def advice(options: JobOptions, environ: Mapping[str, str]) -> list[str]:
    """Return warnings about options that render a valid script that will not do what the
    user most likely wants, one line each (``environ``: the submitting shell's, which ``sbatch``
    passes on). Pure."""
    lines = []
    checkpointed = (options.checkpoint_dir or "HPCREP_CHECKPOINT_DIR" in dict(options.env)
                    or environ.get("HPCREP_CHECKPOINT_DIR"))
    if options.signal_lead is not None and not checkpointed:
        lines.append(
            f"--signal USR1@{options.signal_lead} without --checkpoint-dir: SIGUSR1 ends every "
            "rank (exit 138) unless the script handles it itself, and a transparent script "
            "(python -m hpcrep) saves on it only with HPCREP_CHECKPOINT_DIR. Give "
            "--checkpoint-dir DIR, or let the script checkpoint on the signal "
            "(hpcrep.checkpoint.PreemptionSignal, or CheckpointCallback for fit).")
    return lines
