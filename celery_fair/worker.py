"""Worker-side receivers: release a task's slot when it ends, keep leases alive.

Connected when ``celery_fair`` is imported, which the worker does when it imports the task
modules; the worker itself runs unchanged. Every receiver is cheap for tasks that are not
fair (no dispatch header: nothing to do).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from celery import Celery, bootsteps, signals
from celery.worker import state as worker_state

from .config import get_config
from .errors import FairError
from .task import DISPATCH_HEADER, QUEUE_HEADER, request_headers, store_for

logger = logging.getLogger(__name__)


def release_dispatch(app: Celery, headers: Mapping[str, Any], reason: str) -> None:
    """Free the slot of the dispatch named in ``headers`` (idempotent)."""
    did, queue = headers.get(DISPATCH_HEADER), headers.get(QUEUE_HEADER)
    if not did or not queue:
        return
    try:
        store_for(app).release(queue, did)
    except FairError as exc:  # the lease returns the slot later
        logger.warning("celery_fair: could not release %s (%s): %s", did, reason, exc)


@signals.task_postrun.connect(weak=False)
def _on_postrun(sender: Any = None, task: Any = None, state: str | None = None,
                **_: Any) -> None:
    if task is not None and not task.request.is_eager:
        release_dispatch(task.app, request_headers(task.request), state or "postrun")


@signals.task_prerun.connect(weak=False)
def _on_prerun(sender: Any = None, task: Any = None, **_: Any) -> None:
    # FairTask checks its dispatch itself (and can skip a stale duplicate); a plain task
    # that carries a dispatch header (published through install()) only marks it running.
    from .task import FairTask, begin_dispatch

    if task is not None and not isinstance(task, FairTask) and not task.request.is_eager:
        headers = request_headers(task.request)
        if headers.get(DISPATCH_HEADER):
            try:
                begin_dispatch(task.app, headers)
            except FairError as exc:
                logger.warning("celery_fair: could not mark %s running: %s",
                               headers.get(DISPATCH_HEADER), exc)


@signals.task_failure.connect(weak=False)
def _on_failure(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
    # In the pool, postrun covers failures; this catches what only the main process sees
    # (hard time limit, a pool process that died). There Celery has already untracked the
    # request (task_ready) but pushes its context on the task's request stack while it
    # sends task_failure, so the headers come from sender.request.
    if sender is None:
        return
    request = _tracked_request(task_id)
    if request is None:
        current = getattr(sender, "request", None)
        if task_id is not None and getattr(current, "id", None) == task_id:
            request = current
    if request is not None:
        release_dispatch(sender.app, request_headers(request), "failure")


@signals.task_revoked.connect(weak=False)
def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if request is not None and sender is not None:
        release_dispatch(sender.app, request_headers(request), "revoked")


@signals.task_unknown.connect(weak=False)
@signals.task_rejected.connect(weak=False)
def _on_unusable(sender: Any = None, message: Any = None, **_: Any) -> None:
    headers = getattr(message, "headers", None) or {}
    consumer = sender
    app = getattr(consumer, "app", None)
    if app is not None and headers.get(DISPATCH_HEADER):
        release_dispatch(app, headers, "unknown or rejected")


def _tracked_request(task_id: str | None) -> Any:
    if task_id is None:
        return None
    for request in list(worker_state.active_requests) + list(worker_state.reserved_requests):
        if getattr(request, "id", None) == task_id:
            return request
    return None


class LeaseKeeper(threading.Thread):
    """Renews the leases of every dispatch this worker holds; registers its capacity.

    Runs in the worker's main process, which tracks received and active requests for all
    pool processes. If the process is killed, renewals stop and the dispatcher reclaims
    the slots when the leases run out.
    """

    def __init__(self, app: Celery, hostname: str, queues: Iterable[str],
                 concurrency: int) -> None:
        super().__init__(name="celery-fair-leases", daemon=True)
        self.app = app
        self.hostname = hostname
        self.queues = sorted(set(queues))
        self.concurrency = concurrency
        self.stopping = threading.Event()
        self.lease = get_config(app).lease_seconds

    def run(self) -> None:
        interval = max(self.lease / 3, 0.05)
        while not self.stopping.is_set():
            try:
                self.beat()
            except FairError as exc:
                logger.warning("celery_fair: lease renewal failed: %s", exc)
            self.stopping.wait(interval)

    def beat(self) -> None:
        store = store_for(self.app)
        now = time.time()
        expires = int((now + self.lease) * 1000)
        for queue in self.queues:
            store.register_worker(queue, self.hostname, self.concurrency, expires)
        held: dict[str, list[str]] = {}
        requests = list(worker_state.active_requests) + list(worker_state.reserved_requests)
        for request in requests:
            headers = request_headers(request)
            did, fair_queue = headers.get(DISPATCH_HEADER), headers.get(QUEUE_HEADER)
            if did and fair_queue:
                held.setdefault(str(fair_queue), []).append(str(did))
        for fair_queue, dids in held.items():
            store.renew(fair_queue, dids, expires)

    def stop(self) -> None:
        self.stopping.set()
        try:
            store = store_for(self.app)
            for queue in self.queues:
                store.unregister_worker(queue, self.hostname)
        except FairError as exc:
            logger.warning("celery_fair: could not unregister worker: %s", exc)


class LeaseStep(bootsteps.StartStopStep):
    """Consumer bootstep running a :class:`LeaseKeeper` while the consumer runs."""

    requires = ("celery.worker.consumer.tasks:Tasks",)
    label = "celery-fair leases"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.keeper: LeaseKeeper | None = None

    def start(self, parent: Any) -> None:
        app = parent.app
        get_config(app)  # bad settings fail the worker at startup, not at the first task
        queues = [q.name for q in getattr(parent.task_consumer, "queues", None) or ()]
        self.keeper = LeaseKeeper(app, parent.hostname, queues, _concurrency(parent))
        self.keeper.beat()  # register capacity before the first task arrives
        self.keeper.start()

    def stop(self, parent: Any) -> None:
        if self.keeper is not None:
            self.keeper.stop()
            self.keeper = None

    shutdown = stop


@signals.worker_init.connect(weak=False)
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    # worker_init fires before the consumer blueprint is built, in `celery worker` and in
    # celery.contrib.testing's workers alike.
    steps = sender.app.steps["consumer"]
    if LeaseStep not in steps:
        steps.add(LeaseStep)


def _concurrency(consumer: Any) -> int:
    controller = getattr(consumer, "controller", None)
    autoscaler = getattr(controller, "autoscaler", None)
    if autoscaler is not None:
        return int(autoscaler.max_concurrency)
    pool = getattr(consumer, "pool", None)
    for value in (getattr(controller, "concurrency", None), getattr(pool, "limit", None)):
        if isinstance(value, int) and value > 0:
            return value
    return 1
