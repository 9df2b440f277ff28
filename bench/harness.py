"""What every benchmark shares: its own redis-server, apps, workers, timing and output.

Each scenario runs plain Celery and celery-fair in the same process on the same broker
(the run's Redis; RabbitMQ with a SQL store: ``sqlstores.py``), so the figures that
matter are ratios measured in one run, not absolute rates.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_fair import FairTask
from celery_fair.config import reset_config
from celery_fair.dispatcher import Dispatcher
from celery_fair.envelope import Envelope
from celery_fair.store.base import Placement, Store
from celery_fair.store.cluster import ClusterStore
from celery_fair.store.redis import RedisStore
from celery_fair.store.scripts import source
from celery_fair.task import store_for
from celery_fair.testing import RedisServer

from .sqlstores import Database, RabbitVhost, process_cpu, server_delta

RESULTS = Path(__file__).parent / "results"


class Bench:
    """One benchmark run: a redis-server (and with a SQL ``store``, a RabbitMQ virtual
    host and a database of its own), and a fresh namespace per app."""

    def __init__(self, quick: bool = False, reps: int = 3, e2e_tasks: int = 10_000,
                 store: str = "redis", smoke: bool = False) -> None:
        self.quick = quick or smoke
        self.smoke = smoke
        self.reps = reps
        self.e2e_tasks = e2e_tasks
        self.store = store
        self.server = RedisServer()
        self.url = self.server.url + "/0"
        self.redis = redis.Redis.from_url(self.url)
        self.vhost: RabbitVhost | None = None
        self.database: Database | None = None
        self._apps: list[Celery] = []
        if store != "redis":
            self.vhost = RabbitVhost("fair-bench-")
            self.database = Database(store)

    def size(self, full: int, quick: int, smoke: int | None = None) -> int:
        """A workload's size: ``smoke`` (only that the scenario runs: the tests), quick or
        full."""
        if self.smoke and smoke is not None:
            return smoke
        return quick if self.quick else full

    @property
    def sql(self) -> bool:
        return self.database is not None

    def close(self) -> None:
        try:
            self.forget()
            if self.database is not None:
                self.database.drop()
        finally:
            if self.vhost is not None:
                self.vhost.delete()
            self.server.stop()

    def forget(self) -> None:
        """Close the stores of the apps made so far: each SQL store has a connection pool
        of its own, and the database server is shared with other jobs."""
        for app in self._apps:
            store_for(app).close()
        self._apps.clear()

    def _transport(self) -> dict[str, Any]:
        """Broker, result backend and store settings of an app on this run's store."""
        if self.vhost is None or self.database is None:
            return {"broker": self.url, "backend": self.url, "conf": {}}
        return {"broker": self.vhost.url, "backend": None,
                "conf": {"fair_store_url": self.database.url}}

    def app(self, **conf: Any) -> Celery:
        """A Celery app on this run's Redis with a plain and a fair no-op-ish task.

        ``proj.plain`` and ``proj.fair`` run the same body: count the run, record the start
        time under the tenant, optionally sleep.
        """
        ns = "b" + uuid.uuid4().hex[:8]
        where = self._transport()
        app = Celery("bench", broker=where["broker"], backend=where["backend"],
                     set_as_current=False)
        app.conf.update(task_default_queue="q-" + ns, fair_key_prefix=ns,
                        worker_prefetch_multiplier=1, worker_hijack_root_logger=False,
                        result_expires=600, **where["conf"], **conf)
        reset_config(app)
        self._apps.append(app)
        r = self.redis

        def body(tenant: str, sleep: float = 0.0) -> None:
            now = time.time()
            pipe = r.pipeline(transaction=False)
            pipe.incr(f"{ns}:done")
            pipe.rpush(f"{ns}:starts", f"{tenant}|{now}")
            pipe.execute()
            if sleep:
                time.sleep(sleep)

        app.task(name="proj.plain", shared=False)(body)
        app.task(name="proj.fair", base=FairTask, fair_group="tenant", shared=False)(body)
        app.ns = ns  # type: ignore[attr-defined]
        return app

    def drop_queue(self, app: Celery, queue: str) -> None:
        """Delete a broker queue a scenario filled (its messages would stay otherwise)."""
        if self.vhost is None:
            self.redis.delete(queue)
            return
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)

    def server_cpu(self) -> dict[int, float] | None:
        return self.database.cpu.seconds() if self.database is not None else None

    def done(self, app: Celery) -> int:
        return int(self.redis.get(f"{app.ns}:done") or 0)

    def starts(self, app: Celery, offset: int = 0) -> list[tuple[str, float]]:
        """(tenant, start time) of the tasks started, from the ``offset``-th on."""
        raw = self.redis.lrange(f"{app.ns}:starts", offset, -1)
        out = []
        for item in raw:
            tenant, _, t = item.decode().rpartition("|")
            out.append((tenant, float(t)))
        return out

    def wait_done(self, app: Celery, n: int, timeout: float = 600) -> float:
        """Poll until ``n`` tasks ran; returns the time it happened (monotonic)."""
        deadline = time.monotonic() + timeout
        while self.done(app) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {self.done(app)} of {n} tasks ran in {timeout}s")
            time.sleep(0.002)
        return time.monotonic()


