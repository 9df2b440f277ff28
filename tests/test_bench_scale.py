"""The scaling benchmark runs (``python -m bench scale --smoke``, tiny here): the store on
one redis-server and on a real 3-primary Redis Cluster in one run, dispatchers and
workers as processes of their own, and its section of docs/benchmarks.md. The figures
themselves (and the ≥ 2× target) are the full run's business."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.harness
import bench.report
from bench.__main__ import main

from . import components


@pytest.mark.timeout(300)
def test_the_scale_benchmark_measures_both_stores_and_reports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    components.require(components.REDIS_CLUSTER)
    monkeypatch.setattr(bench.harness, "RESULTS", tmp_path)
    assert main(["scale", "--smoke"]) == 0
    [row] = [json.loads(line) for line in (tmp_path / "scale.jsonl").read_text().splitlines()]
    assert set(row["dispatch"]) == {"single/2", "cluster/2", "single_direct/1"}
    assert set(row["drain"]) == {"single", "cluster"}
    assert {(g["store"], g["queues"]) for g in row["growth"]} == {("single", 1),
                                                                   ("cluster", 1)}
    for figures in [*row["dispatch"].values(), *row["drain"].values(), *row["growth"]]:
        assert figures["per_s"] > 0 and figures["tasks"] > 0, figures
        # /proc counts in clock ticks (10 ms): a tiny window may show 0 for a part
        assert figures["us_cpu"]["store"] >= 0 and figures["us_cpu"]["dispatcher"] >= 0
    for figures in row["drain"].values():
        assert figures["us_cpu"]["worker"] > 0, figures  # 2 processes' start of work
    assert row["dispatch_ratio"] > 0 and row["drain_ratio"] > 0
    section = "\n".join(bench.report._controls_section())
    assert "## Scaling over Redis Cluster" in section and "| cluster (3 primaries) |" in section
