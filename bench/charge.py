"""Charging by measured runtime (``fair_charge``): two backlogged groups on 4 slots, one
of 10 ms tasks and one of 100 ms tasks, the same declared cost; each group's share of
the worker time under 'runtime' (the target: within 5 % of equal) and under 'count'
(the contrast)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from celery_fair.task import FairTask, store_for

from .harness import Bench, captured_envelope, dispatching, emit, prefill, worker

SLOTS = 4
#: seconds each task of the group sleeps: its worker time
TASKS = {"quick": 0.01, "slow": 0.1}


def charge(bench: Bench) -> dict[str, Any]:
    """Over ``window`` seconds of steady running (30; quick 10; smoke 3) under each
    charge, the worker time of each group (what its tasks started in the window measured
    of themselves) and the share error: how far the quick group's share is from an equal
    one, relative to it (percent)."""
    window = bench.size(30, 10, 3)
    figures: dict[str, Any] = {"window_s": window}
    for how in ("runtime", "count"):
        shares = _shares(bench, how, window)
        figures[f"{how}_quick_share"] = round(shares["quick"], 4)
        figures[f"{how}_share_error_pct"] = round(100 * abs(shares["quick"] - 0.5) / 0.5, 2)
    met = figures["runtime_share_error_pct"] <= 5
    return emit("charge", figures, "runtime-charge share error ≤ 5 % (10 ms vs 100 ms "
                "tasks)", met, bench, stem="controls")


def _shares(bench: Bench, how: str, window: float) -> dict[str, float]:
    """Each group's share of the worker time in ``window`` seconds of steady running."""
    app = bench.app(fair_charge=how)
    ran = f"{app.ns}:ran"  # type: ignore[attr-defined]
    r = bench.redis

    def timed(tenant: str, seconds: float) -> None:
        """Sleep ``seconds``; record when it started and the time it measured."""
        start, began = time.time(), time.monotonic()
        time.sleep(seconds)
        pipe = r.pipeline(transaction=False)  # one round trip: what it measured not
        pipe.rpush(ran, f"{tenant}|{start}|{time.monotonic() - began}")
        pipe.incr(f"{app.ns}:done")  # type: ignore[attr-defined]
        pipe.execute()

    app.task(name="proj.timed", base=FairTask, fair_group="tenant", shared=False)(timed)
    queue = app.conf.task_default_queue
    store = store_for(app)
    for group, seconds in TASKS.items():  # more than the window can run, each alone
        prefill(store, queue, captured_envelope(app, (group, seconds), "proj.timed"),
                [group], int(window * SLOTS / seconds) + 100)
    with dispatching(app), worker(app, concurrency=SLOTS):
        bench.wait_done(app, 2 * SLOTS, timeout=60)
        time.sleep(2.0)  # steady state: the first estimates (the costs) are corrected
        start = time.time()
        time.sleep(window)
        end = time.time()
    busy: Counter[str] = Counter()
    for item in r.lrange(ran, 0, -1):
        who, at, took = item.decode().rsplit("|", 2)
        if start <= float(at) < end:
            busy[who] += float(took)
    r.flushdb()
    total = sum(busy.values()) or 1.0
    return {group: busy[group] / total for group in TASKS}
