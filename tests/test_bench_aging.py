"""The aging benchmark runs (``python -m bench aging --smoke``: 3-second feeds): big
tasks under ``fair_policy`` 'smallest' wait at most the bound the policy states, and much
longer without aging; its row in docs/benchmarks.md's controls section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.harness
import bench.report
from bench.__main__ import main


def test_the_aging_benchmark_runs_and_reports(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.harness, "RESULTS", tmp_path)
    assert main(["aging", "--smoke"]) == 0
    [row] = [json.loads(line) for line in (tmp_path / "controls.jsonl").read_text().splitlines()]
    assert (row["scenario"], row["window_s"]) == ("aging", 3)
    assert row["aged_big_measured"] > 0, row
    assert row["aged_over_bound_ms"] <= 50, row  # never later than the bound, but jitter
    # without aging the big tasks wait for the backlog to drain after the feed stops
    assert row["unaged_big_max_wait_s"] > row["aged_big_max_wait_s"], row
    section = "\n".join(bench.report._controls_section())
    assert "bench aging" in section and "aged_over_bound_ms: " in section
