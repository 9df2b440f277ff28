"""Rate limits (``fair limit --rate``): how exactly a group limited to 10/s gets its 10
dispatches a second over a long window, and whether the other groups notice it."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from celery_fair import controls
from celery_fair.task import store_for

from .harness import Bench, captured_envelope, dispatching, emit, prefill, worker

RATE = 10.0  # tasks a second of the limited group
FREE_TASK = 0.01  # seconds: the other groups' task duration
SLOTS = 4
FREE = ("free1", "free2")


def rate(bench: Bench) -> dict[str, Any]:
    """Over ``window`` seconds of steady running (60; quick 20; smoke 3), the limited
    group's starts against RATE x window, and the other groups' starts against a window
    of the same length with no limited group (same run, same workers)."""
    window = bench.size(60, 20, 3)
    limited, free = _window(bench, window, with_limited=True)
    _, alone = _window(bench, window, with_limited=False)
    expected = RATE * window
    error = (limited - expected) / expected
    free_ratio = free / alone if alone else 0.0
    figures = {"window_s": window, "rate_per_s": RATE, "expected": expected,
               "limited_dispatched": limited, "error_pct": round(100 * error, 2),
               "others_started": free, "others_started_alone": alone,
               "others_ratio": round(free_ratio, 3)}
    met = abs(error) <= 0.02 and free_ratio >= 0.95
    return emit("rate", figures, "limited group within ±2 % of 10/s; others ≥ 0.95× of "
                "their rate alone", met, bench, stem="controls")


def _window(bench: Bench, window: float, with_limited: bool) -> tuple[int, int]:
    """(limited starts, other groups' starts) in ``window`` seconds of steady running."""
    app = bench.app()
    queue = app.conf.task_default_queue
    store = store_for(app)
    backlog = int(window * SLOTS / FREE_TASK) + 1000  # more than the workers can run
    for group in FREE:
        prefill(store, queue, captured_envelope(app, (group, FREE_TASK)), [group],
                backlog // len(FREE))
    if with_limited:
        prefill(store, queue, captured_envelope(app, ("limited", 0.0)), ["limited"],
                int(RATE * window * 1.5) + 50)
        controls.limit(app, "limited", queue=queue, rate=f"{RATE:g}/s", actor="bench")
    with dispatching(app), worker(app, concurrency=SLOTS):
        bench.wait_done(app, 2 * SLOTS, timeout=60)
        time.sleep(1.0)  # steady state: the burst and the start-up are behind
        start = time.time()
        time.sleep(window)
        end = time.time()
    counts = Counter(who for who, t in bench.starts(app) if start <= t < end)
    bench.redis.flushdb()
    return counts["limited"], sum(counts[g] for g in FREE)
