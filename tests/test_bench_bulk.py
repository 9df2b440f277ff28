"""The bulk holding benchmark runs (``python -m bench bulk``, tiny here): fair_bulk, the
``delay()`` loops and plain Celery's group side by side, every fair task held once, and
its section of docs/benchmarks.md. The figures themselves are the full run's business."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import bulk


def test_the_bulk_benchmark_measures_each_way_and_reports_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk, "RESULTS", tmp_path)
    row = bulk.run(100, 1, smoke=True)  # it asserts that every fair task was held
    for figure in ("fair_bulk_per_s", "fair_delay_per_s", "plain_delay_per_s",
                   "plain_group_per_s", "vs_fair_delay", "vs_plain_delay"):
        assert row[figure]["median"] > 0, figure
    section = "\n".join(bulk.bulk_lines())
    assert section.startswith(bulk.TITLE) and "| fair_bulk | " in section
