"""The CPU-per-task benchmark runs (``python -m bench cpu``, tiny here): plain and fair
side by side, each part a process of its own (publisher, worker, dispatcher, Redis),
and its section of docs/benchmarks.md. The figures themselves are the full run's
business."""

from __future__ import annotations

from pathlib import Path

import pytest

import bench.harness
import bench.report
from bench import cpu


def test_the_cpu_benchmark_measures_every_process(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # published while draining (the default); --published-first only orders the same
    # parts differently, and is left to the full run (CI's time is short)
    row = cpu.run(100, 4, published_first=False, hiredis=True, results=tmp_path,
                  quick_start=True)
    for side in ("plain", "fair", "fair+quick"):
        used = row[side]["us_cpu_per_task"]
        # /proc counts in clock ticks (10 ms): Redis's part of 100 tasks may be under one,
        # and so may the dispatcher's, which releases leave out of the per-task path
        # (refill in release)
        assert used["app"] > 0 and used["worker"] > 0 and used["redis"] >= 0, (side, used)
        assert used["dispatcher"] >= 0, (side, used)
        assert used["total"] == sum(used[p] for p in cpu.PARTS)
        assert row[side]["tasks_per_s"] > 0
    assert row["plain"]["us_cpu_per_task"]["dispatcher"] == 0  # plain Celery has none
    monkeypatch.setattr(bench.harness, "RESULTS", tmp_path)
    section = "\n".join(bench.report._cpu_lines())
    assert "## CPU per task" in section and "| fair |" in section
    assert "| fair+quick |" in section


def test_the_cpu_benchmark_runs_on_rabbitmq_and_counts_its_cpu(tmp_path: Path) -> None:
    row = cpu.run(100, 4, published_first=False, hiredis=True, results=tmp_path,
                  broker="amqp")
    assert row["broker"] == "amqp"
    for side in ("plain", "fair"):
        used = row[side]["us_cpu_per_task"]
        assert used[cpu.BROKER_PART] > 0, (side, used)  # RabbitMQ moved every message
        assert used["total"] == sum(used[p] for p in (*cpu.PARTS, cpu.BROKER_PART))
