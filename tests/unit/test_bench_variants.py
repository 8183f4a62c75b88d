"""The benchmark's extra hpcrep variants (``hpcrep bench --variants``): their names, the
PowerSGD variant's self-check (a low-rank probe and PowerSGD's rounding bound, which averaging
passes and a missing or broken average fails), one PowerSGD per set of sources, the autotuned
variant's setting, and how reports and plots show them (one process, no mpirun)."""

from __future__ import annotations

import os

import numpy as np
import pytest


def test_extra_variant_names_parse_and_bad_ones_are_refused():
    from bench import modes

    assert modes.powersgd_rank("hpcrep_powersgd2") == 2
    assert modes.powersgd_rank("hpcrep_powersgd16") == 16
    for name in ("hpcrep_powersgd", "hpcrep_powersgd0", "hpcrep_powersgd02", "hpcrep_powersgdx",
                 "hpcrep", "powersgd2"):
        assert modes.powersgd_rank(name) is None, name
    assert modes.is_extra("hpcrep_autotune") and not modes.is_extra("nosync")
    assert modes.parse_variants("") == []
    assert modes.parse_variants(" hpcrep_powersgd2, hpcrep_autotune,hpcrep_powersgd2 ") == [
        "hpcrep_powersgd2", "hpcrep_autotune"]
    with pytest.raises(ValueError, match="'mpi4py'.*hpcrep_powersgdR"):
        modes.parse_variants("hpcrep_powersgd2,mpi4py")
    names = {"hpcrep": "hpcrep"}
    assert modes.display_name("hpcrep_powersgd4", names) == "hpcrep PowerSGD rank 4"
    assert modes.display_name("hpcrep_autotune", names) == "hpcrep autotuned"
    assert modes.display_name("hpcrep", names) == "hpcrep"


def test_jobs_accept_the_extra_variants_in_modes():
    from bench.job import parse_modes

    assert parse_modes("hpcrep,nosync,hpcrep_powersgd2,hpcrep_autotune", ["hpcrep", "nosync"]) \
        == ["hpcrep", "nosync", "hpcrep_powersgd2", "hpcrep_autotune"]
    with pytest.raises(SystemExit, match="hpcrep_powersgd0"):
        parse_modes("hpcrep,hpcrep_powersgd0", ["hpcrep"])


def test_the_command_adds_the_variants_to_the_default_modes_of_one_job():
    import argparse

    from bench.command import MODES, configure, job_variants
    from bench.modes import parse_variants

    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["resnet50", "--variants", "hpcrep_powersgd2,hpcrep_autotune",
                              "--no-mwms"])
    modes = MODES + tuple(parse_variants(args.variants))
    assert job_variants("resnet50", modes, args, None, None) == [
        "hpcrep,nosync,mpi4py,hpcrep_powersgd2,hpcrep_autotune"]
    assert parser.parse_args(["d4pg"]).variants == ""


# -- the PowerSGD variant's self-check ------------------------------------------------------------

SHAPES = [(3, 3, 8, 16), (40, 24), (24,), (2, 50), (16,)]  # conv kernel, dense, bias, thin, bias
RANK = 2
SEED = 0


def _probes(ranks: int) -> list[list[np.ndarray]]:
    from bench.selfcheck import low_rank_probe_coefficients

    return [low_rank_probe_coefficients(SHAPES, r, RANK, SEED) for r in range(ranks)]


def _mean_and_tolerance(cs: list) -> tuple[list, list]:
    from bench.selfcheck import average_tolerance, compressed_tolerances

    n = len(cs)
    mean = [np.mean([np.asarray(c[i], np.float64) for c in cs], axis=0)
            for i in range(len(SHAPES))]
    tol = [average_tolerance(np.sum([np.abs(np.asarray(c[i], np.float64)) for c in cs], axis=0),
                             n) for i in range(len(SHAPES))]
    return mean, compressed_tolerances(mean, tol, RANK, SEED)


def _average32(arrays: list) -> np.ndarray:
    return np.sum(arrays, axis=0, dtype=np.float32) / np.float32(len(arrays))


def _powersgd32(cs: list, average=_average32, average_p=None) -> list[np.ndarray]:
    """One PowerSGD step from zero error buffers, in float32, with ``average`` over ranks (the
    P's with ``average_p`` if given): the arithmetic of hpcrep/tensorflow/powersgd.py
    (P = avg(M Q), QR, Q = avg(M^T P), P Q^T)."""
    from hpcrep.tensorflow.powersgd import compresses, matrix_shape, starting_q

    out, index = [], 0
    for i, shape in enumerate(SHAPES):
        if not compresses(shape, RANK):
            out.append(average([c[i] for c in cs]))
            continue
        n, m = matrix_shape(shape)
        q0 = starting_q(m, RANK, SEED, index).astype(np.float32)
        index += 1
        ms = [np.asarray(c[i], np.float32).reshape(n, m) for c in cs]
        p = (average_p or average)([x @ q0 for x in ms])
        p = np.linalg.qr(p)[0].astype(np.float32)
        q = average([x.T @ p for x in ms])
        out.append((p @ q.T).reshape(shape))
    return out


