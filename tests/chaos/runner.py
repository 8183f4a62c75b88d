"""Runs one chaos trial: launches its job, injects its faults when the job's own progress
reaches them, relaunches where the mode's user would, and applies the oracles."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

import numpy as np

from tests.chaos import procs
from tests.chaos.jobs import ROOT, Job, RelaunchJob, ResumeJob, read_text
from tests.chaos.jobs_ulfm import UlfmExplicitJob, UlfmFitJob
from tests.chaos.schedule import Fault, Trial

SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "raise": signal.SIGUSR2,
           "kill-in-write": signal.SIGKILL}
WRITE_WAIT = 30.0  # seconds a kill-in-write waits for a temporary before it kills anyway


def make_job(trial: Trial, out: Path) -> Job:
    """The job of ``trial``'s mode and features, writing into ``out``."""
    if trial.mode == "resume":
        return ResumeJob(trial, out)
    if trial.mode == "relaunch":
        return RelaunchJob(trial, out)
    return (UlfmFitJob if trial.features == "fit" else UlfmExplicitJob)(trial, out)


def code_version() -> str:
    """A digest of hpcrep's code and the jobs: references are cached under it."""
    digest = hashlib.sha256()
    files = sorted((ROOT / "hpcrep").rglob("*.py")) + sorted((ROOT / "tests" / "launch").glob(
        "*_job.py")) + [ROOT / "slurm" / "examples" / "train_resumable.py"]
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + path.read_bytes())
    return digest.hexdigest()[:16]


class Injector:
    """Injects a trial's faults, in order, as the job reaches them; keeps what it did."""

    def __init__(self, trial: Trial, job: Job) -> None:
        self.trial, self.job = trial, job
        self.pending: list[Fault] = list(trial.faults)
        self.done: list[dict] = []
        self.rng = random.Random(trial.name)
        self._ready_at: Optional[float] = None
        self._armed_at: Optional[float] = None

    def fast(self) -> bool:
        """True while a kill-in-write watches for a temporary (poll often then)."""
        return self._armed_at is not None

    def poll(self, attempt: int) -> None:
        """Inject the next fault if the job has reached it. Local."""
        if not self.pending:
            return
        fault, marker = self.pending[0], str(self.job.out)
        live = procs.ranks(marker)
        if fault.during_recovery:
            ready = bool(self.done) and self.job.recovering(attempt, self.done[-1]["time"])
        elif fault.when == "startup":
            ready = len(live) >= self.trial.ranks
        else:
            ready = self.job.progress() >= fault.units
        if not ready or not live:
            return
        now = time.time()
        if self._ready_at is None:
            self._ready_at = now
        if now - self._ready_at < fault.delay:
            return
        if fault.kind == "kill-in-write":
            self._armed_at = self._armed_at or now
            tmp = procs.tmp_files(self.job.write_dir())
            if not tmp and now - self._armed_at < WRITE_WAIT:
                return
            pid = self._writer(tmp, live)
            self._send(fault, pid, live, hit=bool(tmp), tmp=[p.name for p in tmp])
            return
        if fault.victim in live:
            rank = fault.victim
        else:  # not alive (any more): a rank drawn from those that are
            rank = self.rng.choice(sorted(live))
        self._send(fault, live[rank], live, rank=rank)

    def _writer(self, tmp: list[Path], live: dict[int, int]) -> int:
        for path in tmp:  # an HDF5 checkpoint's temporary names its writer: .NAME.tmp-PID
            tail = path.name.rsplit(".tmp-", 1)
            if len(tail) == 2 and tail[1].isdigit():
                return int(tail[1])
        return live[min(live)]  # a commit is written by rank 0

    def _send(self, fault: Fault, pid: int, live: dict[int, int], **what: object) -> None:
        sent = procs.send(pid, SIGNALS[fault.kind])
        self.done.append({"kind": fault.kind, "when": fault.when, "pid": pid, "sent": sent,
                          "time": time.time(), "units": self.job.progress(),
                          "ranks": sorted(live), **what})
        self.pending.pop(0)
        self._ready_at = self._armed_at = None


def launch(job: Job, attempt: int, argv: list[str], env: dict, cwd: Path,
           injector: Optional[Injector]) -> dict:
    """Run one launch of the trial's job (its output to ``out/std{out,err}-ATTEMPT.txt``),
    injecting faults; kill it past the job's bound (a hang). Local."""
    start = time.monotonic()
    with open(job.out / f"stdout-{attempt}.txt", "w") as out, \
            open(job.out / f"stderr-{attempt}.txt", "w") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=cwd,
                                start_new_session=True)
        hung = False
        while proc.poll() is None:
            if time.monotonic() - start > job.bound:
                hung = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            job.observe()
            if injector is not None:
                injector.poll(attempt)
            time.sleep(0.003 if injector is not None and injector.fast() else 0.05)
    return {"attempt": attempt, "code": proc.returncode, "hung": hung,
            "seconds": round(time.monotonic() - start, 2)}


