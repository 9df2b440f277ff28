"""Smallest first with aging (``fair_policy = "smallest"``, ``fair_aging_seconds``): the
longest wait of big tasks in one group fed faster than its 4 worker slots run it, against
the bound the policy states, and the same feed without aging as the contrast.

The stream: every 50 ms, 15 small tasks (cost 1, 20 ms each: 300/s for ~200/s of
slots, so the group is always backlogged) and, every 0.5 s, one big task (cost 20, also
20 ms: only its declared cost differs). Each task id carries the ms it was held at; the
task records when it started, measured inside it.

The bound (DESIGN.md "Scheduling", smallest): a task of cost c held at t has the key
t + c·A; every task held after t + c·A has a higher key, so none is picked before it.
Hence it starts no later than the first task held after t + c·A does, and its wait is at
most c·A (and the gap to that hold, under 50 ms here) plus that task's wait:
``bound = c·A + W(t + c·A)``, measured as that task's start minus t. The figures: each big
task's wait and its bound (the longest of each), and by how much a wait exceeded its
bound at most (``over_bound_ms``: a few ms of start jitter between worker threads, the
order of the picks being exact). Without aging (A = 1000 s: the big tasks rank 5.5 hours
behind) they wait until the feed stops and the backlog drains.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from celery_fair.config import get_config
from celery_fair.directory import policy_of
from celery_fair.store.base import Placement
from celery_fair.task import FairTask, store_for

from .harness import Bench, _with_id, captured_envelope, dispatching, emit, worker

SLOTS = 4
RUN_S = 0.02  # every task's run
BATCH_MS, BATCH = 50, 15  # small tasks: 300/s
BIG_EVERY_MS, BIG_COST = 500, 20.0
AGING = 0.05  # c·A = 1 s for a big task
UNAGED = 1000.0


def aging(bench: Bench) -> dict[str, Any]:
    """Feed the stream for ``window`` seconds (20; quick 8; smoke 3) under aging
    ``AGING`` and without (``UNAGED``); the big tasks' waits against the bound."""
    window = bench.size(20, 8, 3)
    figures: dict[str, Any] = {"window_s": window, "aging_s": AGING, "big_cost": BIG_COST}
    aged = _run(bench, AGING, window)
    unaged = _run(bench, UNAGED, window)
    figures.update({f"aged_{k}": v for k, v in aged.items()})
    figures["unaged_big_max_wait_s"] = unaged["big_max_wait_s"]
    figures["unaged_small_max_wait_s"] = unaged["small_max_wait_s"]
    met = aged["over_bound_ms"] <= 50
    return emit("aging", figures, "smallest: big tasks wait at most c·A plus the wait of "
                "a task held c·A after them", met, bench, stem="controls")


def _run(bench: Bench, aging_s: float, window: float) -> dict[str, Any]:
    app = bench.app(fair_policy="smallest", fair_aging_seconds=aging_s)
    ran = f"{app.ns}:ran"  # type: ignore[attr-defined]
    r = bench.redis

    def timed(self: Any, tenant: str) -> None:
        """Record when it started (ms) under its id (kind and hold time); run."""
        r.rpush(ran, f"{self.request.id}|{time.time() * 1000:.1f}")
        time.sleep(RUN_S)

    app.task(name="proj.timed", base=FairTask, fair_group="tenant", bind=True,
             shared=False)(timed)
    queue = app.conf.task_default_queue
    store = store_for(app)
    # as the dispatcher does at its start, before the feed: what is held before that
    # keeps the FIFO order of the previous policy
    store.configure(queue, policy_of(get_config(app), queue))
    envelope = captured_envelope(app, ("g",), "proj.timed")
    held = 0
    with dispatching(app), worker(app, concurrency=SLOTS):
        start = time.time()
        next_big = 0.0
        while time.time() - start < window:
            now_ms = int(time.time() * 1000)
            kinds = [("s", 1.0)] * BATCH
            if now_ms >= next_big:
                kinds.append(("big", BIG_COST))
                next_big = now_ms + BIG_EVERY_MS
            for kind, cost in kinds:
                task_id = f"{kind}-{now_ms}-{uuid.uuid4().hex[:8]}"
                value = _with_id(envelope, task_id).encode("g", "b", cost, False)
                store.hold(queue, task_id, value, Placement("g", "b", cost, False), 0, now_ms)
                held += 1
            time.sleep(max(0.0, BATCH_MS / 1000 - (time.time() * 1000 - now_ms) / 1000))
        deadline = time.monotonic() + 120
        while r.llen(ran) < held and time.monotonic() < deadline:
            time.sleep(0.05)
    rows = [item.decode().split("|") for item in r.lrange(ran, 0, -1)]
    r.flushdb()
    return _figures([(i.split("-")[0], int(i.split("-")[1]), float(s)) for i, s in rows],
                     aging_s)


def _figures(rows: list[tuple[str, int, float]], aging_s: float) -> dict[str, Any]:
    """From (kind, held ms, started ms) per task: the longest waits of each kind, and
    for the big ones their bounds and how far a wait went over its bound."""
    by_held = sorted(rows, key=lambda row: row[1])
    big = [row for row in rows if row[0] == "big"]
    small = [row for row in rows if row[0] == "s"]
    over, bounds = [], []
    for _, held, started in big:
        after = held + BIG_COST * aging_s * 1000  # t + c·A
        later = [row for row in by_held if row[1] > after]
        if not later:  # none held after it: the feed had stopped (no bound to measure)
            continue
        first = later[0]  # it starts no later than this one: its wait is at most
        bound = first[2] - held  # (first held - t ≈ c·A) + the first's own wait
        bounds.append(bound)
        over.append((started - held) - bound)
    return {"big_max_wait_s": round(max(s - h for _, h, s in big) / 1000, 3),
            "small_max_wait_s": round(max(s - h for _, h, s in small) / 1000, 3),
            "big_bound_max_s": round(max(bounds, default=0.0) / 1000, 3),
            "over_bound_ms": round(max(over, default=0.0), 1),
            "big_measured": len(over)}
