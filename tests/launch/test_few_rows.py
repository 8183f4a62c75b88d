"""Inputs with fewer rows, ``tf.data`` batches, generator items or ``PyDataset`` batches than
ranks, in an unchanged script under ``mpirun -n N python -m hpcrep`` (``few_rows_job.py``), at 2
and 4 ranks (``predict(np.ones((1, 3)))`` at 2 ranks crashed in Keras's predict loop on
the rank with no rows, and aborted the job).

``predict`` returns every prediction, in input order, on every rank, as one process would;
``evaluate`` gives the one-process result; ``fit`` refuses with the same clear error on every rank;
nothing hangs, and the job goes on with the ranks' collectives still paired."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

# The module-scoped job fixtures run once: make test-launch (pytest-xdist, --dist loadgroup)
# keeps this module's tests on one worker.
pytestmark = pytest.mark.xdist_group("few_rows")

JOB = str(Path(__file__).with_name("few_rows_job.py"))
PREDICT_CASES = ["predict_one_row", "predict_fewer_rows", "predict_tfdata_fewer_batches",
                 "predict_tfdata_unknown_length", "predict_generator_fewer_items",
                 "predict_pydataset_fewer_batches", "predict_one_row_unbuilt_model",
                 "predict_after_all"]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def ranks(request, mpirun, finished_jobs):
    _, done = finished_jobs
    n = request.param
    if ("few_rows", n) not in done:
        with mpirun.scratch(f"few-rows-{n}") as out:
            proc = mpirun.run(n, [mpirun.python, "-m", "hpcrep", JOB, str(out)], timeout=280)
            assert proc.returncode == 0, f"job failed at {n} ranks:\n{proc.stdout}\n{proc.stderr}"
            assert proc.stdout.count("few_rows_job:") == 1  # rank 0 alone prints
            done["few_rows", n] = [(dict(np.load(out / f"rank{r}.npz")),
                                    json.loads((out / f"rank{r}.json").read_text()))
                                   for r in range(n)]
    return done["few_rows", n]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", PREDICT_CASES)
def test_predict_returns_every_prediction_in_order_on_every_rank(ranks, case):
    results = [arrays for arrays, _ in ranks]
    want = results[0][f"{case}.want"]
    for r, arrays in enumerate(results):
        got = arrays[f"{case}.got"]
        assert got.shape == want.shape, (case, r, got.shape, want.shape)
        np.testing.assert_array_equal(got, results[0][f"{case}.got"], err_msg=f"{case} rank {r}")
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"{case} rank {r}")
    assert len(np.unique(want, axis=0)) == len(want), "rows must differ to show their order"


@pytest.mark.timeout(300)
def test_predict_on_no_rows_fails_on_every_rank_as_in_one_process(ranks):
    errors = [e for _, e in ranks]
    assert all(e["predict_no_rows"] == errors[0]["predict_no_rows_one_process"] for e in errors)
    assert errors[0]["predict_no_rows"] is not None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["evaluate_fewer_rows", "evaluate_tfdata_fewer_batches",
                                  "fit_small_validation"])
def test_evaluate_gives_the_one_process_result_on_every_rank(ranks, case):
    for r, (arrays, _) in enumerate(ranks):
        np.testing.assert_array_equal(arrays[f"{case}.got"], ranks[0][0][f"{case}.got"])
        np.testing.assert_allclose(arrays[f"{case}.got"], arrays[f"{case}.want"], rtol=1e-6,
                                   err_msg=f"{case} rank {r}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case,what", [("fit_fewer_rows", "rows"),
                                       ("fit_tfdata_fewer_batches", "elements"),
                                       ("fit_generator_fewer_items", "item")])
def test_fit_refuses_on_every_rank_naming_the_rows_and_the_ranks(ranks, case, what):
    n = len(ranks)
    errors = [e[case] for _, e in ranks]
    assert all(e == errors[0] for e in errors), errors
    kind, message = errors[0]
    assert kind == "TransparentModeError", errors[0]
    assert f"{n - 1} {what}" in message and f"{n} ranks" in message, message
    arrays = ranks[0][0]
    np.testing.assert_array_equal(arrays["fit_refused_weights_unchanged.got"],
                                  arrays["fit_refused_weights_unchanged.want"])
