"""The benchmark's plots: integer ticks on a log2 rank axis, one colour per peer everywhere,
an ideal-scaling line."""

from __future__ import annotations

import matplotlib  # noqa: F401 - required (setup.cfg extra 'bench'): a missing one fails

from bench import plots


def test_rank_ticks_are_the_integers_measured_plus_powers_of_two():
    assert plots.rank_ticks([1, 2]) == [1, 2]
    assert plots.rank_ticks(["2", "1", "4", "8"]) == [1, 2, 4, 8]
    assert plots.rank_ticks([1, 3]) == [1, 2, 3]
    assert plots.rank_ticks([8, 1024]) == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert plots.rank_ticks([]) == []


def _run(throughput, efficiency):
    return {"throughput": throughput, "efficiency": efficiency}


def _model(modes):
    return {"unit": "images/s", "runs": {m: {"1": _run(100.0, 1.0), "2": _run(150.0, 0.75)}
                                         for m in modes}}


def _lines(fig):
    return {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}


def test_model_figure_has_a_log2_rank_axis_with_integer_ticks_and_an_ideal_line():
    fig = plots.model_figure("resnet50", _model(["hpcrep", "nosync"]))
    for ax in fig.axes:
        assert ax.get_xscale() == "log"
        assert ax.xaxis.get_transform().base == 2
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2"]
        assert list(ax.get_xticks()) == [1, 2]
        assert ax.xaxis.get_minorticklocs().size == 0      # no 1.2, 1.4, ... ticks
    throughput, efficiency = fig.axes
    ideal = [line for line in throughput.get_lines() if line.get_label().startswith("ideal")]
    assert len(ideal) == 1 and list(ideal[0].get_ydata()) == [100.0, 200.0]
    assert ideal[0].get_color() == "black" and ideal[0].get_linestyle() == "--"
    eff_ideal = [line for line in efficiency.get_lines() if line.get_label() == "ideal"]
    assert list(eff_ideal[0].get_ydata()) == [1.0, 1.0]
    assert efficiency.get_ylim() == (0, 1.2)
    plots._pyplot().close(fig)
    model = _model(["hpcrep"])
    model["runs"]["hpcrep"]["2"]["efficiency"] = 1.77          # noise can make a point superlinear
    fig = plots.model_figure("resnet50", model)
    assert fig.axes[1].get_ylim()[1] >= 1.77
    plots._pyplot().close(fig)


def test_every_peer_keeps_its_colour_across_plots_whatever_the_order():
    peers = ["hpcrep", "nosync", "mpi4py", "horovod", "mwms"]
    assert len({plots.colour(p) for p in peers}) == len(peers)
    a = plots.model_figure("resnet50", _model(peers))
    b = plots.model_figure("sngan", _model(["mpi4py", "horovod", "hpcrep"]))
    la, lb = _lines(a), _lines(b)
    for peer in ["hpcrep", "mpi4py", "horovod"]:
        label = plots.PEER_NAMES[peer]
        assert la[label].get_color() == lb[label].get_color() == plots.PEER_COLOURS[peer]
    assert plots.colour("newpeer") == plots.colour("newpeer")   # unknown: fixed, not cycled
    allreduce = plots.allreduce_figure({"memcpy_gbps": 10.0, "runs": {"2": {"sizes": [
        {"bytes": 1024, "raw_inplace_ms": 0.01, "hpcrep_numpy_ms": 0.02, "hpcrep_tf_ms": 0.3}]}}})
    lines = _lines(allreduce)
    assert lines["2 ranks, raw mpi4py in place"].get_color() == plots.PEER_COLOURS["mpi4py"]
    assert lines["2 ranks, hpcrep tf.function"].get_color() == plots.PEER_COLOURS["hpcrep"]
    for fig in (a, b, allreduce):
        plots._pyplot().close(fig)


def test_projection_figure_ticks_are_rank_counts():
    proj = {"ranks": [8, 16, 32, 64, 128, 256, 512, 1024],
            "network": {"bandwidth_gbps": 12.5, "latency_us": 2.0},
            "models": {"resnet50": {"rows": {"fused": [0.9] * 8}}}}
    fig = plots.projection_figure(proj)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(p) for p in proj["ranks"]]
    assert ax.xaxis.get_minorticklocs().size == 0
    assert [line.get_label() for line in ax.get_lines()] == ["resnet50"]   # no overlap row
    plots._pyplot().close(fig)