def test_low_rank_probe_has_a_rank_r_mean_on_compressed_matrices_and_differs_by_rank():
    from bench.selfcheck import compressed_positions

    assert compressed_positions(SHAPES, RANK) == {0: 0, 1: 1}  # (2, 50): min(n, m) <= R
    cs = _probes(4)
    mean, _ = _mean_and_tolerance(cs)
    for i, shape in enumerate(SHAPES):
        assert cs[0][i].shape == shape and cs[0][i].dtype == np.float32
        assert not np.array_equal(cs[0][i], cs[1][i])
    for i in (0, 1):
        matrix = mean[i].reshape(-1, SHAPES[i][-1])
        s = np.linalg.svd(matrix, compute_uv=False)
        assert s[RANK - 1] > 0.1 * s[0] and s[RANK] < 1e-6 * s[0]   # rank R, up to float32
        assert np.std(cs[0][i]) == pytest.approx(1.0, rel=0.5)     # entries of order 1


def test_powersgd_tolerance_grows_with_kappa_and_claims_nothing_without_rank():
    from bench.selfcheck import POWERSGD_ROUNDING, UNIT_ROUNDOFF, powersgd_tolerance

    a = np.diag([2.0, 1.0, 0.0])                    # rank 2, ||A||_2 = 2, ||A||_F = sqrt(5)
    base = np.full((3, 3), 1e-7)
    q = np.eye(3)[:, :2]
    expected = 1e-7 + POWERSGD_ROUNDING * UNIT_ROUNDOFF * 2.0 * np.sqrt(5.0)  # kappa = 2 / 1
    assert powersgd_tolerance(a, base, q) == pytest.approx(np.full((3, 3), expected))
    assert np.all(np.isinf(powersgd_tolerance(a, base, np.eye(3)[:, 1:])))  # A Q has rank 1


def test_simulated_powersgd_passes_and_a_missing_or_broken_average_fails():
    from bench.selfcheck import gradient_verdict

    for n in (1, 2, 4):
        cs = _probes(n)
        mean, tol = _mean_and_tolerance(cs)
        verdict = gradient_verdict(_powersgd32(cs), mean, tol, True, n,
                                   reference=[_average32([c[i] for c in cs])
                                              for i in range(len(SHAPES))],
                                   bound="PowerSGD rank 2's bound")
        assert verdict["ok"], verdict
        assert verdict["worst_over_tolerance"] < 0.5
        assert "PowerSGD rank 2's bound" in verdict["detail"]
    n = 4
    cs = _probes(n)
    mean, tol = _mean_and_tolerance(cs)
    own = cs[1]                                              # nosync: this rank's own gradient
    assert not gradient_verdict(own, mean, tol, True, n)["ok"]
    assert gradient_verdict(own, mean, tol, False, n)["ok"]  # nosync's own verdict passes
    summed = _powersgd32(cs, lambda xs: np.sum(xs, axis=0, dtype=np.float32))  # no 1/n
    assert not gradient_verdict(summed, mean, tol, True, n)["ok"]
    partial = _powersgd32(cs[:3])                                          # a rank left out
    assert not gradient_verdict(partial, mean, tol, True, n)["ok"]
    # Q averaged but P not: the projection of this rank's own matrix, not the mean
    only_q = _powersgd32(cs, average_p=lambda xs: xs[1])
    assert not gradient_verdict(only_q, mean, tol, True, n)["ok"]
    # each broken average fails on the compressed matrices themselves, not only on vectors
    for broken in (own, summed, partial):
        ok = [gradient_verdict([broken[i]], [mean[i]], [tol[i]], True, n)["ok"] for i in (0, 1)]
        assert ok == [False, False]


def test_a_full_rank_probe_is_not_what_powersgd_can_average():
    """Why compressing variants need the low-rank probe: on the full-rank one, even a correct
    PowerSGD is far outside the float32 bound of the exact mean."""
    from bench.selfcheck import average_tolerance, gradient_verdict, probe_coefficients

    n = 2
    cs = [probe_coefficients(SHAPES, r) for r in range(n)]
    mean = [np.mean([np.asarray(c[i], np.float64) for c in cs], axis=0)
            for i in range(len(SHAPES))]
    tol = [average_tolerance(np.sum([np.abs(np.asarray(c[i], np.float64)) for c in cs], axis=0),
                             n) for i in range(len(SHAPES))]
    assert not gradient_verdict(_powersgd32(cs), mean, tol, True, n)["ok"]


# -- the variants' wrappers ---------------------------------------------------------------------


