"""Fairness scenarios: a small tenant behind a backlog, shares, many groups, memory."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from celery_fair.task import store_for

from .harness import RESULTS, Bench, captured_envelope, dispatching, emit, prefill, worker

TASK = 0.02  # seconds: the small-tenant scenario's task duration
SLOTS = 4


def small_tenant(bench: Bench) -> dict[str, Any]:
    """B's 10 tasks after A's backlog (20 ms tasks, 4 slots): B's first start, in task
    durations. celery-fair at two backlog sizes; FIFO and one queue per tenant beside it."""
    backlogs = [2000, 20000] if bench.quick else [2000, 200000]
    rows: dict[str, list[float]] = {f"fair_{n}": [] for n in backlogs}
    rows.update(fifo_2000=[], queue_per_tenant_2000=[])
    timeline: dict[str, Any] = {}
    for _ in range(bench.reps):
        for n in backlogs:
            rows[f"fair_{n}"].append(_fair_wait(bench, n, timeline))
        rows["fifo_2000"].append(_fifo_wait(bench, 2000, timeline))
        rows["queue_per_tenant_2000"].append(_per_tenant_wait(bench, 2000))
    figures = {k: _summ(v) for k, v in rows.items()}
    ratio = figures[f"fair_{backlogs[-1]}"]["median"] / figures["fair_2000"]["median"]
    figures["backlog_ratio"] = round(ratio, 3)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "timeline.json").write_text(json.dumps(timeline))
    met = figures["fair_2000"]["median"] <= 2 and \
        figures[f"fair_{backlogs[-1]}"]["median"] <= 2 and ratio <= 1.5
    return emit("small_tenant", {"task_ms": TASK * 1000, "slots": SLOTS,
                                 "b_first_start_in_task_durations": figures},
                "<= 2 task durations at both backlogs; ratio <= 1.5", met, bench.quick)


def _summ(values: list[float]) -> dict[str, float]:
    from .harness import summary

    return summary(values)


def _b_wait(bench: Bench, app: Any, name: str, **options: Any) -> tuple[float, float]:
    """Once A's tasks flow, enqueue B's 10; return (B's first start − enqueue, enqueue)."""
    bench.wait_done(app, 2 * SLOTS)
    task = app.tasks[name]
    sent = time.time()
    for _ in range(10):
        task.apply_async(("B", TASK), ignore_result=True, **options)
    deadline = time.monotonic() + 120
    while True:
        b_starts = [t for tenant, t in bench.starts(app) if tenant == "B"]
        if b_starts:
            return (min(b_starts) - sent) / TASK, sent
        if time.monotonic() > deadline:
            raise TimeoutError("B never started")
        time.sleep(0.002)


def _fair_wait(bench: Bench, backlog: int, timeline: dict[str, Any]) -> float:
    app = bench.app()
    prefill(store_for(app), app.conf.task_default_queue, captured_envelope(app, ("A", TASK)),
            ["A"], backlog)
    with worker(app, concurrency=SLOTS), dispatching(app):
        wait, sent = _b_wait(bench, app, "proj.fair")
        bench.wait_done(app, bench.done(app) + 20)
    if backlog == 2000:
        timeline["fair"] = [(t, ts - sent) for t, ts in bench.starts(app)]
    return wait


def _fifo_wait(bench: Bench, backlog: int, timeline: dict[str, Any]) -> float:
    app = bench.app()
    task = app.tasks["proj.plain"]
    for _ in range(backlog):
        task.apply_async(("A", TASK), ignore_result=True)
    with worker(app, concurrency=SLOTS):
        wait, sent = _b_wait(bench, app, "proj.plain")
    timeline["fifo"] = [(t, ts - sent) for t, ts in bench.starts(app)]
    return wait


def _per_tenant_wait(bench: Bench, backlog: int) -> float:
    app = bench.app()
    queue = app.conf.task_default_queue
    task = app.tasks["proj.plain"]
    for _ in range(backlog):
        task.apply_async(("A", TASK), ignore_result=True, queue=queue + "-A")
    with worker(app, concurrency=SLOTS, queues=[queue + "-A", queue + "-B"]):
        wait, _ = _b_wait(bench, app, "proj.plain", queue=queue + "-B")
    return wait


def jain(counts: list[int]) -> float:
    return sum(counts) ** 2 / (len(counts) * sum(c * c for c in counts))


def share(bench: Bench) -> dict[str, Any]:
    """10 backlogged groups at equal weight (Jain index over the executed tasks while all
    are backlogged), then weights 1:2:4 (largest share error, percentage points)."""

    def once() -> dict[str, float]:
        equal = _starts_while_backlogged(bench, {f"g{i}": 1.0 for i in range(10)}, 200)
        counts = Counter(equal)
        weighted = _starts_while_backlogged(bench, {"w1": 1.0, "w2": 2.0, "w4": 4.0}, 700)
        wc = Counter(weighted)
        error = max(abs(wc[g] / len(weighted) - w / 7) for g, w in
                    (("w1", 1), ("w2", 2), ("w4", 4)))
        return {"jain_equal": jain([counts[f"g{i}"] for i in range(10)]),
                "weighted_share_error_pct": 100 * error}

    from .harness import repeat

    figures = repeat(bench.reps, once)
    met = figures["jain_equal"]["median"] >= 0.99 and \
        figures["weighted_share_error_pct"]["median"] <= 2
    return emit("share", figures, "Jain >= 0.99; share error <= 2 %", met, bench.quick)


def _starts_while_backlogged(bench: Bench, weights: dict[str, float], per_group: int
                             ) -> list[str]:
    app = bench.app(fair_group_weights={g: w for g, w in weights.items() if w != 1.0})
    envelope = captured_envelope(app, ("x", 0.005))
    store = store_for(app)
    for group in weights:
        prefill(store, app.conf.task_default_queue, _with_tenant(envelope, group), [group],
                per_group)
    window = per_group * len(weights) // 2  # every group is still backlogged in this window
    with worker(app, concurrency=SLOTS), dispatching(app):
        bench.wait_done(app, window)
    return [tenant for tenant, _ in bench.starts(app)[:window]]


def _with_tenant(envelope: Any, tenant: str) -> Any:
    import copy

    from kombu.utils.json import dumps, loads

    clone = copy.deepcopy(envelope)
    args, kwargs, embed = loads(clone.body)
    clone.body = dumps([[tenant, *args[1:]], kwargs, embed]).encode()
    return clone


def groups(bench: Bench) -> dict[str, Any]:
    """Store pick rate (messages/s) with 10, 1,000 and 100,000 backlogged groups."""
    sizes = [10, 1000, 10000] if bench.quick else [10, 1000, 100000]
    picks = 20000

    def rate(size: int) -> float:
        app = bench.app()
        store = store_for(app)
        queue = app.conf.task_default_queue
        prefill(store, queue, captured_envelope(app), [f"g{i}" for i in range(size)],
                max(2, picks // size + 1))
        start = time.perf_counter()
        taken = 0
        while taken < picks:
            taken += len(store.pick(queue, 500, None, int(time.time() * 1000), 60000))
        return taken / (time.perf_counter() - start)

    from .harness import repeat

    figures = repeat(bench.reps, lambda: {f"picks_per_s_{n}": rate(n) for n in sizes})
    ratio = figures[f"picks_per_s_{sizes[-1]}"]["median"] / figures["picks_per_s_10"]["median"]
    figures["ratio_largest_vs_10"] = {"median": round(ratio, 3)}
    return emit("groups", figures, f"{sizes[-1]} / 10 groups ratio >= 0.8", ratio >= 0.8,
                bench.quick)


def held(bench: Bench) -> dict[str, Any]:
    """Redis memory per held task against the size of the message itself."""
    n = 100_000 if bench.quick else 1_000_000
    app = bench.app()
    store = store_for(app)
    envelope = captured_envelope(app)
    message_bytes = len(envelope.encode("g0", "b", 1, False))
    before = int(store.client.info("memory")["used_memory"])
    prefill(store, app.conf.task_default_queue, envelope, [f"g{i}" for i in range(1000)],
            n // 1000)
    after = int(store.client.info("memory")["used_memory"])
    per_task = (after - before) / n
    store.client.flushdb()
    figures = {"held": n, "message_bytes": message_bytes, "bytes_per_held": round(per_task, 1),
               "overhead_bytes": round(per_task - message_bytes, 1)}
    return emit("held", figures, "bytes per held <= message bytes + 250",
                per_task - message_bytes <= 250, bench.quick)
