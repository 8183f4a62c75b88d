"""bench/reproduce.py: a later run's summary ratios checked against an earlier run's ranges."""

from bench import reproduce


def _report(**ratios):
    return {"models": {"resnet50": {"ratios": {
        peer: {"2": {"median": m, "min": lo, "max": hi}} for peer, (m, lo, hi) in ratios.items()}}}}


def test_inside_and_outside_are_told_apart_and_counted():
    earlier = _report(nosync=(0.70, 0.62, 0.83), mpi4py=(1.00, 0.82, 1.07))
    later = _report(nosync=(0.84, 0.75, 0.91), mpi4py=(1.03, 0.96, 1.17))
    found = {c.peer: c.inside for c in reproduce.checks(earlier, later)}
    assert found == {"nosync": False, "mpi4py": True}
    text = reproduce.table(earlier, later)
    assert "1 of 2 summary ratios" in text
    assert "| resnet50 | 2 | nosync | 0.70 [0.62-0.83] | 0.84 [0.75-0.91] | **no** |" in text


def test_range_ends_count_as_inside_and_missing_figures_are_skipped():
    earlier = _report(nosync=(0.70, 0.62, 0.83), mpi4py=(1.00, 0.82, 1.07))
    later = _report(nosync=(0.83, 0.80, 0.90), mpi4py=(0.82, 0.80, 0.90), mwms=(1.5, 1.2, 1.9))
    found = list(reproduce.checks(earlier, later))
    assert [(c.peer, c.inside) for c in found] == [("nosync", True), ("mpi4py", True)]