class _Recorder:
    """A distributed tape stand-in: records the compression it was made with and the setting
    in effect when ``gradient`` ran."""

    def __init__(self, compression=None):
        self.compression = compression
        self.seen = None

    def gradient(self, target, sources, output_gradients=None, unconnected_gradients=None):
        self.seen = os.environ.get("HPCREP_AUTOTUNE")
        return [self.compression for _ in sources]


def test_one_compression_per_set_of_sources_kept_across_tapes():
    import tensorflow as tf

    from bench.variants import PerSourcesTape, sources_key

    model_vars = [tf.Variable(1.0), tf.Variable(2.0)]
    probe_vars = [tf.Variable(3.0)]
    assert sources_key(model_vars) == sources_key(list(model_vars))
    assert sources_key(model_vars) != sources_key(probe_vars)
    compressions: dict = {}
    made = []

    def make():
        made.append(object())
        return made[-1]

    def tape():  # a new tape per step, as a training step makes
        return PerSourcesTape(None, _Recorder, compressions, make)

    first = tape().gradient(None, model_vars)
    assert tape().gradient(None, model_vars) == first          # the next step: the same object
    probe = tape().gradient(None, probe_vars)
    assert probe[0] is not first[0] and len(made) == 2          # the probe's own
    assert tape().gradient(None, model_vars)[0] is first[0] and len(made) == 2


def test_the_autotuned_tape_and_optimizer_trace_with_the_setting_and_restore_it(monkeypatch):
    import keras

    from bench.variants import SettingTape, setting_optimizer

    monkeypatch.delenv("HPCREP_AUTOTUNE", raising=False)
    inner = _Recorder()
    SettingTape(inner, "HPCREP_AUTOTUNE", "1").gradient(None, [])
    assert inner.seen == "1" and "HPCREP_AUTOTUNE" not in os.environ
    seen = []

    class Opt(keras.optimizers.SGD):
        def apply(self, grads, trainable_variables=None):
            seen.append(os.environ.get("HPCREP_AUTOTUNE"))

    opt = setting_optimizer(Opt(0.1), "HPCREP_AUTOTUNE", "1")
    opt.apply([], [])
    assert seen == ["1"] and "HPCREP_AUTOTUNE" not in os.environ
    assert isinstance(opt, Opt)


# -- reports and plots --------------------------------------------------------------------------


def test_autotune_settlement_text_states_each_jobs_setting():
    from bench.report_markdown import autotune_text

    settled = {"settled": True, "steps": 63, "seconds": 12.4, "threshold": 64 << 20,
               "chunk": 4 << 20, "fp16": False, "trials": [{}, {}, {}]}
    text = autotune_text("2", [settled, dict(settled, settled=False, steps=300)])
    assert text.startswith("2 ranks: job 1: settled after 63 steps (12 s, 3 settings timed) on "
                           "fusion 64 MiB, pieces 4 MiB")
    assert "job 2: had not settled, frozen after 300 steps" in text
    one = autotune_text("1", [{"settled": None, "detail": "no tuner ran: one rank"}])
    assert one == "1 ranks: no tuner ran: one rank."
    assert autotune_text("2", None) == "2 ranks: not recorded."


def test_pooled_runs_keep_each_jobs_autotune_settlement():
    from bench.pooling import pool_jobs
    from bench.timing import spread

    def timing(round_ms):
        s = spread(round_ms)
        return {"step_ms": s["median"], "round_ms": list(round_ms), "items_per_step": 8,
                "steps_per_round": 3, "threads_per_rank": 1, "check": {"ok": True}}

    jobs = []
    for steps in (40, 50):
        runs = {"nosync": timing([10, 11]), "hpcrep_autotune": timing([12, 13])}
        runs["hpcrep_autotune"]["autotune"] = {"settled": True, "steps": steps}
        jobs.append(runs)
    pooled = pool_jobs(jobs)
    assert [t["steps"] for t in pooled["hpcrep_autotune"]["autotune"]] == [40, 50]
    assert "autotune" not in pooled["nosync"]


def test_plots_and_report_name_and_colour_the_new_variants(tmp_path):
    from bench import plots

    colours = {m: plots.colour(m) for m in ("hpcrep", "nosync", "mpi4py", "horovod", "mwms",
                                            "hpcrep_autotune", "hpcrep_powersgd1",
                                            "hpcrep_powersgd2", "hpcrep_powersgd4")}
    assert len(set(colours.values())) == len(colours)               # one colour each
    assert plots.peer_name("hpcrep_powersgd2") == "hpcrep PowerSGD rank 2"
    modes = ["hpcrep", "nosync", "hpcrep_powersgd2", "hpcrep_autotune"]
    runs = {m: {"1": {"throughput": 100.0, "efficiency": 1.0},
                "2": {"throughput": 150.0, "efficiency": 0.75}} for m in modes}
    fig = plots.model_figure("resnet50", {"unit": "images/s", "runs": runs})
    labels = {line.get_label() for ax in fig.axes for line in ax.get_lines()}
    assert {"hpcrep PowerSGD rank 2", "hpcrep autotuned"} <= labels
