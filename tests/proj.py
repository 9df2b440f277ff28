"""The test project: a Celery app with fair tasks that record what they do.

Built by :func:`create_app` for in-thread workers; subprocess workers import this module
(``celery -A tests.proj worker``) and read the same settings from the environment.
Each task records its start in the ledger (Redis keys outside celery_fair's namespace)
and tracks how many tasks of its group run at once, observed from inside the task.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import redis
from celery import Celery, Task

from celery_fair import FairTask

# Atomically: one more running in the group and overall; remember the highest counts seen.
_ENTER = """
local g = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
local all = redis.call('INCR', KEYS[2])
if g > tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0') then
  redis.call('HSET', KEYS[3], ARGV[1], g) end
if all > tonumber(redis.call('GET', KEYS[4]) or '0') then redis.call('SET', KEYS[4], all) end
redis.call('RPUSH', KEYS[5], ARGV[2])
redis.call('HINCRBY', KEYS[6], ARGV[3], 1)
return g
"""


class Ledger:
    """What the test tasks did, read back by the tests (independent of celery_fair)."""

    def __init__(self, url: str, name: str) -> None:
        self.r = redis.Redis.from_url(url)
        self.name = name
        self._enter = self.r.register_script(_ENTER)

    def key(self, what: str) -> str:
        return f"ledger:{self.name}:{what}"

    def enter(self, group: str, label: str) -> None:
        entry = json.dumps({"group": group, "label": label, "t": time.time()})
        self._enter(keys=[self.key(k) for k in ("running", "all", "max", "maxall", "starts",
                                                 "runs")],
                    args=[group, entry, label])

    def leave(self, group: str) -> None:
        pipe = self.r.pipeline()
        pipe.hincrby(self.key("running"), group, -1)
        pipe.decr(self.key("all"))
        pipe.rpush(self.key("ends"), json.dumps({"group": group, "t": time.time()}))
        pipe.execute()

    def starts(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.r.lrange(self.key("starts"), 0, -1)]

    def ends(self) -> int:
        return int(self.r.llen(self.key("ends")))

    def end_entries(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.r.lrange(self.key("ends"), 0, -1)]

    def ran_on(self, group: str, label: str, hostname: str, what: str = "on") -> None:
        """Where a task ran (``what``: 'on' at its start, 'done' at its end)."""
        self.r.rpush(self.key(what), json.dumps({"group": group, "label": label,
                                                 "host": hostname, "t": time.time()}))

    def hosts(self, what: str = "on") -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.r.lrange(self.key(what), 0, -1)]

    def runs(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.r.hgetall(self.key("runs")).items()}

    def max_running(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.r.hgetall(self.key("max")).items()}

    def max_all(self) -> int:
        return int(self.r.get(self.key("maxall")) or 0)


def create_app(broker: str, namespace: str, queue: str, store: str | None = None,
               fair: bool = True, **conf: Any) -> Celery:
    """The test app. ``store`` is the Redis for results, celery_fair and the ledger;
    it defaults to the broker (which must then be Redis). ``fair=False`` makes the same
    tasks plain Celery tasks (to compare celery-fair with Celery)."""
    store = store or broker
    base: type[Task] = FairTask if fair else Task
    app = Celery("proj", broker=broker, backend=store, set_as_current=False)
    if store != broker:
        app.conf.fair_store_url = store
    app.conf.update(
        task_default_queue=queue,
        fair_key_prefix=namespace,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        result_expires=600,
        worker_hijack_root_logger=False,
    )
    app.conf.update(conf)
    ledger = Ledger(store, namespace)
    app.ledger = ledger  # type: ignore[attr-defined]

    _define_tasks(app, base, ledger)
    return app


def _define_tasks(app: Celery, base: Any, ledger: Ledger) -> None:
    """The test app's tasks (each records its runs in ``ledger``)."""
    _define_control_tasks(app, base, ledger)
    _define_singleton_tasks(app, base, ledger)
    @app.task(base=base, fair_group="tenant", shared=False, name="proj.work")
    def work(tenant: str, label: str = "", duration: float = 0.0) -> str:
        ledger.enter(tenant, label)
        try:
            if duration:
                time.sleep(duration)
        finally:
            ledger.leave(tenant)
        return label

    @app.task(base=base, fair_group="tenant", bind=True, shared=False, name="proj.sticky")
    def sticky(self: Any, tenant: str, label: str = "", duration: float = 0.0) -> str:
        """A task that records the worker it ran on (fair_affinity's tests)."""
        ledger.ran_on(tenant, label, str(self.request.hostname))
        work.run(tenant, label, duration)
        ledger.ran_on(tenant, label, str(self.request.hostname), "done")
        return label

    @app.task(base=base, fair_group="tenant", fair_interactive=True, shared=False,
              name="proj.preview")
    def preview(tenant: str, label: str = "", duration: float = 0.0) -> str:
        return work.run(tenant, label, duration)

    @app.task(base=base, shared=False, name="proj.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(base=base, shared=False, name="proj.tsum")
    def tsum(values: list[int]) -> int:
        return sum(values)

    @app.task(base=base, fair_group="tenant", bind=True, shared=False, name="proj.flaky",
              max_retries=3)
    def flaky(self: Any, tenant: str, fails: int, countdown: float = 0.5) -> int:
        ledger.enter(tenant, f"flaky-{self.request.retries}")
        ledger.leave(tenant)
        if self.request.retries < fails:
            raise self.retry(countdown=countdown)
        return self.request.retries

    @app.task(base=base, shared=False, name="proj.group_of")
    def group_of() -> Any:
        from celery_fair.task import request_headers

        return request_headers(group_of.request).get("fair_group")

    # Fair and plain twins for time limits (prefork workers): see tests/twins.py.
    @app.task(base=base, fair_group="tenant", shared=False, name="proj.nap")
    def nap(tenant: str, seconds: float) -> str:
        from .twins import nap as sleep

        return sleep(seconds)

    @app.task(shared=False, name="proj.plain_nap")
    def plain_nap(tenant: str, seconds: float) -> str:
        from .twins import nap as sleep

        return sleep(seconds)



def _define_singleton_tasks(app: Celery, base: Any, ledger: Ledger) -> None:
    """Tasks with a singleton key (tests/test_singleton.py)."""
    @app.task(base=base, fair_group="tenant", fair_singleton="doc", shared=False,
              name="proj.single")
    def single(tenant: str, doc: str, label: str = "", duration: float = 0.0) -> str:
        """A singleton task (key ``doc``): the ledger's "group" is the key, so its
        highest count running at once is the key's, seen from inside the tasks."""
        ledger.enter(f"key:{doc}", label)
        try:
            if duration:
                time.sleep(duration)
        finally:
            ledger.leave(f"key:{doc}")
        return label


    @app.task(base=base, fair_group="tenant", fair_singleton="doc", bind=True, shared=False,
              name="proj.single_flaky", max_retries=3)
    def single_flaky(self: Any, tenant: str, doc: str, label: str, fails: int,
                     countdown: float = 0) -> str:
        """A singleton task that fails ``fails`` times and retries: its retry keeps its
        key (the headers) and waits for it."""
        ledger.enter(f"key:{doc}", f"{label}-{self.request.retries}")
        ledger.leave(f"key:{doc}")
        if self.request.retries < fails:
            raise self.retry(countdown=countdown)
        return label


def _define_control_tasks(app: Celery, base: Any, ledger: Ledger) -> None:
    """Tasks that use celery_fair's controls from inside."""
    @app.task(base=base, fair_group="tenant", bind=True, shared=False, name="proj.partner")
    def partner(self: Any, tenant: str, label: str, throttle: float = 0.0) -> str:
        """A call to a partner API; ``throttle``: it answered 429, hold the tenant back."""
        ledger.enter(tenant, label)
        ledger.leave(tenant)
        if throttle:
            self.fair_throttle(throttle, reason="partner said 429")
        return label


def _from_env() -> Celery | None:
    broker = os.environ.get("FAIR_TEST_BROKER")
    if not broker:
        return None
    _hear_ctrl_c()
    conf = json.loads(os.environ.get("FAIR_TEST_CONF", "{}"))
    if conf.pop("test_hang_done_release", False):
        _hang_done_releases(os.environ.get("FAIR_TEST_STORE") or broker,
                            os.environ["FAIR_TEST_NS"])
    app = create_app(broker, os.environ["FAIR_TEST_NS"], os.environ["FAIR_TEST_QUEUE"],
                     store=os.environ.get("FAIR_TEST_STORE") or None, **conf)
    if os.environ.get("FAIR_TEST_KILL_AT"):  # a test's kill point (tests/kill_points.py)
        from .kill_points import install

        install(os.environ["FAIR_TEST_KILL_AT"], app.ledger)  # type: ignore[attr-defined]
    return app


def _hang_done_releases(ledger_url: str, namespace: str) -> None:
    """A test-only hook (tests/test_release_window.py): the release a task makes as its
    body returns never reaches the store, as when the store is slow or cut off. Its
    dispatch id goes into the ledger's ``hung`` list, then the call blocks until the test
    SIGKILLs the worker: a kill while the release is on its way, on purpose."""
    from celery_fair.store.redis import RedisStore

    ledger = Ledger(ledger_url, namespace)
    release = RedisStore.release

    def hang(self: Any, queue: str, did: str, done_seconds: int = 0,
             **kw: Any) -> Any:
        if not done_seconds:
            return release(self, queue, did, done_seconds, **kw)
        ledger.r.rpush(ledger.key("hung"), did)
        while True:
            time.sleep(60)

    RedisStore.release = hang  # type: ignore[method-assign]


def _hear_ctrl_c() -> None:
    """A ``celery -A tests.proj`` subprocess of a test: SIGINT raises KeyboardInterrupt,
    as at a terminal. A suite started in the background by a non-interactive shell
    (``nohup ... &``, as a CI runner may) has SIGINT ignored, every process below it
    inherits that, and Python installs its handler only over the default: `fair status
    --watch` went on printing after the test's SIGINT. A blocked SIGINT is inherited
    too."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


app = _from_env()
