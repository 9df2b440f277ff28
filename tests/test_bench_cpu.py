"""The CPU-per-task benchmark runs (``python -m bench cpu``, tiny here): plain and fair
side by side, each part a process of its own (publisher, worker, dispatcher, Redis),
both ways of running (published while draining, published first), and its section of
docs/benchmarks.md. The figures themselves are the full run's business."""

from __future__ import annotations

from pathlib import Path

import pytest

import bench.report
from bench import cpu


@pytest.mark.parametrize("published_first", [False, True])
def test_the_cpu_benchmark_measures_every_process(tmp_path: Path, published_first: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    row = cpu.run(100, 4, published_first, hiredis=True, results=tmp_path)
    for side in ("plain", "fair"):
        used = row[side]["us_cpu_per_task"]
        # /proc counts in clock ticks (10 ms): Redis's part of 100 tasks may be under one
        assert used["app"] > 0 and used["worker"] > 0 and used["redis"] >= 0, (side, used)
        assert used["total"] == sum(used[p] for p in cpu.PARTS)
        assert row[side]["tasks_per_s"] > 0
    if not published_first:  # else a restarted dispatcher's figure is within start-up noise
        assert row["fair"]["us_cpu_per_task"]["dispatcher"] > 0
    assert row["plain"]["us_cpu_per_task"]["dispatcher"] == 0  # plain Celery has none
    monkeypatch.setattr(bench.report, "RESULTS", tmp_path)
    section = "\n".join(bench.report._cpu_lines())
    assert "## CPU per task" in section and "| fair |" in section
