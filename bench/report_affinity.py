"""The "Affinity" section of docs/benchmarks.md, from the last ``affinity`` row of
bench/results/controls.jsonl (``python -m bench affinity``, run with the others by
``python -m bench all``): the end-to-end drain with ``fair_affinity = "hash"`` against
without, and the groups moved when a worker leaves and when one joins."""

from __future__ import annotations

import json
import time
from typing import Any

from . import harness

TITLE = "## Affinity"
SCENARIO = "affinity"

INTRO = (
    "`python -m bench affinity [--quick]` (issue 14): 3 worker processes (threads, 4 "
    "each, distinct hostnames) and a dispatcher process on the run's Redis (broker and "
    "store). The same held no-op tasks over 150 groups are drained with `fair_affinity` "
    "'none' and 'hash', then 'hash' with `fair_affinity_spill_seconds` 1, one after "
    "the other in each repetition, timed from the first task's run to the last (the "
    "dispatcher's start-up is outside); the target, with the spill, is a "
    "ratio ≥ 0.9. Without spill a drain ends when the busiest worker has run its "
    "groups' tasks: with 36 % of the groups it bounds the ratio at 1/3 / 0.36 = 0.93. "
    "Then, with a backlog over every group, a worker stops and another "
    "starts: the groups the store counts as moved (`fair status`'s moves) against those "
    "the hash predicts. Median (min–max) over the repetitions.")


def latest_row() -> dict[str, Any] | None:
    """The last ``affinity`` row (bench/results is looked up now: tests move it)."""
    path = harness.RESULTS / "controls.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    found = [row for row in rows if row.get("scenario") == SCENARIO]
    return found[-1] if found else None


def affinity_lines() -> list[str]:
    """The section (empty without a row: the report keeps the section it had)."""
    row = latest_row()
    if row is None:
        return []

    def spread(key: str, fmt: str) -> str:
        f = row[key]
        return f"{f['median']:{fmt}} ({f['min']:{fmt}}–{f['max']:{fmt}})"

    size = " (quick)" if row.get("quick") else ""
    when = time.strftime("%Y-%m-%d", time.gmtime(
        (harness.RESULTS / "controls.jsonl").stat().st_mtime))
    return [TITLE, "", INTRO, "",
            f"Measured{size} on {when}: {row['tasks']:,} tasks per drain, "
            f"{row['workers']} workers of {row['pool']} threads" + (
                f", load average {row['load_before']} before the run (2 CPUs shared with "
                "other jobs: read the ratio, not the rates)" if "load_before" in row
                else "") + ".", "",
            "| figure | value |", "|---|---|",
            f"| tasks/s, affinity off | {spread('off_per_s', ',.0f')} |",
            f"| tasks/s, affinity on | {spread('on_per_s', ',.0f')} |",
            f"| ratio on / off (no spill: at most ~0.93 here) | {spread('ratio', '.3f')} |",
            *([f"| tasks/s, affinity on, spill after {row['spill']:g} s | "
               f"{spread('spill_per_s', ',.0f')} |",
               f"| ratio on with spill / off (target ≥ 0.9) | {spread('spill_ratio', '.3f')} |"]
              if "spill_ratio" in row else []),
            f"| busiest worker's share of the groups | {row['busiest_worker_groups']} |",
            f"| a worker leaves: groups moved (hash predicts) | {row['leave_moved']} "
            f"({row['leave_hashed']}) of {row['groups']} |",
            f"| a worker joins: groups moved (hash predicts) | {row['join_moved']} "
            f"({row['join_hashed']}) of {row['groups']} |",
            f"| target {row['target']} | {'met' if row['met'] else '**not met**'} |"]
