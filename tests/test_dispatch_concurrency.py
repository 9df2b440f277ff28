"""Several dispatchers at once: no message goes out twice and no cap is overshot.

The dispatchers are real ``celery -A tests.proj fair dispatch`` processes (and, in one test,
Dispatcher threads) racing over the same fair queue, feeding a real in-thread worker.
Every test runs twice (``store_backend``): celery_fair's store on Redis, then on
PostgreSQL (the broker, results and ledger stay on Redis).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from celery_fair.config import reset_config
from celery_fair.task import store_for

from .conftest import DispatcherThread, wait_for
from .helpers import settled
from .procs import CeleryProcess

N_TASKS = 2000
TENANTS = [f"tenant-{i}" for i in range(20)]


def _queue(app: Any) -> str:
    return str(app.conf.task_default_queue)


@contextlib.contextmanager
def dispatch_processes(n: int, conf: dict[str, Any], broker: str, namespace: str,
                       tmp_path: Any) -> Iterator[list[CeleryProcess]]:
    procs = [CeleryProcess(["fair", "dispatch", "-l", "INFO"], conf, broker, namespace,
                           tmp_path / f"dispatcher-{i}.log") for i in range(n)]
    try:
        yield procs
    finally:
        codes = [p.stop() for p in procs]
        logs = "\n".join(p.output() for p in procs)
        assert codes == [0] * n, f"dispatchers did not stop cleanly: {codes}\n{logs}"


def _store_conf(app: Any) -> dict[str, Any]:
    """What a dispatcher process needs to use the test app's store (Redis or SQL)."""
    return {"fair_store_url": app.conf.fair_store_url}


def _logs(procs: list[CeleryProcess]) -> str:
    return "\n".join(p.output() for p in procs)


def _hold_many(app: Any, n: int) -> list[str]:
    work = app.tasks["proj.work"]
    labels = [f"task-{i}" for i in range(n)]
    for i, label in enumerate(labels):
        work.delay(TENANTS[i % len(TENANTS)], label)
    snap = store_for(app).snapshot(_queue(app))
    assert sum(g["held_background"] for g in snap["groups"]) == n
    return labels


def test_two_dispatcher_processes_run_every_task_once(app, worker, ledger, redis_server,
                                                      namespace, tmp_path, redis_client,
                                                      store_backend):
    labels = _hold_many(app, N_TASKS)
    with worker(concurrency=8), \
            dispatch_processes(2, _store_conf(app), redis_server.url + "/0", namespace,
                               tmp_path) as procs:
        wait_for(lambda: ledger.ends() >= N_TASKS or not all(p.alive() for p in procs),
                 timeout=150, interval=0.1, what=f"{N_TASKS} tasks to run")
        assert all(p.alive() for p in procs), _logs(procs)
        wait_for(lambda: settled(app), timeout=30, what="every slot released")
        # Both dispatchers were still running at the end: they raced the whole time.
        assert all(p.alive() for p in procs), _logs(procs)
    runs = ledger.runs()
    assert len(runs) == N_TASKS and set(runs) == set(labels)
    duplicates = {label: n for label, n in runs.items() if n != 1}
    assert duplicates == {}, f"tasks that ran more than once: {duplicates}"
    assert ledger.ends() == N_TASKS
    assert redis_client.llen(_queue(app)) == 0
    assert store_for(app).snapshot(_queue(app))["inflight"] == 0


# Direct push is the Redis store's capability: on PostgreSQL both would publish with kombu.
@pytest.mark.parametrize(("store_backend", "direct"),
                         [("redis", True), ("redis", False), ("postgresql", False)],
                         ids=["redis-direct-push", "redis-kombu-publish",
                              "postgresql-kombu-publish"], indirect=["store_backend"])
def test_two_dispatcher_threads_run_every_task_once(app, worker, ledger, direct,
                                                    store_backend):
    """With direct push the pick script itself moves each message into the real queue (one
    atomic call: nothing separate to count); without it each dispatcher publishes what it
    picked with kombu, and no hold id is published twice."""
    app.conf.fair_direct_push = direct
    reset_config(app)
    n = N_TASKS // 2  # the process test above covers the full 2,000
    labels = _hold_many(app, n)
    picked: Counter[str] = Counter()
    lock = threading.Lock()
    threads = [DispatcherThread(app), DispatcherThread(app)]
    for t in threads:  # count what each dispatcher published, per dispatch
        original = t.dispatcher.publisher.publish_one

        def counting(producer: Any, queue: str, item: Any, _orig: Any = original) -> bool:
            with lock:
                picked[item.hold_id] += 1
            return bool(_orig(producer, queue, item))

        t.dispatcher.publisher.publish_one = counting  # type: ignore[method-assign]
    with worker(concurrency=8), threads[0], threads[1]:
        wait_for(lambda: ledger.ends() >= n, timeout=150, interval=0.1,
                 what=f"{n} tasks to run")
        wait_for(lambda: settled(app), timeout=30, what="every slot released")
    runs = ledger.runs()
    assert set(runs) == set(labels)
    assert {label: k for label, k in runs.items() if k != 1} == {}
    # No hold id was published twice by the two dispatchers together.
    if direct:
        assert picked == Counter()
    else:
        assert len(picked) == n and set(picked.values()) == {1}


