"""What a chaos trial is: a recovery mode, a feature set and a fault schedule, all drawn from a
random generator seeded by ``(seed, index)``, so that ``--replay SEED:INDEX`` runs the same
trial again."""

from __future__ import annotations

import dataclasses
import random
from typing import Optional

# Recovery modes and what each can be given. ``ulfm``: the survivors shrink in the same job
# (.venv-ulfm, ``mpirun --with-ft ulfm``; ``explicit`` is ``@hvd.elastic.run``, ``fit`` is an
# unchanged ``fit`` under ``python -m hpcrep --elastic``). ``relaunch``: ``hpcrep run --elastic``
# relaunches the job from its last commit (.venv). ``resume``: the job aborts and the same command
# is run again, resuming from its HDF5 checkpoint (slurm/examples/train_resumable.py).
MODES = ("ulfm", "relaunch", "resume")
FEATURES = {"ulfm": ("explicit", "fit"), "relaunch": ("sgd",),
            "resume": ("sgd", "mixed", "powersgd")}
# Fault kinds. ``kill``: SIGKILL; ``stop``: SIGSTOP (a hung rank); ``raise``: the rank raises
# (SIGUSR2, see site/sitecustomize.py); ``kill-in-write``: SIGKILL of the writer once a commit's or
# checkpoint's temporary file appears; ``corrupt``: a kill, then the newest checkpoint is damaged
# before the resume; ``double``: a kill, then a second kill during the recovery.
KINDS = {"ulfm": ("kill", "stop", "raise", "kill-in-write", "double"),
         "relaunch": ("kill", "stop", "raise", "kill-in-write", "double"),
         "resume": ("kill", "stop", "raise", "kill-in-write", "corrupt", "double")}
WHEN = ("startup", "first", "mid", "final")
RANKS = {"ulfm": 4, "relaunch": 2, "resume": 2}
# Units of progress a job makes (steps, or epochs for ``relaunch``) and how they are counted:
# see tests/chaos/jobs.py.
UNITS = {"ulfm": 24, "relaunch": 5, "resume": 20}
# The quick subset: one trial per mode, cheap faults, from a fixed seed.
QUICK_SEED = 7
QUICK = (("resume", "sgd", "kill-in-write", "mid"), ("relaunch", "sgd", "kill", "mid"),
         ("ulfm", "explicit", "kill", "mid"))


@dataclasses.dataclass
class Fault:
    """One fault: ``kind`` sent to rank ``victim`` (-1: the writer, or any live rank) once the
    job has done ``units`` units of progress (``when`` names the moment), ``delay`` seconds after
    that point; ``during_recovery``: injected while the job recovers from the fault before."""

    kind: str
    when: str
    units: int
    victim: int
    delay: float
    during_recovery: bool = False


@dataclasses.dataclass
class Trial:
    """A trial: where it comes from (``seed``, ``index``, ``quick``), what it runs and its
    faults; ``damage`` is how a ``corrupt`` trial damages the newest checkpoint."""

    seed: int
    index: int
    quick: bool
    mode: str
    features: str
    kind: str
    ranks: int
    faults: list[Fault]
    damage: Optional[str] = None

    @property
    def name(self) -> str:
        """``SEED:INDEX`` (``:quick`` for the quick subset): what ``--replay`` takes."""
        return f"{self.seed}:{self.index}" + (":quick" if self.quick else "")

    def replay_command(self) -> str:
        """The one command that runs this trial again."""
        return f"PYTHONPATH=$PWD .venv/bin/python -m tests.chaos --replay {self.name}"

    def as_dict(self) -> dict:
        """The trial as plain data (the JSON of its log)."""
        return {**dataclasses.asdict(self), "name": self.name, "replay": self.replay_command()}


def _units_at(rng: random.Random, mode: str, when: str) -> int:
    total = UNITS[mode]
    if when == "startup":
        return 0
    if when == "first":
        return 1
    if when == "final":
        return total - 1
    return rng.randint(2, max(2, total - 3))


def draw(seed: int, index: int, quick: bool = False) -> Trial:
    """Return trial ``index`` of the campaign of ``seed`` (of the quick subset if ``quick``).
    Local; a pure function of its arguments."""
    rng = random.Random(f"chaos:{seed}:{index}:{int(quick)}")
    if quick:
        mode, features, kind, when = QUICK[index % len(QUICK)]
    else:
        mode = rng.choice(MODES)
        features = rng.choice(FEATURES[mode])
        kind = rng.choice(KINDS[mode])
        when = rng.choice(WHEN)
    ranks = RANKS[mode]
    first_kind = {"corrupt": "kill", "double": "kill"}.get(kind, kind)
    victim = -1 if kind == "kill-in-write" else rng.randrange(ranks)
    faults = [Fault(first_kind, when, _units_at(rng, mode, when), victim,
                    round(rng.uniform(0.0, 2.0 if when == "startup" else 0.3), 3))]
    if kind == "double":
        faults.append(Fault("kill", "recovery", 0, -1, round(rng.uniform(0.0, 1.5), 3),
                            during_recovery=True))
    damage = rng.choice(("truncate", "flip")) if kind == "corrupt" else None
    return Trial(seed, index, quick, mode, features, kind, ranks, faults, damage)


def parse_replay(text: str) -> tuple[int, int, bool]:
    """Parse ``SEED:INDEX[:quick]`` into ``(seed, index, quick)``.

    Raises:
        ValueError: ``text`` is not of that form.
    """
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "quick"):
        raise ValueError(f"--replay takes SEED:INDEX or SEED:INDEX:quick (the trial's name in "
                         f"the report); got {text!r}")
    try:
        return int(parts[0]), int(parts[1]), len(parts) == 3
    except ValueError:
        raise ValueError(f"--replay: SEED and INDEX must be integers; got {text!r}") from None
