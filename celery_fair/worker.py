"""Worker-side receivers: release a task's slot when it ends, keep leases alive.

Connected when ``celery_fair`` is imported, which the worker does when it imports the task
modules; the worker itself runs unchanged. Every receiver is cheap for tasks that are not
fair (no dispatch header: nothing to do).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from celery import Celery, bootsteps, signals
from celery.utils.nodenames import worker_direct
from celery.worker import state as worker_state

from .config import get_config
from .errors import ConfigurationError, FairError, SchemaOutOfDate
from .events import enabled
from .headers import DISPATCH_HEADER, GROUP_HEADER, QUEUE_HEADER, request_headers
from .lifecycle import (
    PendingReleases,
    begin_dispatch,
    pending_releases,
    release_dispatch,
    retry_pending_releases,
)
from .logtime import log_in_utc
from .outage import Backoff, Outage
from .policies import any_affinity
from .redact import safe_url
from .spool import spool_for
from .store import store_for
from .store.base import BeginResult

logger = logging.getLogger(__name__)

# Signal receivers, the hub's releases and the lease keeper are this module's; begin and
# release moved to lifecycle.py and stay importable from here.
__all__ = ["HUB_DRAIN_SECONDS", "HubReleases", "LeaseKeeper", "LeaseStep", "PendingReleases",
           "begin_dispatch", "hub_releases", "pending_releases", "release_dispatch",
           "retry_pending_releases"]


class HubReleases:
    """Releases the worker's main process decides in its event loop (the hub): a task it
    failed (hard time limit, lost pool process) or revoked, a message it cannot use. The
    hub must never wait on the store: during an outage it would stop receiving messages,
    acking and sending heartbeats for every try of every release. So they are handed to a
    thread of their own, which releases them in the order given; a release is idempotent,
    and one that fails is kept and retried like any other (:class:`PendingReleases`)."""

    def __init__(self) -> None:
        self._reset()
        # A process forked while the sender held the lock would never get it: each child
        # starts afresh (what was handed over stays the parent's to release).
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._items: collections.deque[tuple[Celery, dict[str, Any], str]] = \
            collections.deque()
        self._busy = threading.Condition()
        self._unfinished = 0
        self._thread: threading.Thread | None = None

    def put(self, app: Celery, headers: Mapping[str, Any], reason: str) -> None:
        """Release the dispatch named in ``headers`` soon, without waiting for it."""
        if not headers.get(DISPATCH_HEADER) or not headers.get(QUEUE_HEADER):
            return
        with self._busy:
            kept = (DISPATCH_HEADER, QUEUE_HEADER) + (("id", GROUP_HEADER)
                                                       if enabled(logger) else ())
            self._items.append((app, {name: headers.get(name) for name in kept}, reason))
            self._unfinished += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._send, daemon=True,
                                                name="celery-fair-hub-releases")
                self._thread.start()
            self._busy.notify_all()

    def _send(self) -> None:
        while True:
            with self._busy:
                while not self._items:
                    self._busy.wait()
                app, headers, reason = self._items.popleft()
            try:
                release_dispatch(app, headers, reason)
            except Exception:  # noqa: BLE001 - one bad release must not stop the others
                logger.exception("celery_fair: releasing dispatch %s failed",
                                 headers.get(DISPATCH_HEADER))
            finally:
                with self._busy:
                    self._unfinished -= 1
                    self._busy.notify_all()

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every release handed over so far to be
        done (landed, or kept to retry); returns whether they were."""
        with self._busy:
            return self._busy.wait_for(lambda: self._unfinished == 0, timeout)


hub_releases = HubReleases()
#: How long a stopping worker waits for the releases its hub handed over.
HUB_DRAIN_SECONDS = 5.0


#: task_postrun states after which the message must not run again. Not REJECTED: a task
#: raising Reject(requeue=True) asks for its message to run again (and a dead-lettered
#: one may be published again with its headers).
FINISHED_STATES = frozenset({"SUCCESS", "FAILURE", "RETRY", "IGNORED"})