def test_racing_picks_never_return_a_message_twice(app, store_backend):
    """Store level: 4 threads pick concurrently from 2,000 held messages."""
    add = app.tasks["proj.add"]
    for i in range(N_TASKS):
        add.apply_async((i, i), fair_group=TENANTS[i % len(TENANTS)])
    store, queue = store_for(app), _queue(app)
    taken: list[list[str]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def picker(slot: int) -> None:
        start.wait()
        while True:
            batch = store.pick(queue, 7, None, int(time.time() * 1000), 60_000)
            if not batch:
                return
            taken[slot].extend(p.hold_id for p in batch)
            for p in batch:
                store.release(queue, p.dispatch_id)

    threads = [threading.Thread(target=picker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    everything = [h for part in taken for h in part]
    assert len(everything) == N_TASKS
    assert len(set(everything)) == N_TASKS
    assert settled(app)


CAP_CONF: dict[str, Any] = {
    "fair_default_concurrency": 2,
    "fair_group_concurrency": {"big": 3, "solo": 1},
    "fair_interactive_reserve": 1,
}
CAPS = {"a": 2, "b": 2, "c": 2, "big": 3, "solo": 1}


class InflightSampler(threading.Thread):
    """Records the highest in-flight count the store ever showed per group."""

    def __init__(self, app: Any) -> None:
        super().__init__(daemon=True)
        self.app = app
        self.stopping = threading.Event()
        self.max: Counter[str] = Counter()
        self.max_total = 0
        self.samples = 0

    def run(self) -> None:
        store, queue = store_for(self.app), _queue(self.app)
        while not self.stopping.is_set():
            snap = store.snapshot(queue)
            self.max_total = max(self.max_total, snap["inflight"])
            for g in snap["groups"]:
                self.max[g["group"]] = max(self.max[g["group"]], g["inflight"])
            self.samples += 1
            self.stopping.wait(0.005)

    def __enter__(self) -> InflightSampler:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stopping.set()
        self.join(10)


@pytest.mark.parametrize("interactive", [False, True], ids=["background", "interactive"])
def test_two_dispatchers_never_overshoot_group_caps(make_app, worker, redis_server, namespace,
                                                    tmp_path, interactive, store_backend):
    app = make_app(**CAP_CONF)
    ledger = app.ledger
    task = app.tasks["proj.preview" if interactive else "proj.work"]
    # interactive tasks may use the reserve above the cap, and nothing more
    bound = {g: cap + (1 if interactive else 0) for g, cap in CAPS.items()}
    per_group = 20
    labels = []
    for i in range(per_group):
        for g in CAPS:
            label = f"{g}-{i}"
            labels.append(label)
            task.delay(g, label, 0.05)
    # A worker with more threads than the caps allow in total: only the caps limit.
    threads = sum(bound.values()) + 3
    with worker(concurrency=threads, the_app=app), InflightSampler(app) as sampler, \
            dispatch_processes(2, {**CAP_CONF, **_store_conf(app)}, redis_server.url + "/0",
                               namespace, tmp_path) as procs:
        wait_for(lambda: ledger.ends() >= len(labels) or not all(p.alive() for p in procs),
                 timeout=120, interval=0.05, what="all capped tasks to run")
        assert all(p.alive() for p in procs), _logs(procs)
        wait_for(lambda: settled(app), timeout=30, what="every slot released")
    runs = ledger.runs()
    assert set(runs) == set(labels) and set(runs.values()) == {1}
    observed = ledger.max_running()
    assert set(observed) == set(CAPS)
    over = {g: n for g, n in observed.items() if n > bound[g]}
    assert over == {}, f"groups ran more tasks at once than their cap: {over} (caps {bound})"
    store_over = {g: n for g, n in sampler.max.items() if n > bound[g]}
    assert store_over == {}, f"store counted more in flight than the cap: {store_over}"
    assert sampler.samples > 0