@contextmanager
def worker(app: Celery, concurrency: int = 4, pool: str = "threads",
           **kw: Any) -> Iterator[Any]:
    with start_worker(app, concurrency=concurrency, pool=pool, perform_ping_check=False,
                      shutdown_timeout=60, loglevel="ERROR", **kw) as w:
        yield w


@contextmanager
def dispatching(app: Celery, **kw: Any) -> Iterator[Any]:
    """A dispatcher in a process of its own, as in production (``celery fair dispatch``):
    in a thread of the benchmark process it would share the embedded worker's GIL.

    Forked: enter this before starting a worker, while the process has one thread.
    """
    process = multiprocessing.get_context("fork").Process(
        target=_dispatch, args=(app, kw), daemon=True)
    process.start()
    try:
        yield process
    finally:
        process.terminate()  # SIGTERM: the dispatcher finishes its step and stops
        process.join(10)
        if process.is_alive():
            process.kill()


def _dispatch(app: Celery, kw: dict[str, Any]) -> None:
    Dispatcher(app, **kw).run()


def captured_envelope(app: Celery, args: tuple[Any, ...] = ("t",), task: str = "proj.fair",
                      queue: str | None = None) -> Envelope:
    """The envelope celery-fair holds for one real ``task`` call with ``args`` to ``queue``
    (the app's default queue if None; held, then taken back with ``cancel``, so nothing
    of it is left to dispatch)."""
    store = store_for(app)
    task_id = uuid.uuid4().hex
    queue = queue or app.conf.task_default_queue
    app.tasks[task].apply_async(args, ignore_result=True, fair_group="capture",
                                task_id=task_id, queue=queue)
    (_, value), = store.cancel(queue, [task_id])
    return Envelope.decode(value)[2]


def prefill(store: Store, queue: str, envelope: Envelope, groups: list[str],
            per_group: int) -> int:
    """Hold ``per_group`` copies of ``envelope`` (fresh task ids) in each group, fast."""
    if isinstance(store, RedisStore):
        return _prefill_redis(store, queue, envelope, groups, per_group)
    from concurrent.futures import ThreadPoolExecutor

    now = int(time.time() * 1000)

    def hold_group(group: str) -> None:
        placement = Placement(group, "b", 1, False)
        for _ in range(per_group):
            task_id = str(uuid.uuid4())
            value = _with_id(envelope, task_id).encode(group, "b", 1, False)
            store.hold(queue, task_id, value, placement, 0, now)

    # A few holds at once: each is a transaction with its own commit (SQLite serializes
    # them anyway).
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(hold_group, groups))
    return per_group * len(groups)


def _with_id(envelope: Envelope, task_id: str) -> Envelope:
    from dataclasses import replace

    return replace(envelope, headers={**envelope.headers, "id": task_id},
                   properties={**envelope.properties, "correlation_id": task_id})


def _prefill_redis(store: RedisStore, queue: str, envelope: Envelope, groups: list[str],
                   per_group: int, chunk: int = 2000) -> int:
    """:func:`prefill` by the hold script itself, pipelined (Redis's bulk load); on a
    cluster, on the primary of the queue's slot (its keys' one node)."""
    prefix = store.keys(queue).prefix
    if isinstance(store, ClusterStore):
        node = store._primary(prefix)
        script: Any = node.register_script(source("hold"))
    else:
        node, script = store.client, store._scripts["hold"]
    now = int(time.time() * 1000)
    total = 0
    pipe = node.pipeline(transaction=False)
    for _ in range(per_group):
        for group in groups:
            task_id = str(uuid.uuid4())
            envelope.headers["id"] = task_id
            envelope.properties["correlation_id"] = task_id
            value = envelope.encode(group, "b", 1, False)
            # the arguments RedisStore.hold sends (its resend memory included)
            script(keys=[prefix], args=[task_id, value, 0, now, group, "b", 1, 0, "",
                                        store.resend_seconds], client=pipe)
            total += 1
            if total % chunk == 0:
                pipe.execute()
    pipe.execute()
    store.client.sadd(f"{store.namespace}:queues", queue)
    return total


