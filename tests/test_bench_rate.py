"""The rate-limit benchmark runs (``python -m bench rate --smoke``: a 3-second window): a
group limited to 10/s beside unlimited groups, counted from inside the tasks, and its
section of docs/benchmarks.md. The 60-second accuracy is the full run's business."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.harness
import bench.report
from bench.__main__ import main


def test_the_rate_benchmark_runs_and_reports(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.harness, "RESULTS", tmp_path)
    assert main(["rate", "--smoke"]) == 0
    [row] = [json.loads(line) for line in (tmp_path / "controls.jsonl").read_text().splitlines()]
    assert (row["scenario"], row["window_s"], row["expected"]) == ("rate", 3, 30.0)
    # a rate not enforced would give hundreds; one enforced gives 30 (± a token at an edge)
    assert 27 <= row["limited_dispatched"] <= 33, row
    assert row["others_started"] > 10 * row["limited_dispatched"], row
    section = "\n".join(bench.report._controls_section())
    assert section.startswith("## Rate limits") and "limited_dispatched: " in section
