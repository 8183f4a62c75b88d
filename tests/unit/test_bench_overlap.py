"""bench.overlap's report: the table and the wire-bound ceiling under a link cap."""

from bench.overlap import render_markdown


def _report(**extra):
    report = {"date": "d", "image_size": 64, "batch": 16, "ranks": 2, "hosts": ["node1", "node2"],
              "threads": 1, "machine": "vm, 2 cores", "native": "compiled", "reps": 5, "steps": 3,
              "gradient_bytes": 100_000_000,
              "step_ms": {"nosync": 500.0, "hpcrep": 625.0, "forward": 150.0}}
    report.update(extra)
    return report


def test_ceiling_is_forward_pass_plus_the_exchange_at_the_link_rate():
    text = render_markdown(_report(cluster={"nodes": 2, "link": "2gbit"}))
    # 2 nodes: each link carries the 100 MB once, 400 ms at 250 MB/s; 150 + 400 = 550 ms
    assert ("- float32: 400 ms on the wire, so at least 550 ms, an efficiency of at most 0.91"
            in text)
    # half the bytes fit behind the backward pass: nosync itself is the floor
    assert "- float16 (Compression.fp16): 200 ms on the wire, so at least 500 ms" in text
    assert "| hpcrep | hpcrep | 625 | 0.80 |" in text
    assert "| forward |" not in text


def test_no_ceiling_without_a_link_cap():
    assert "Ceiling" not in render_markdown(_report())
    assert "Ceiling" not in render_markdown(_report(cluster={"nodes": 2, "link": "uncapped"}))
