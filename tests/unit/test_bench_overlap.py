"""bench.overlap's report: the table, the probes, and the wire and CPU ceilings."""

import time

from bench.overlap import render_markdown
from bench.timing import machine_busy_seconds


def _report(**extra):
    report = {"date": "d", "image_size": 64, "batch": 16, "ranks": 2, "hosts": ["node1", "node2"],
              "threads": 1, "machine": "vm, 2 cores", "native": "compiled", "reps": 5, "steps": 3,
              "gradient_bytes": 100_000_000,
              "step_ms": {"nosync": 500.0, "hpcrep": 625.0, "forward": 150.0}}
    report.update(extra)
    return report


def test_wire_ceiling_is_forward_pass_plus_the_exchange_at_the_link_rate():
    text = render_markdown(_report(cluster={"nodes": 2, "link": "2gbit"}))
    # 2 nodes: each link carries the 100 MB once, 400 ms at 250 MB/s; 150 + 400 = 550 ms
    assert "| float32 | 550 | - | 0.91 | hpcrep: 0.80, 0.88 of the ceiling |" in text
    # half the bytes fit behind the backward pass: nosync itself is the floor
    assert "| float16 (Compression.fp16) | 350 | - | 1.00 | - |" in text
    assert "| hpcrep | hpcrep | 625 | - | 0.80 |" in text
    assert "| hpcrep | forward |" not in text


def test_cpu_ceiling_is_nosync_plus_the_exchange_over_the_cores():
    busy = {"nosync": 1000.0, "hpcrep": 1150.0, "forward": 300.0, "exchange": 250.0,
            "exchange_fp16": 150.0}
    steps = {"nosync": 500.0, "hpcrep": 625.0, "forward": 150.0, "exchange": 430.0,
             "exchange_fp16": 215.0}
    text = render_markdown(_report(cluster={"nodes": 2, "link": "2gbit"}, busy_cpu_ms=busy,
                                   cores=2, step_ms=steps))
    # float32: wire 550, CPU (1000 + 250) / 2 = 625: the CPU binds, 500 / 625 = 0.80
    assert "| float32 | 550 | 625 | 0.80 | hpcrep: 0.80, 1.00 of the ceiling |" in text
    # float16: wire 350 (below nosync), CPU (1000 + 150) / 2 = 575: 0.87
    assert "| float16 (Compression.fp16) | 350 | 575 | 0.87 | - |" in text
    assert "| hpcrep | hpcrep | 625 | 1150 | 0.80 |" in text
    assert "exchange 430 ms (250 ms of CPU)" in text
    assert "| hpcrep | exchange |" not in text


def test_cpu_ceiling_alone_without_a_link_cap():
    busy = {"nosync": 600.0, "exchange": 100.0}
    text = render_markdown(_report(busy_cpu_ms=busy, cores=4))
    # 4 cores, 700 ms of CPU: 175 ms, below nosync; nosync itself is the floor
    assert "| float32 | - | 175 | 1.00 | hpcrep: 0.80, 0.80 of the ceiling |" in text
    assert "float16" not in text  # no float16 probe measured


def test_no_ceiling_without_a_link_cap_or_cpu_figures():
    assert "Ceilings" not in render_markdown(_report())
    assert "Ceilings" not in render_markdown(_report(cluster={"nodes": 2, "link": "uncapped"}))


def test_machine_busy_seconds_reads_this_machine():
    machine, busy, cores = machine_busy_seconds()
    assert machine and cores >= 1
    deadline = time.perf_counter() + 0.2
    while time.perf_counter() < deadline:  # 0.2 s of CPU work: 20 ticks of /proc/stat
        pass
    assert machine_busy_seconds()[1] > busy


def test_powersgd_ceilings_use_its_bytes_and_its_own_arithmetic():
    busy = {"nosync": 1000.0, "powersgd2_compute": 100.0, "powersgd2_compute_tfops": 160.0}
    steps = {"nosync": 500.0, "hpcrep_powersgd2": 560.0, "forward": 150.0,
             "powersgd2_compute": 50.0, "powersgd2_compute_tfops": 80.0}
    text = render_markdown(_report(cluster={"nodes": 2, "link": "2gbit"}, busy_cpu_ms=busy,
                                   cores=2, step_ms=steps, powersgd_bytes={"2": 1_000_000}))
    # wire: 150 + 1 MB at 250 MB/s = 154; CPU: (1000 + 100) / 2 = 550: 500 / 550 = 0.91
    assert ("| PowerSGD rank 2 | 154 | 550 | 0.91 | hpcrep_powersgd2: 0.89, 0.98 of the "
            "ceiling |") in text
    assert "powersgd2_compute_tfops 80 ms (160 ms of CPU)" in text
    assert "| hpcrep | powersgd2_compute" not in text