class CpuMeter:
    """CPU time over a block: this process (and its waited-for children) and the
    database server (``sqlstores.ServerCpu``), in ms per task with :meth:`per_task`."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.process = 0.0
        self.server: float | None = None

    def __enter__(self) -> CpuMeter:
        self._process, self._server = process_cpu(), self.bench.server_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.process = process_cpu() - self._process
        self.server = server_delta(self._server, self.bench.server_cpu())

    @contextmanager
    def adding(self) -> Iterator[None]:
        """Add the CPU of one more block to what this meter holds (blocks that take
        turns with other meters' blocks)."""
        process, server = self.process, self.server
        with self:
            yield
        self.process += process
        if server is not None and self.server is not None:
            self.server += server

    def per_task(self, n: int, label: str) -> dict[str, float]:
        out = {f"{label}_cpu_ms_per_task": 1000 * self.process / n}
        if self.server is not None:
            out[f"{label}_db_cpu_ms_per_task"] = 1000 * self.server / n
        return out


def summary(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 4), "median": round(statistics.median(values), 4),
            "max": round(max(values), 4)}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def repeat(reps: int, run: Callable[[], dict[str, float]]) -> dict[str, dict[str, float]]:
    """Run ``run`` ``reps`` times; summarize each figure it returns."""
    rows = [run() for _ in range(reps)]
    return {key: summary([row[key] for row in rows]) for key in rows[0]}


def results_file(store: str, stem: str = "latest", suffix: str = ".jsonl") -> Path:
    """bench/results/latest.jsonl for the Redis store, latest-<store>.jsonl for another
    (likewise run.json): each store's last run is kept, and reported, on its own."""
    return RESULTS / (stem + ("" if store == "redis" else f"-{store}") + suffix)


def emit(scenario: str, figures: dict[str, Any], target: str, met: bool,
         bench: Bench, stem: str = "latest") -> dict[str, Any]:
    """Print the scenario's JSON line and append it to the store's results file (``stem``:
    ``controls`` for the controls' scenarios, reported in a section of their own)."""
    line = {"scenario": scenario, "store": bench.store, "quick": bench.quick,
            "target": target, "met": met, **figures}
    print(json.dumps(line), flush=True)
    RESULTS.mkdir(exist_ok=True)
    with open(results_file(bench.store, stem), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")
    return line


def machine() -> dict[str, str]:
    import celery
    import kombu

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": str(os.cpu_count()), "cpu": cpu, "python": platform.python_version(),
            "celery": celery.__version__, "kombu": kombu.__version__,
            "redis_py": redis.__version__, "hiredis": _hiredis(), "os": platform.platform()}


def _hiredis() -> str:
    """Whether redis-py parses replies with hiredis (about half the CPU per round trip)."""
    try:
        import hiredis
    except ImportError:
        return "without hiredis"
    return f"hiredis {hiredis.__version__}"


def commit() -> str:
    """The checked-out commit, with ``+changes`` when the tree differs from it."""
    import subprocess

    root = Path(__file__).parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=root).stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", "celery_fair",
                    "bench")
        return git("rev-parse", "--short", "HEAD") + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_run_info(started: float, load_before: tuple[float, float, float],
                   store: str = "redis", measured: str | None = None) -> None:
    """What a full run ran on: commit (``measured``: read when the run began, as the tree
    may change during a long run), machine, duration, load (bench/results/run.json;
    run-<store>.json for another store)."""
    info = {"commit": measured or commit(), "machine": machine(), "started": started,
            "seconds": round(time.time() - started), "load_before": load_before,
            "load_after": os.getloadavg()}
    RESULTS.mkdir(exist_ok=True)
    results_file(store, "run", ".json").write_text(json.dumps(info), encoding="utf-8")
