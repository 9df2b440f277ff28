"""``python -m bench bulk [--tasks N] [--reps R] [--smoke]``: tasks held per second from
one process by ``fair_bulk``, against ``delay()`` in a loop, fair and plain Celery side
by side in the same run (no workers: only the publishing side). Writes
bench/results/bulk.jsonl; ``python -m bench report`` renders its section."""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from celery import group

from celery_fair.store import store_for

from .harness import RESULTS, Bench, commit, summary

TITLE = "## Bulk holding"
#: The issue's target for fair_bulk from one process, tasks/s.
TARGET = 20_000
TENANTS = 10
#: Why the target is missed, as measured (shown while it is).
WHERE_THE_TIME_GOES = (
    "**Where the time goes.** Measured beside the run (20,000 tasks, `time.process_time` "
    "in the publishing process, Redis's `INFO commandstats`): `fair_bulk` costs ~25 µs "
    "of CPU per task in the process (~55 µs before the JSON was written once per call), "
    "about 10 to build the message (Celery's argument check, `argsrepr`, one JSON encode "
    "of the arguments, the headers' JSON filled in, a task id), 9 for the `AsyncResult` "
    "and the result backend's subscription, 5 for the batches' arguments; and ~10 µs in "
    "Redis (`hold_many.lua`: 2 µs of Redis commands per message, the rest the script's "
    "own work). The process waits for each batch's script (one batch at a time, so that a "
    "failure leaves the batches after it unheld), so the two add up; on this shared "
    "machine the wall time per task was 2-3x the CPU when loaded. What would move it: "
    "sending the next batch (and making the `AsyncResult`s) while Redis runs the "
    "current one, and a leaner per-message loop in `hold_many.lua`.")


def _rate(n: int, publish: Callable[[], Any]) -> float:
    """Tasks/s of ``publish`` (n tasks); what it returns is kept until after the clock
    stops (dropping an AsyncResult unsubscribes it from the result backend)."""
    start = time.perf_counter()
    kept = publish()
    rate = n / (time.perf_counter() - start)
    del kept
    return rate


def once(bench: Bench, n: int, loop: int) -> dict[str, float]:
    """One repetition: fair_bulk of ``n`` tasks over 10 tenants; ``delay()`` loops and
    plain Celery's ``group().apply_async()`` of ``loop`` tasks."""
    app = bench.app()
    fair, plain = app.tasks["proj.fair"], app.tasks["proj.plain"]
    fair.delay("warm"), plain.delay("warm")
    tenants = [f"t{i % TENANTS}" for i in range(max(n, loop))]
    figures = {
        "fair_bulk_per_s": _rate(n, lambda: fair.fair_bulk([(t,) for t in tenants[:n]])),
        "fair_delay_per_s": _rate(loop, lambda: [fair.delay(t) for t in tenants[:loop]]),
        "plain_delay_per_s": _rate(loop, lambda: [plain.delay(t) for t in tenants[:loop]]),
        "plain_group_per_s": _rate(loop, lambda: group(
            plain.s(t) for t in tenants[:loop]).apply_async()),
    }
    held = store_for(app).queue_figures(app.conf.task_default_queue).held_background
    assert held == n + loop + 1, (held, n, loop)  # every fair task held, once
    store_for(app).flush()
    bench.drop_queue(app, app.conf.task_default_queue)
    bench.forget()
    bulk = figures["fair_bulk_per_s"]
    return {**figures, "vs_fair_delay": bulk / figures["fair_delay_per_s"],
            "vs_plain_delay": bulk / figures["plain_delay_per_s"],
            "vs_plain_group": bulk / figures["plain_group_per_s"]}


def run(tasks: int, reps: int, smoke: bool = False) -> dict[str, Any]:
    """Measure and append a row to bench/results/bulk.jsonl; returns the row."""
    bench = Bench(smoke=smoke)
    load, measured = os.getloadavg()[0], commit()
    try:
        rows = [once(bench, tasks, max(tasks // 10, 1)) for _ in range(reps)]
    finally:
        bench.close()
    figures = {key: summary([row[key] for row in rows]) for key in rows[0]}
    row = {"tasks": tasks, "reps": reps, "commit": measured, "load_before": load,
           "target": f"fair_bulk_per_s >= {TARGET:,}",
           "met": figures["fair_bulk_per_s"]["median"] >= TARGET, **figures}
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "bulk.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)
    return row


def bulk_lines() -> list[str]:
    """The report's section, from the last row of bench/results/bulk.jsonl."""
    path = RESULTS / "bulk.jsonl"
    if not path.exists():
        return []
    row = json.loads(path.read_text(encoding="utf-8").strip().splitlines()[-1])

    def cell(key: str) -> str:
        f = row[key]
        return f"{f['median']:,.0f} ({f['min']:,.0f}–{f['max']:,.0f})" \
            if key.endswith("_per_s") else f"{f['median']:.1f} ({f['min']:.1f}–{f['max']:.1f})"

    return [TITLE, "",
            "`python -m bench bulk [--tasks N] [--reps R]`: one process holds N no-op "
            f"tasks over {TENANTS} tenants with `task.fair_bulk(...)` (batches of 500, "
            "one `hold_many` round trip each), against N/10 published by `delay()` in a "
            "loop (fair, and plain Celery) and by plain Celery's `group(...)"
            ".apply_async()`, in the same run, on the run's own redis-server (broker, "
            "results and store). No workers. Median (min–max) over the repetitions.", "",
            f"Measured at `{row['commit']}`, {row['tasks']:,} tasks, {row['reps']} "
            f"repetitions, load average {row['load_before']:.1f} before the run (2 CPUs, "
            "shared with other jobs: read the ratios).", "",
            "| figure | tasks/s or ratio |", "|---|---|",
            f"| fair_bulk | {cell('fair_bulk_per_s')} |",
            f"| fair `delay()` loop | {cell('fair_delay_per_s')} |",
            f"| plain `delay()` loop | {cell('plain_delay_per_s')} |",
            f"| plain `group().apply_async()` | {cell('plain_group_per_s')} |",
            f"| fair_bulk / fair `delay()` | {cell('vs_fair_delay')} |",
            f"| fair_bulk / plain `delay()` | {cell('vs_plain_delay')} |",
            f"| fair_bulk / plain group | {cell('vs_plain_group')} |",
            f"| target {row['target']} | {'met' if row['met'] else '**not met**'} |",
            *([] if row["met"] else ["", WHERE_THE_TIME_GOES])]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench bulk", description=__doc__)
    parser.add_argument("--tasks", type=int, default=20_000, help="default 20,000")
    parser.add_argument("--reps", type=int, default=3, help="default 3")
    parser.add_argument("--smoke", action="store_true", help="tiny: only that it runs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    run(200 if args.smoke else args.tasks, 1 if args.smoke else args.reps, args.smoke)
    return 0
