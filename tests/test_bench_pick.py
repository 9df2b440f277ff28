"""The pick-rate benchmark runs (``python -m bench pick_groups --smoke``) under every
policy on Redis: issue 12 asks for each policy's pick rate at 10 and 10,000 groups. Tiny
workloads (1,000 groups): whether the 0.8 ratio is met is the full run's business."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.harness
from bench.__main__ import main
from celery_fair.policies import POLICIES, WFQ


def test_pick_groups_measures_every_policy(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.harness, "RESULTS", tmp_path)
    assert main(["pick_groups", "--smoke", "--reps", "1"]) == 0
    [row] = [json.loads(line) for line in (tmp_path / "latest.jsonl").read_text().splitlines()]
    assert row["scenario"] == "pick_groups" and "harmony" in row["target"]
    for policy in POLICIES:
        prefix = "" if policy == WFQ else f"{policy}_"
        for figure in ("picks_per_s_10", "picks_per_s_1000", "ratio_largest_vs_10"):
            assert row[prefix + figure]["median"] > 0, (policy, figure, row)
