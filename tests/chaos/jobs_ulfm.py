"""The ULFM jobs of a chaos trial (.venv-ulfm, ``mpirun --with-ft ulfm`` with the heartbeat
detector): the survivors of a fault shrink and finish in the same ``mpirun``.

Their reference is the planned resize from the same commits (as tests/launch/test_ulfm_elastic.py
builds it): the job without ULFM, stopped by its own kill right after the commit the survivors
went back to, then launched again on as many ranks as survived, from that commit on disk; one
stage per recovery.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

import numpy as np

from hpcrep.launch.mpirun import mpirun_command, ulfm_arguments

from tests.chaos.jobs import LAUNCH, ROOT, Job, base_env, load_npz, read_text

VENV = ROOT / ".venv-ulfm"
DETECT_TIMEOUT = 3.0
PASSED = ("PYTHONPATH", "HPCREP_THREADS", "CHAOS_RAISE_ON_USR2", "HPCREP_ELASTIC_DIR",
          "KILL_RANK", "KILL_AT", "KILL_EPOCH", "PYTHONUNBUFFERED")


def _mpirun(ranks: int, job: list[str], env: dict, ulfm: bool = True) -> list[str]:
    passed = [arg for name in PASSED if name in env for arg in ("-x", name)]
    extra = [*(ulfm_arguments(DETECT_TIMEOUT) if ulfm else []), *passed]
    return mpirun_command(ranks, job, mpirun=str(VENV / "bin" / "mpirun"), extra=extra)


class UlfmExplicitJob(Job):
    """tests/launch/ulfm_elastic_job.py (``@hvd.elastic.run``) on 4 ranks: 1536 rows, 2 epochs,
    12 steps of 4 x 32 rows each, a commit every 4 steps; a per-row ledger (``--ledger``)."""

    abort_ok = False
    reruns = 0
    ROWS, EPOCHS, BATCH, SEED = 1536, 2, 32, 0

    def _job(self, out: Path, *extra: str) -> list[str]:
        return [str(VENV / "bin" / "python"), str(LAUNCH / "ulfm_elastic_job.py"), "--out",
                str(out), "--rows", str(self.ROWS), "--test-rows", "500", "--epochs",
                str(self.EPOCHS), "--batch", str(self.BATCH), "--commit-every", "4", "--seed",
                str(self.SEED), *extra]

    def _env(self) -> dict:
        if self.trial.kind == "kill-in-write":
            return base_env(HPCREP_ELASTIC_DIR=str(self.write_dir()))
        return base_env()

    def command(self, attempt: int) -> tuple[list[str], dict, Path]:
        env = self._env()
        self.write_dir().mkdir(exist_ok=True)
        job = self._job(self.out, "--print-steps", "--ledger")
        return _mpirun(self.trial.ranks, job, env), env, ROOT

    def write_dir(self) -> Path:
        return self.out / "commits"

    def progress(self) -> int:
        return len(re.findall(r"rank 0 step \d+", read_text(self.out / "stdout-0.txt")))

    def recovering(self, attempt: int, since: float) -> bool:
        return "survivors go on" in read_text(self.out / "stderr-0.txt")

    def _results(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted(self.out.glob("rank*.json"))]

    def weights(self) -> list[dict[str, np.ndarray]]:
        return [load_npz(p) for p in sorted(self.out.glob("weights-rank*.npz"))]

    def chain(self) -> Optional[list[tuple[int, int, int]]]:
        """The stages of the planned resize: ``(ranks, epoch, rows)``, each stage killed right
        after the commit at ``(epoch, rows)`` (the last one never: epoch -1)."""
        results = self._results()
        if not results:
            return None
        first = min(results, key=lambda r: r["rank"])
        sizes = [first["first_size"]] + [r["new_size"] for r in first["recoveries"]]
        points = [tuple(at[:2]) for at in first["resumes"][1:]]
        if len(points) != len(sizes) - 1:
            return None
        return [(n, *(points[i] if i < len(points) else (-1, -1))) for i, n in enumerate(sizes)]

    def reference_key(self) -> Optional[str]:
        chain = self.chain()
        if chain is None:
            return None
        return "ulfm-explicit-" + "-".join(f"{n}@{e}.{r}" for n, e, r in chain)

    def reference_command(self, out: Path) -> list[tuple[list[str], dict, Path]]:
        env = base_env(HPCREP_ELASTIC_DIR=str(out / "commits"))
        (out / "commits").mkdir(parents=True, exist_ok=True)
        launches = []
        for i, (n, epoch, rows) in enumerate(self.chain() or []):
            stage = out / f"stage{i}"
            stage.mkdir(exist_ok=True)
            kill = ["--victim", "0", "--kill-epoch", str(epoch), "--kill-rows", str(rows)] \
                if epoch >= 0 else []
            launches.append((_mpirun(n, self._job(stage, *kill), env, ulfm=False), env, ROOT))
        return launches

    def reference_weights(self, out: Path) -> dict[str, np.ndarray]:
        last = sorted(out.glob("stage*"))[-1]
        return load_npz(last / "weights-rank0.npz")

    def recovery_seconds(self, fault_time: float) -> Optional[float]:
        firsts = []
        for res in self._results():
            after = [t for _e, _r, t in res["resumes"] if t > fault_time]
            ends = [t for t in res["step_ends"] if after and t > after[0]]
            if ends:
                firsts.append(min(ends))
        return max(firsts) - fault_time if firsts else None

    def ledger(self) -> Optional[dict]:
        """Rows every epoch trained in what the model kept: each process's steps, less those
        past a commit it went back to; a dead process's, less those past the first commit the
        survivors went back to after its last step."""
        results = self._results()
        if not results:
            return None
        resumes = sorted({(t, e, r) for res in results for e, r, t in res["resumes"][1:]})
        kept: dict[int, list[int]] = {}
        for path in self.out.glob("ledger-*.jsonl"):
            steps, last = [], 0.0
            for line in read_text(path).splitlines():
                entry = json.loads(line)
                last = entry["t"]
                if "resume" in entry:
                    steps = [s for s in steps if tuple(s[:2]) < tuple(entry["resume"])]
                else:
                    steps.append(entry["fed"])
            survivor = (self.out / f"{path.stem[len('ledger-'):]}.json").exists()
            later = [(e, r) for t, e, r in resumes if t > last]
            if not survivor and later:
                steps = [s for s in steps if tuple(s[:2]) < later[0]]
            for epoch, _start, *rows in steps:
                kept.setdefault(epoch, []).extend(rows)
        lost = duplicated = 0
        last_size = min(r["size"] for r in results)
        for epoch in range(self.EPOCHS):
            rows = kept.get(epoch, [])
            duplicated += len(rows) - len(set(rows))
            order = np.random.default_rng([self.SEED, epoch]).permutation(self.ROWS).tolist()
            prefix = max((order.index(r) + 1 for r in set(rows)), default=0)
            lost += prefix - len(set(rows))
            if self.ROWS - prefix >= last_size * self.BATCH:
                lost += self.ROWS - prefix
        return {"lost": lost, "duplicated": duplicated, "unit": "rows"}

    def readable(self) -> Optional[str]:
        from tests.chaos.jobs import _run_check
        files = sorted(self.write_dir().glob("elastic-state-*"))
        if not files:
            return None
        return _run_check("import sys; from hpcrep.checkpoint import commit_file; "
                          "commit_file.read(sys.argv[1])", str(files[-1]))


class UlfmFitJob(UlfmExplicitJob):
    """tests/launch/transparent_elastic_job.py under ``python -m hpcrep --elastic`` on 4 ranks:
    1024 rows, 3 epochs of 8 steps, a commit at each epoch's end; no per-row ledger."""

    ROWS, EPOCHS = 1024, 3

    def _job(self, out: Path, *extra: str) -> list[str]:
        return [str(VENV / "bin" / "python"), "-m", "hpcrep", "--elastic",
                str(LAUNCH / "transparent_elastic_job.py"), str(out), str(self.ROWS),
                str(self.EPOCHS)]

    def command(self, attempt: int) -> tuple[list[str], dict, Path]:
        env = self._env()
        self.write_dir().mkdir(exist_ok=True)
        return _mpirun(self.trial.ranks, self._job(self.out), env), env, ROOT

    def _stderr(self) -> str:
        return read_text(self.out / "stderr-0.txt")

    def progress(self) -> int:
        return len(re.findall(r"step end", self._stderr())) // self.trial.ranks

    def recovering(self, attempt: int, since: float) -> bool:
        # not "fit goes on after a failed rank": the start-up line says that
        return bool(re.search(r"fit goes on (at|in) epoch|survivors go on", self._stderr()))

    def weights(self) -> list[dict[str, np.ndarray]]:
        return [load_npz(p) for p in sorted(self.out.glob("weights[0-9]*.npz"))]

    def chain(self) -> Optional[list[tuple[int, int, int]]]:
        goes_on = re.findall(r"fit goes on (at|in) epoch (\d+) on (\d+) ranks", self._stderr())
        if any(how == "in" for how, _, _ in goes_on):
            return None  # mid-epoch commits: not made here
        stages = [(self.trial.ranks, int(e) - 1) for _, e, _ in goes_on]
        sizes = [self.trial.ranks] + [int(n) for _, _, n in goes_on]
        return [(n, stages[i][1] if i < len(stages) else -1, 0) for i, n in enumerate(sizes)]

    def reference_key(self) -> Optional[str]:
        chain = self.chain()
        return None if chain is None else "ulfm-fit-" + "-".join(f"{n}@{e}" for n, e, _ in chain)

    def reference_command(self, out: Path) -> list[tuple[list[str], dict, Path]]:
        (out / "commits").mkdir(parents=True, exist_ok=True)
        launches = []
        for i, (n, epoch, _rows) in enumerate(self.chain() or []):
            stage = out / f"stage{i}"
            stage.mkdir(exist_ok=True)
            extra = {"KILL_RANK": "0", "KILL_AT": "0", "KILL_EPOCH": str(epoch)} \
                if epoch >= 0 else {}
            env = base_env(HPCREP_ELASTIC_DIR=str(out / "commits"), **extra)
            launches.append((_mpirun(n, self._job(stage), env, ulfm=False), env, ROOT))
        return launches

    def reference_weights(self, out: Path) -> dict[str, np.ndarray]:
        last = sorted(out.glob("stage*"))[-1]
        return load_npz(last / "weights0.npz")

    def recovery_seconds(self, fault_time: float) -> Optional[float]:
        text = self._stderr()
        begins = [float(t) for t in re.findall(r"train begin ([0-9.]+)", text)]
        after = [t for t in begins if t > fault_time]
        ends = [float(t) for t in re.findall(r"step end ([0-9.]+)", text)]
        ends = [t for t in ends if after and t > after[0]]
        return min(ends) - fault_time if ends else None

    def ledger(self) -> Optional[dict]:
        return None