#: Ids of the tasks this process is running (task_prerun to task_postrun): a task_failure
#: for one of them comes from the task's own trace, and its postrun releases it.
_running: set[str] = set()


@signals.task_postrun.connect(weak=False)
def _on_postrun(sender: Any = None, task_id: str | None = None, task: Any = None,
                state: str | None = None, **_: Any) -> None:
    # The task ran to its end in this pool process: what Celery redelivers of it from now
    # (acks_late: the worker died before its ack, or the ack died with the connection) is
    # a duplicate. A retry is a new message with a new dispatch.
    _running.discard(str(task_id))
    if task is not None and not task.request.is_eager \
            and not getattr(task.request, "fair_released", False):
        started = getattr(task.request, "fair_started", None)
        release_dispatch(task.app, request_headers(task.request), state or "postrun",
                         done=state in FINISHED_STATES,
                         run=getattr(task.request, "fair_run", None), task_id=task_id,
                         runtime=None if started is None else time.monotonic() - started)


@signals.task_prerun.connect(weak=False)
def _on_prerun(sender: Any = None, task_id: str | None = None, task: Any = None,
               **_: Any) -> None:
    # FairTask checks its dispatch itself (and can skip a stale duplicate); a plain task
    # that carries a dispatch header (published through install()) only marks it running:
    # a signal receiver cannot stop the task, so such a duplicate runs (and is logged).
    if task_id is not None:
        _running.add(str(task_id))
    if task is not None:  # the wall time it runs (fair_charge 'runtime'), to its postrun
        task.request.fair_started = time.monotonic()
    if task is not None and getattr(task, "is_fair_task", False) is not True \
            and not task.request.is_eager:
        headers = request_headers(task.request)
        if headers.get(DISPATCH_HEADER):
            try:
                result = begin_dispatch(task.app, headers)
            except FairError as exc:
                logger.warning("celery_fair: could not mark %s running: %s",
                               headers.get(DISPATCH_HEADER), exc)
                return
            if result is BeginResult.SKIP:
                logger.warning("celery_fair: task %s[%s] is a duplicate of dispatch %s "
                               "(stale or already run) and runs anyway: only a FairTask "
                               "can skip it", task.name, task_id,
                               headers.get(DISPATCH_HEADER))


#: Dispatch headers of the requests this (main) process received, by task id. Celery
#: before 5.7 sends task_failure for a lost pool process after untracking the request and
#: without its context, so this is where the failure receiver finds the dispatch then.
#: Pruned to the tracked requests at every lease beat.
_received: dict[str, dict[str, Any]] = {}


@signals.task_received.connect(weak=False)
def _on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    headers = request_headers(request) if request is not None else {}
    if headers.get(DISPATCH_HEADER) and getattr(request, "id", None):
        _received[str(request.id)] = {DISPATCH_HEADER: headers.get(DISPATCH_HEADER),
                                      QUEUE_HEADER: headers.get(QUEUE_HEADER)}


