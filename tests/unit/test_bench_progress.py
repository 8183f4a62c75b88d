"""make bench's progress lines: jobs done of all, time elapsed, and the time left estimated from
the jobs of the same kind already run (else from the mean of all jobs run)."""

from bench.command import job_kind, model_jobs
from bench.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_counts_jobs_and_estimates_from_the_same_kind():
    clock, lines = Clock(), []
    progress = Progress(["a", "b", "a", "b", "allreduce"], clock=clock, out=lines.append)
    assert progress.seconds_left() is None  # nothing to estimate from yet
    clock.now = 100.0
    progress.finished("a", 100.0)
    # b and allreduce have not run: charged the mean of what ran (100 s); a, its own 100 s
    assert progress.seconds_left() == 400.0
    clock.now = 110.0
    progress.finished("b", 10.0)
    # a: 100, b: 10, allreduce: the mean of (100, 10)
    assert progress.seconds_left() == 100.0 + 10.0 + 55.0
    assert lines[-1] == "bench: progress 2/5 jobs, 1.8 min elapsed, about 2.8 min left"
    clock.now = 115.0
    progress.finished("a", 5.0, ok=False)
    assert "3/5 jobs (the last one failed), 1.9 min elapsed" in lines[-1]
    assert progress.seconds_left() == 10.0 + (100.0 + 10.0 + 5.0) / 3


def test_progress_line_under_a_minute_in_seconds():
    clock, lines = Clock(), []
    progress = Progress(["x"], clock=clock, out=lines.append)
    clock.now = 42.0
    progress.finished("x", 42.0)
    assert lines == ["bench: progress 1/1 jobs, 42 s elapsed, about 0 s left"]


def test_the_plan_counts_every_job_run_model_makes():
    """model_jobs is the order run_model runs: every variant at every rank count, per repeat."""
    class Args:
        no_mwms, repeats = False, 2

    jobs = model_jobs("resnet50", [1, 2], Args(), ("hpcrep", "nosync"), None, "/peer/python")
    kinds = [job_kind("resnet50", n, v) for _, (n, v) in jobs]
    assert len(kinds) == 2 * 2 * 3  # 2 repeats x 2 rank counts x (hpcrep, MWMS, Horovod)
    assert kinds[:3] == ["resnet50 x1 hpcrep,nosync", "resnet50 x1 mwms", "resnet50 x1 horovod"]
    assert [r for r, _ in jobs] == [1] * 6 + [2] * 6  # interleaved repeats