def reference(job: Job, cache: Path) -> tuple[Optional[dict], str]:
    """The reference weights of ``job``'s trial, built once per key and code version."""
    key = job.reference_key()
    if key is None:
        return None, "the survivors' commit points could not be read"
    where = cache / code_version() / key
    if not (where / "done").exists():
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir(parents=True)
        stages = job.reference_command(where)
        for i, (argv, env, cwd) in enumerate(stages):
            with open(where / f"log-{i}.txt", "w") as log:
                done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                      cwd=cwd, timeout=600)
            if done.returncode != 0 and i == len(stages) - 1:
                return None, f"the reference's last launch failed ({where}/log-{i}.txt)"
        procs.orphans(str(where), wait=5)
        (where / "done").write_text(key)
    try:
        return job.reference_weights(where), key
    except OSError as exc:
        return None, f"the reference has no weights: {exc}"


def damage(directory: Path, how: str) -> Optional[str]:
    """Damage the newest checkpoint in ``directory``: ``truncate`` it to half or ``flip``
    bytes in its second half; return its name (None if there is none)."""
    files = sorted(directory.glob("ckpt-*.h5"))
    if not files:
        return None
    data = bytearray(files[-1].read_bytes())
    if how == "truncate":
        data = data[:len(data) // 2]
    else:
        for i in range(len(data) // 2, len(data), max(1, len(data) // 64)):
            data[i] ^= 0xFF
    files[-1].write_bytes(bytes(data))
    return files[-1].name


def run_trial(trial: Trial, out: Path, cache: Path) -> dict:
    """Run ``trial`` in ``out`` and return its record: what happened and each oracle's verdict.
    Local; starts at most one job at a time."""
    job = make_job(trial, out)
    injector = Injector(trial, job)
    launches: list[dict] = []
    record: dict = {"trial": trial.as_dict(), "launches": launches}
    extra_env: dict = {}
    orphans: list[str] = []
    for attempt in range(1 + job.reruns):
        argv, env, cwd = job.command(attempt)
        env.update(extra_env)
        launches.append(launch(job, attempt, argv, env, cwd, injector))
        orphans += procs.orphans(str(out))
        if launches[-1]["hung"] or launches[-1]["code"] == 0:
            break
        if not injector.done:  # ended by itself before any fault: refused or broken
            break
        if trial.kind == "kill-in-write" and "readable" not in record:
            record["readable"] = job.readable()
        if trial.damage and "damaged" not in record:
            record["damaged"] = damage(job.write_dir(), trial.damage)
        kept = read_text(out / f"stderr-{attempt}.txt")
        if "HPCREP_ELASTIC_DIR=" in kept:  # hpcrep run kept its commit: resume from it
            extra_env["HPCREP_ELASTIC_DIR"] = kept.split("HPCREP_ELASTIC_DIR=")[-1].split()[0]
    record["faults"] = injector.done
    record["missed"] = len(injector.pending) + sum(
        1 for f in injector.done if f["kind"] == "kill-in-write" and not f.get("hit"))
    record["orphans"] = orphans
    if trial.kind == "kill-in-write" and "readable" not in record:
        record["readable"] = job.readable()
    judge(job, record, cache)
    return record


def judge(job: Job, record: dict, cache: Path) -> None:
    """Apply the oracles to a finished trial and set ``record["outcome"]`` (``pass``, ``hang``,
    ``refused``, ``aborted``, ``wrong-weights``, ``rows``, ``orphans``, ``unreadable``)."""
    last = record["launches"][-1]
    problems: list[str] = []
    faults = record["faults"]
    if faults:
        record["recovery_seconds"] = job.recovery_seconds(faults[0]["time"])
    if last["hung"]:
        record["outcome"] = "hang"
        tail = read_text(job.out / f"stderr-{last['attempt']}.txt").strip().splitlines()
        record["why"] = (f"launch {last['attempt']} did not end within {job.bound:.0f} s and was "
                         f"killed; its stderr ended: {tail[-1][:200] if tail else '(empty)'}")
        return
    if not faults and last["code"] != 0:
        record["outcome"] = "refused"
        record["why"] = read_text(job.out / f"stderr-{last['attempt']}.txt")[-600:]
        return
    weights = job.weights()
    if last["code"] != 0 or not weights:
        record["outcome"] = "aborted"
        record["why"] = read_text(job.out / f"stderr-{last['attempt']}.txt")[-600:]
        if job.abort_ok:
            record["outcome"] = "aborted-ok"
        return
    for other in weights[1:]:
        if not _same(weights[0], other):
            problems.append("wrong-weights: ranks ended with different weights")
    want, key = reference(job, cache)
    record["reference"] = key
    if want is None:
        problems.append(f"no-reference: {key}")
    elif not _same(want, weights[0]):
        problems.append(f"wrong-weights: not bitwise equal to the reference {key}")
    rows = job.ledger()
    record["ledger"] = rows
    if rows and (rows["lost"] or rows["duplicated"]):
        problems.append(f"rows: {rows}")
    if record.get("readable"):
        problems.append(f"unreadable: {record['readable']}")
    if record["orphans"]:
        problems.append(f"orphans: {len(record['orphans'])} processes left")
    record["problems"] = problems
    record["outcome"] = problems[0].split(":")[0] if problems else "pass"


def _same(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(
        a[k].shape == b[k].shape and a[k].dtype == b[k].dtype and
        np.array_equal(a[k], b[k]) for k in a)


def write_record(record: dict, path: Path) -> None:
    """Write a trial's record as JSON."""
    path.write_text(json.dumps(record, indent=1, default=str))
