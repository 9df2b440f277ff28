"""What every benchmark shares: its own redis-server, apps, workers, timing and output.

Each scenario runs plain Celery and celery-fair in the same process on the same Redis,
so the figures that matter are ratios measured in one run, not absolute rates.
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
from celery_fair.store.redis import RedisStore
from celery_fair.task import store_for
from celery_fair.testing import RedisServer

RESULTS = Path(__file__).parent / "results"


class Bench:
    """One benchmark run: a redis-server and a fresh namespace per app."""

    def __init__(self, quick: bool = False, reps: int = 3, e2e_tasks: int = 10_000) -> None:
        self.quick = quick
        self.reps = reps
        self.e2e_tasks = e2e_tasks
        self.server = RedisServer()
        self.url = self.server.url + "/0"
        self.redis = redis.Redis.from_url(self.url)

    def close(self) -> None:
        self.server.stop()

    def app(self, **conf: Any) -> Celery:
        """A Celery app on this run's Redis with a plain and a fair no-op-ish task.

        ``proj.plain`` and ``proj.fair`` run the same body: count the run, record the start
        time under the tenant, optionally sleep.
        """
        ns = "b" + uuid.uuid4().hex[:8]
        app = Celery("bench", broker=self.url, backend=self.url, set_as_current=False)
        app.conf.update(task_default_queue="q-" + ns, fair_key_prefix=ns,
                        worker_prefetch_multiplier=1, worker_hijack_root_logger=False,
                        result_expires=600, **conf)
        reset_config(app)
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


def captured_envelope(app: Celery, args: tuple[Any, ...] = ("t",)) -> Envelope:
    """The envelope celery-fair holds for one real ``proj.fair`` call with ``args``."""
    store = store_for(app)
    app.tasks["proj.fair"].apply_async(args, ignore_result=True, fair_group="capture")
    queue = app.conf.task_default_queue
    k = store.keys(queue)
    hold_id, value = next(iter(store.client.hgetall(k.msg).items()))
    store.client.delete(k.msg, k.held("b", "capture"), k.ready("b"), k.group("capture"),
                        k.groups)
    return Envelope.decode(value)[2]


def prefill(store: RedisStore, queue: str, envelope: Envelope, groups: list[str],
            per_group: int, chunk: int = 2000) -> int:
    """Hold ``per_group`` copies of ``envelope`` (fresh task ids) in each group, fast."""
    script = store._scripts["hold"]
    prefix = store.keys(queue).prefix
    now = int(time.time() * 1000)
    total = 0
    pipe = store.client.pipeline(transaction=False)
    for _ in range(per_group):
        for group in groups:
            task_id = str(uuid.uuid4())
            envelope.headers["id"] = task_id
            envelope.properties["correlation_id"] = task_id
            value = envelope.encode(group, "b", 1, False)
            script(keys=[prefix], args=[task_id, value, 0, now, group, "b", 1, 0], client=pipe)
            total += 1
            if total % chunk == 0:
                pipe.execute()
    pipe.execute()
    store.client.sadd(f"{store.namespace}:queues", queue)
    return total


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


def emit(scenario: str, figures: dict[str, Any], target: str, met: bool,
         quick: bool) -> dict[str, Any]:
    """Print the scenario's JSON line and append it to bench/results/latest.jsonl."""
    line = {"scenario": scenario, "quick": quick, "target": target, "met": met, **figures}
    print(json.dumps(line), flush=True)
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "latest.jsonl", "a", encoding="utf-8") as fh:
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


def write_run_info(started: float, load_before: tuple[float, float, float]) -> None:
    """What a full run ran on: commit, machine, duration, load (bench/results/run.json)."""
    info = {"commit": commit(), "machine": machine(), "started": started,
            "seconds": round(time.time() - started), "load_before": load_before,
            "load_after": os.getloadavg()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "run.json").write_text(json.dumps(info), encoding="utf-8")
