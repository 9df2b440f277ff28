"""A worker consuming several fair queues shares its pool among them: together they never
have more in flight than its pool plus ``fair_dispatch_ahead``, so the real queues stay
shallow and a group that shows up late runs next instead of behind a FIFO backlog.

Real parts: one prefork worker (pool 2) consuming two fair queues, both backlogged, a real
dispatcher, and the store's own in-flight counters sampled atomically throughout.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from celery import Celery

from celery_fair.store.redis import now_ms
from celery_fair.task import store_for

from .conftest import DispatcherThread, wait_for
from .procs import CeleryProcess
from .test_worker_crash import _shown_and_stopped
from .twins import settled

POOL, AHEAD, BACKLOG, SECONDS = 2, 2, 10, 0.3


class InflightSampler(threading.Thread):
    """The most tasks in flight across ``queues`` at once, read in one MULTI each time."""

    def __init__(self, app: Celery, queues: list[str]) -> None:
        super().__init__(daemon=True)
        self.store, self.queues = store_for(app), queues
        self.most, self.stopping = 0, threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.005):
            pipe = self.store.client.pipeline(transaction=True)
            for queue in self.queues:
                pipe.hget(self.store.keys(queue).stat, "inflight")
            self.most = max(self.most, sum(int(n or 0) for n in pipe.execute()))


def test_a_worker_of_two_backlogged_fair_queues_gets_no_more_than_its_pool_plus_ahead(
        make_app: Callable[..., Celery], dispatcher: Callable[..., DispatcherThread],
        redis_server: Any, namespace: str, tmp_path: Path) -> None:
    app = make_app()
    assert app.conf.get("fair_dispatch_ahead", 2) == AHEAD  # the production default
    work, ledger, store = app.tasks["proj.work"], app.ledger, store_for(app)  # type: ignore[attr-defined]
    queues = [f"one-{namespace}", f"two-{namespace}"]
    worker = CeleryProcess(["worker", "-P", "prefork", "-c", str(POOL), "-Q", ",".join(queues),
                            "--without-mingle", "--without-gossip", "-l", "INFO"], {},
                           redis_server.url + "/0", namespace, tmp_path / "worker.log")
    with _shown_and_stopped([worker]):
        wait_for(lambda: all(store.worker_capacity(q, now_ms()) == POOL for q in queues),
                 timeout=60, what="the worker registered in both queues")
        for queue in queues:
            for n in range(BACKLOG):
                work.apply_async(("big", f"{queue}-{n}", SECONDS), queue=queue)
        sampler = InflightSampler(app, queues)
        sampler.start()
        with dispatcher(app):
            wait_for(lambda: len(ledger.starts()) >= 4, timeout=60, what="the backlog running")
            before = len(ledger.starts())
            late = work.apply_async(("late", "late", 0), queue=queues[0])
            assert late.get(timeout=60) == "late"
            wait_for(lambda: all(settled(app, q) for q in queues), timeout=60,
                     what="both queues drained")
        sampler.stopping.set()
        sampler.join(5)
    labels = [s["label"] for s in ledger.starts()]
    ahead_of_late = labels.index("late") - before
    # in flight when it came: at most pool + ahead, some already running
    assert ahead_of_late <= POOL + AHEAD, f"the late group waited behind {ahead_of_late} starts"
    assert sampler.most <= POOL + AHEAD, f"{sampler.most} in flight for a pool of {POOL}"
    assert sorted(labels) == sorted(["late"] + [f"{q}-{n}" for q in queues
                                                for n in range(BACKLOG)])