@signals.task_failure.connect(weak=False)
def _on_failure(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
    # In the pool, postrun covers failures; this catches what only the main process sees
    # (hard time limit, a pool process that died). There Celery has already untracked the
    # request (task_ready); Celery 5.7 pushes its context on the task's request stack while
    # it sends task_failure, older versions don't (then: what task_received saw).
    if sender is None or str(task_id) in _running:
        return  # raised by the task in this process: its postrun releases it
    request = _tracked_request(task_id)
    if request is None:
        current = getattr(sender, "request", None)
        if task_id is not None and getattr(current, "id", None) == task_id:
            request = current
    headers = request_headers(request) if request is not None else {}
    if not headers.get(DISPATCH_HEADER) and task_id is not None:
        headers = _received.get(task_id, {})
    _received.pop(str(task_id), None)
    hub_releases.put(sender.app, headers, "failure")  # this runs in the hub


@signals.task_revoked.connect(weak=False)
def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if request is not None and sender is not None:
        hub_releases.put(sender.app, request_headers(request), "revoked")


@signals.task_unknown.connect(weak=False)
@signals.task_rejected.connect(weak=False)
def _on_unusable(sender: Any = None, message: Any = None, **_: Any) -> None:
    headers = getattr(message, "headers", None) or {}
    consumer = sender
    app = getattr(consumer, "app", None)
    if app is not None and headers.get(DISPATCH_HEADER):
        hub_releases.put(app, headers, "unknown or rejected")


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
        self.gone: set[str] = set()

    def run(self) -> None:
        interval = max(self.lease / 3, 0.05)
        backoff = Backoff(min(0.5, interval), interval)
        outage = Outage(logger, "celery_fair: lease renewal", expected=(FairError,))
        while not self.stopping.is_set():
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any outage
                outage.failed(exc, "retrying with backoff")
                self.stopping.wait(backoff.next())
                continue
            backoff.reset()
            outage.ok()
            self.stopping.wait(interval)

    def beat(self) -> None:
        store = store_for(self.app)
        now = time.time()
        expires = int((now + self.lease) * 1000)
        for queue in self.queues:
            store.register_worker(queue, self.hostname, self.concurrency, expires, int(now * 1000))
        held: dict[str, list[str]] = {}
        requests = list(worker_state.active_requests) + list(worker_state.reserved_requests)
        self.forget_received(requests)
        for request in requests:
            headers = request_headers(request)
            did, fair_queue = headers.get(DISPATCH_HEADER), headers.get(QUEUE_HEADER)
            if did and fair_queue:
                held.setdefault(str(fair_queue), []).append(str(did))
        for fair_queue, dids in held.items():
            store.renew(fair_queue, dids, expires)
        retry_pending_releases(store)
        # what processes of this host died holding
        spool_for(store, get_config(self.app).spool_dir).replay_dead()

    def forget_received(self, requests: list[Any]) -> None:
        """Drop what task_received saw of requests untracked for a whole beat (not just
        now: a request is tracked a moment after task_received fires)."""
        tracked = {str(getattr(r, "id", "")) for r in requests}
        gone = {t for t in list(_received) if t not in tracked}
        for task_id in gone & self.gone:
            _received.pop(task_id, None)
        self.gone = gone

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
        own = worker_direct(parent.hostname).name  # fair_affinity's: not a fair queue
        queues = [q.name for q in getattr(parent.task_consumer, "queues", None) or ()
                  if q.name != own]
        self.keeper = LeaseKeeper(app, parent.hostname, queues, _concurrency(parent))
        try:
            self.keeper.beat()  # register capacity before the first task arrives
        except SchemaOutOfDate:
            raise  # no store to work with until `fair migrate`: the worker must not start
        except FairError as exc:  # the worker runs tasks without the store too
            logger.warning("celery_fair: store unreachable at worker start, the lease "
                           "keeper retries in the background: %s", exc)
        self.keeper.start()
        config = get_config(app)
        logger.info("celery-fair attached: store %s (namespace %r), fair queues %s, pool %d",
                    safe_url(config.store_url), config.key_prefix,
                    ", ".join(self.keeper.queues) or "none", self.keeper.concurrency)

    def stop(self, parent: Any) -> None:
        if not hub_releases.drain(HUB_DRAIN_SECONDS):
            logger.warning("celery_fair: the store did not take every release in %.0fs; "
                           "their leases return the slots", HUB_DRAIN_SECONDS)
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
    try:  # before Celery sets up the worker's logging (logtime.py)
        config = get_config(sender.app)
    except ConfigurationError:
        return  # LeaseStep.start fails the worker with it
    log_in_utc(config.log_utc, existing=False)
    if any_affinity(config.policy, config.queue_policies):
        # fair_affinity: the dispatcher sends a group's tasks to this worker's own queue
        # (worker_direct's; Celery selects its queues before worker_init, so it is added
        # here as its setup_queues would with worker_direct on)
        sender.app.amqp.queues.select_add(worker_direct(sender.hostname))


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
