"""The Redis store: each operation is one Lua script (``lua/<operation>.lua``)."""

from __future__ import annotations

import inspect
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.commands.core import Script
from redis.retry import Retry

from .. import limits
from ..errors import (
    HoldOutcomeUnknown,
    StoreConnectionError,
    StoreError,
    StoreFull,
    StoreUnreachable,
)
from ..names import validate_group
from .base import BeginResult, DirectPush, Picked, Policy, Pushed, Store
from .keys import QueueKeys, queues_key
from .scripts import OPERATIONS, source

logger = logging.getLogger(__name__)

#: How long the record of a superseded or lost dispatch is kept (seconds). A stale copy
#: delivered later than this runs as an unknown dispatch.
TOMBSTONE_SECONDS = 86_400
#: How long after its registration expired a worker's entry is dropped (ms). Expired
#: workers never count; the margin only keeps a registering worker whose clock runs ahead
#: from dropping entries another host's clock still sees as live.
PRUNE_GRACE_MS = 60_000
#: How long what a cancel call removed is kept to answer that call again (seconds):
#: redis-py resends a call whose reply a dropped connection lost (10 retries by default),
#: and the resend must still see the messages, or their tasks are never marked REVOKED.
CANCELLED_SECONDS = 300
#: Most entries the quarantine of one fair queue keeps (the newest): it holds damaged data
#: for a human to look at, and must not grow without end. Each one dropped is logged.
QUARANTINE_MAX = 1_000
#: :meth:`RedisStore.limit` arguments: leave the value as it is, or clear the runtime limit.
KEEP, RESET = "", "reset"
#: Most entries one ``check.lua`` call reads (a few ms of Redis time at most).
CHECK_BATCH = 500


@contextmanager
def _explained(operation: str, queue: str) -> Iterator[None]:
    try:
        yield
    except (StoreConnectionError, StoreFull):
        raise
    except StoreError as exc:
        # A script error is a damaged or foreign key: say where, and what finds it.
        raise StoreError(f"{exc} (operation {operation}, fair queue {queue!r}; "
                         "`celery -A <app> fair check` finds what is damaged, "
                         "`--repair` fixes it)") from exc.__cause__


class OuterRetry(Retry):
    """A redis-py ``Retry`` that retries a command, not again everything inside it:
    redis-py runs a connection's connect and handshake under the same policy from within
    each try of the command, so a store that never answers would cost about
    2 × (retries + 1)² waits instead of retries + 1."""

    def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_retrying, "now", False):
            return do()  # within a try of the command: its failure fails that try
        _retrying.now = True
        try:
            return super().call_with_retry(do, fail, *args, **kwargs)
        finally:
            _retrying.now = False


#: Whether this thread is inside an OuterRetry (module-wide: redis-py deep-copies the
#: Retry of a client into each of its connections, and a thread-local cannot be copied).
_retrying = threading.local()


@dataclass(frozen=True)
class Bounds:
    """How long one store command may block: settings ``fair_store_socket_timeout``,
    ``fair_store_connect_timeout`` and ``fair_store_retries``. Set explicitly rather than
    left to the installed redis-py, whose older releases wait forever on a store that
    stopped answering (and whose newer ones retry ten times)."""

    socket_timeout: float = 5.0
    connect_timeout: float = 5.0
    retries: int = 3

    def client_options(self) -> dict[str, Any]:
        # A fresh Retry per client: redis-py keeps per-client state in it.
        return {"socket_timeout": self.socket_timeout,
                "socket_connect_timeout": self.connect_timeout,
                "retry": OuterRetry(ExponentialBackoff(cap=1.0, base=0.05), self.retries),
                "retry_on_timeout": self.retries > 0}

    def longest_wait(self) -> float:
        """Upper bound of one failing command's time (seconds): every try waiting out
        the connect and the socket timeout, plus backoff between tries (at most 1 s)."""
        tries = self.retries + 1
        return tries * (self.connect_timeout + self.socket_timeout) + self.retries * 1.0


@contextmanager
def _wrapped(where: str = "",
             unreachable: type[StoreConnectionError] = StoreConnectionError) -> Iterator[None]:
    at = f" ({where})" if where else ""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise unreachable(f"celery_fair store unreachable{at}: {exc}") from exc
    except redis.exceptions.OutOfMemoryError as exc:
        # Redis refuses a script's first write when full, and only its first (a script
        # is atomic): nothing was written.
        raise StoreFull(f"celery_fair store full{at}: {exc}") from exc
    except redis.RedisError as exc:
        raise StoreError(f"celery_fair store failed{at}: {exc}") from exc


def describe(client: redis.Redis) -> str:
    """Where ``client`` connects, as a URL without credentials (for error messages)."""
    kw = client.connection_pool.connection_kwargs
    if kw.get("path"):
        return f"unix://{kw['path']}?db={kw.get('db', 0)}"
    scheme = "rediss" if "ssl" in str(client.connection_pool.connection_class).lower() \
        else "redis"
    return f"{scheme}://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


#: ``ConnectionPool.get_connection``'s arguments: a command name before redis-py 5.3 (it
#: was required, and is deprecated since).
_GET_CONNECTION_ARGS: tuple[str, ...] = () if inspect.signature(
    redis.ConnectionPool.get_connection).parameters["command_name"].default is None \
    else ("EVALSHA",)


class RedisStore(Store):
    """Fair queues of one namespace in one Redis database."""

    def __init__(self, client: redis.Redis, namespace: str = "fair") -> None:
        self.client = client
        self.namespace = namespace
        self.where = describe(client)
        self._scripts: dict[str, Script] = {
            name: client.register_script(source(name)) for name in OPERATIONS}

    @classmethod
    def from_url(cls, url: str, namespace: str = "fair", bounds: Bounds | None = None,
                 **options: Any) -> RedisStore:
        """A store on ``url``; every command bounded in time by ``bounds`` (defaults:
        the ``fair_store_*`` settings' defaults) unless ``options`` say otherwise."""
        options.setdefault("health_check_interval", 30)
        options.setdefault("socket_keepalive", True)
        for name, value in (bounds or Bounds()).client_options().items():
            options.setdefault(name, value)
        return cls(redis.Redis.from_url(url, **options), namespace)

    def keys(self, queue: str) -> QueueKeys:
        return QueueKeys(self.namespace, queue)

    def _run(self, name: str, queue: str, *args: Any) -> Any:
        with _explained(name, queue), _wrapped(self.where):
            return self._scripts[name](keys=[self.keys(queue).prefix], args=args)

    # -- the atomic operations ---------------------------------------------------------

    def hold(self, queue: str, hold_id: str, value: bytes, due_ms: int, now_ms: int) -> str:
        """See :meth:`Store.hold`; a lost reply raises :class:`HoldOutcomeUnknown`.

        The queue is registered on every hold, in the same round trip: should the set
        lose it (a partial flush, a failover), the next hold puts it back, and the
        dispatchers and `fair check` find the queue again."""
        with _wrapped(self.where, unreachable=StoreUnreachable):
            self._connect()
        try:
            with _explained("hold", queue):
                [held] = self._pipelined(self.keys(queue).prefix,
                                         [("hold", [hold_id, value, due_ms, now_ms])],
                                         register=queue)
        except StoreConnectionError as exc:
            raise HoldOutcomeUnknown(
                f"{exc}; the hold's outcome is unknown: the task may be held (it then runs "
                "when dispatched), so it was not published to the broker") from exc.__cause__
        return _text(held)

    def _connect(self) -> None:
        """Take a connected connection from the pool (connecting if need be) and put it
        back, before sending anything. redis-py raises the same ConnectionError for a
        server it cannot connect to and for a reply lost after the command was sent (and
        resent: its retries end at connect); failing here is the only certain "not sent"."""
        pool = self.client.connection_pool
        pool.release(pool.get_connection(*_GET_CONNECTION_ARGS))

    def pick(self, queue: str, limit: int, capacity: int | None, now_ms: int,
             lease_ms: int, *, token: str | None = None) -> list[Picked]:
        return self.pick_and_push(queue, limit, capacity, now_ms, lease_ms, None, 0,
                                  token=token)[1]

    def pick_and_push(self, queue: str, limit: int, capacity: int | None, now_ms: int,
                      lease_ms: int, push: DirectPush | None, queued_deadline_ms: int,
                      *, token: str | None = None) -> tuple[list[Pushed], list[Picked]]:
        """``pick``; with ``push``, the script itself pushes what it can into kombu's list
        (those dispatches are 'queued' at once, until ``queued_deadline_ms``). Returns how
        what it pushed and the picked messages left for the caller to publish. Dispatch
        ids are ``<token><call>.<n>`` (``<call>`` counted in the store, so never reused)."""
        args = _pick_args(limit, capacity, now_ms, lease_ms, push, queued_deadline_ms, token)
        return self._picked(queue, self._run("pick", queue, *args), push)

    def _picked(self, queue: str, flat: list[Any], push: DirectPush | None
                ) -> tuple[list[Pushed], list[Picked]]:
        pushed, picked, quarantined = _picked(flat, push)
        if quarantined:
            self._quarantined(queue, quarantined)
        return pushed, picked

    def promote_reclaim_pick(self, queue: str, now_ms: int, limit: int,
                             capacity: int | None, lease_ms: int, push: DirectPush | None,
                             queued_deadline_ms: int, reclaim: bool = True
                             ) -> tuple[tuple[int, int | None], tuple[int, int],
                                        tuple[list[Pushed], list[Picked]]]:
        """``promote``, ``reclaim`` (at most 1,000 each; reclaim only when ``reclaim``)
        and ``pick_and_push``, in this order, in one round trip (a pipeline: atomic
        steps, not one)."""
        prefix = self.keys(queue).prefix
        calls = [("promote", [now_ms, 1000]),
                 ("reclaim", [now_ms, 1000, TOMBSTONE_SECONDS]),
                 ("pick", _pick_args(limit, capacity, now_ms, lease_ms, push,
                                     queued_deadline_ms, None))]
        if not reclaim:
            del calls[1]
        answers = self._pipelined(prefix, calls)
        if not reclaim:
            answers.insert(1, (0, 0))
        (moved, nxt, bad), (requeued, lost), flat = answers
        if bad:
            self._quarantined(queue, bad)
        return ((int(moved), None if int(nxt) < 0 else int(nxt)),
                (int(requeued), int(lost)), self._picked(queue, flat, push))

    def _pipelined(self, prefix: str, calls: list[tuple[str, list[Any]]],
                   register: str | None = None) -> list[Any]:
        """Run scripts in one round trip. EVALSHA directly: a redis-py pipeline of Script
        objects would first ask SCRIPT EXISTS, a round trip of its own, every time. After
        a script cache flush (NOSCRIPT) they are loaded again and the calls retried; the
        scripts that had run already are run again, which is harmless for the callers
        (a pick run twice gives out new dispatch ids: see pick.lua). With ``register``,
        that queue is added to the set of fair queues after the scripts, in the same round
        trip: after, so that a dispatcher's prune of an idle queue (forget.lua, which
        drops it only while nothing is held) cannot fall between the two and drop it."""
        with _wrapped(self.where):
            for attempt in (1, 2):
                pipe = self.client.pipeline(transaction=False)
                for name, args in calls:
                    pipe.evalsha(self._scripts[name].sha, 1, prefix, *args)
                if register is not None:
                    pipe.sadd(queues_key(self.namespace), register)
                try:
                    answers = list(pipe.execute())
                    return answers[:-1] if register is not None else answers
                except redis.exceptions.NoScriptError:
                    if attempt == 2:
                        raise
                    for name, _ in calls:
                        script = self._scripts[name]
                        script.sha = self.client.script_load(script.script)
        raise AssertionError("unreachable")

    def confirm(self, queue: str, dispatch_ids: Iterable[str], deadline_ms: int) -> list[str]:
        ids = list(dispatch_ids)
        if not ids:
            return []
        return [_text(d) for d in self._run("confirm", queue, deadline_ms, *ids)]

    def begin(self, queue: str, dispatch_id: str, deadline_ms: int, *,
              now_ms: int | None = None, run: str | None = None, acks_late: bool = False,
              host: str = "", gone: Callable[[str], bool] | None = None) -> BeginResult:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        args: list[Any] = [dispatch_id, deadline_ms, now, run or uuid.uuid4().hex,
                           int(acks_late), host if gone else ""]
        reply = self._run("begin", queue, *args, "")
        if isinstance(reply, bytes) and gone is not None and gone(reply.decode()):
            # a run of this host holds it, and its process is gone: take over
            reply = self._run("begin", queue, *args, reply.decode())
        if isinstance(reply, bytes):  # a live run holds it (or another took over): a copy
            reply = self._run("begin", queue, *args[:-1], "", "")
        return BeginResult(int(reply))

    def renew(self, queue: str, dispatch_ids: Iterable[str], deadline_ms: int) -> int:
        ids = list(dispatch_ids)
        return int(self._run("renew", queue, deadline_ms, *ids)) if ids else 0

    def release(self, queue: str, dispatch_id: str, done_seconds: int = 0,
                run: str | None = None) -> bool:
        return bool(self._run("release", queue, dispatch_id, done_seconds, run or ""))

    def reclaim(self, queue: str, now_ms: int, limit: int) -> tuple[int, int]:
        requeued, lost = self._run("reclaim", queue, now_ms, limit, TOMBSTONE_SECONDS)
        return int(requeued), int(lost)

    def promote(self, queue: str, now_ms: int, limit: int) -> tuple[int, int | None]:
        moved, nxt, bad = self._run("promote", queue, now_ms, limit)
        if bad:
            self._quarantined(queue, bad)
        return int(moved), (None if int(nxt) < 0 else int(nxt))

    def configure(self, queue: str, policy: Policy) -> None:
        """Raises :class:`~celery_fair.errors.InvalidLimit` (nothing written) when a
        number of ``policy`` is out of range (:mod:`celery_fair.limits`)."""
        limits.check_policy(policy)
        self._run("configure", queue,
                  -1 if policy.default_cap is None else policy.default_cap,
                  policy.interactive_reserve, policy.default_weight,
                  json.dumps(dict(policy.caps)), json.dumps(dict(policy.weights)))

    def cancel(self, queue: str, task_ids: Iterable[str], *,
               token: str | None = None) -> list[tuple[str, bytes]]:
        """See :meth:`Store.cancel`. The copies under suffixed ids come from their task
        id's index in the store (O(copies), no scan). ``token`` names the call (made
        unique when None): the same call reaching Redis again within
        :data:`CANCELLED_SECONDS` (redis-py resending it after its reply was lost) gets
        the first one's answer, so what it removed is never lost with that reply."""
        ids = list(dict.fromkeys(task_ids))
        if not ids:
            return []
        flat = self._run("cancel", queue, CANCELLED_SECONDS, token or uuid.uuid4().hex, *ids)
        return [(_text(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]

    def check(self, queue: str, repair: bool, now_ms: int, lease_ms: int, *,
              batch: int = CHECK_BATCH, reads: list[int] | None = None
              ) -> list[tuple[str, str, str, str]]:
        """Check (and with ``repair``, fix) the invariants of ``queue`` in bounded steps
        (``check.lua``): each script call is atomic and reads about ``batch`` entries at
        most, so Redis is never blocked for long, and it is safe beside running
        dispatchers and workers (a count summed over several calls is re-counted
        atomically before anything is said about it). Keys outside the fixed ones are
        found by SCAN. Returns ``(kind, subject, detail, action)`` per finding;
        ``action`` is empty when nothing was done. ``reads``, when given, gets the
        number of entries each script call read."""
        from .checking import Checker

        checker = Checker(self, queue, [1 if repair else 0, now_ms, lease_ms], batch, reads)
        checker.run()
        if repair:
            self.trim_quarantine(queue)  # the repair may have quarantined messages
        return checker.findings

    # -- reads and bookkeeping outside the hot path -----------------------------------

    def dispatch_state(self, queue: str, dispatch_id: str) -> str | None:
        """State of a dispatch: its record's (picked, queued, running, lost,
        superseded), 'released' while its tombstone lasts, None when the store does not
        know it (never dispatched, or forgotten)."""
        k = self.keys(queue)
        with _wrapped(self.where):
            pipe = self.client.pipeline(transaction=False)
            pipe.hget(k.dispatch(dispatch_id), "s")
            pipe.hexists(k.done(dispatch_id), dispatch_id)
            state, done = pipe.execute()
        if state is not None:
            return _text(state)
        return "released" if done else None

    def queues(self) -> list[str]:
        """Every fair queue that has held a message, sorted."""
        with _wrapped(self.where):
            return sorted(_text(q) for q in self.client.smembers(queues_key(self.namespace)))

    def ping(self) -> None:
        """Raise StoreConnectionError unless the store answers."""
        with _wrapped(self.where):
            self.client.ping()

    def wait(self, queues: Iterable[str], timeout: float) -> set[str]:
        """Block until a wake marker appears on one of ``queues`` or ``timeout`` passes.

        Returns the queue whose marker was taken (empty on timeout): one per call, so with
        several woken the next call returns the next one at once. With ``timeout`` 0 it
        only looks, without blocking, and takes and returns every woken queue.
        """
        by_key = {self.keys(q).wake: q for q in queues}
        if not by_key:
            time.sleep(timeout)
            return set()
        with _wrapped(self.where):
            if timeout <= 0:
                keys = list(by_key)
                return {by_key[keys[i - 1]] for i in self._scripts["poll"](keys=keys)}
            popped = self.client.blpop(list(by_key), timeout=timeout)
        return set() if popped is None else {by_key[_text(popped[0])]}

    def forget_queue(self, queue: str) -> bool:
        """Drop ``queue`` from the set of fair queues if nothing is held, delayed, in
        flight or quarantined in it (atomic: ``forget.lua``); True when dropped. A later
        hold adds it again."""
        with _wrapped(self.where):
            forgotten = bool(self._scripts["forget"](
                keys=[self.keys(queue).prefix, queues_key(self.namespace)], args=[queue]))
        return forgotten  # a later hold from any process adds it again

    def register_worker(self, queue: str, worker: str, concurrency: int,
                        expires_ms: int) -> None:
        """A worker consuming ``queue`` with ``concurrency`` slots is alive until then.

        A worker seen for the first time wakes the dispatchers: it brings capacity. The
        entries of workers long dead are dropped here (:meth:`prune_workers`), so the
        hash stays as small as the set of live workers while reads stay reads.
        """
        k = self.keys(queue)
        with _wrapped(self.where):
            if self.client.hset(k.workers, worker, f"{expires_ms}:{concurrency}"):
                pipe = self.client.pipeline(transaction=False)
                pipe.lpush(k.wake, "1")
                pipe.ltrim(k.wake, 0, 0)
                pipe.execute()
        self.prune_workers(queue, now_ms() - PRUNE_GRACE_MS)

    def unregister_worker(self, queue: str, worker: str) -> None:
        with _wrapped(self.where):
            self.client.hdel(self.keys(queue).workers, worker)

    def prune_workers(self, queue: str, before_ms: int) -> int:
        """Forget the workers of ``queue`` whose registration expired before
        ``before_ms``; returns how many. (A worker that registers again is back.)"""
        key = self.keys(queue).workers
        with _wrapped(self.where):
            dead = [worker for worker, (expires, _) in _workers(self.client.hgetall(key))
                    if expires < before_ms]
            return int(self.client.hdel(key, *dead)) if dead else 0

    def worker_capacity(self, queue: str, now_ms: int) -> int:
        """Sum of the pool sizes of live workers consuming ``queue`` (reads only: expired
        entries are skipped here and dropped by :meth:`register_worker`)."""
        return sum(self.worker_pools(queue, now_ms).values())

    def worker_pools(self, queue: str, now_ms: int) -> dict[str, int]:
        """The live workers consuming ``queue``: {worker: pool size} (reads only)."""
        with _wrapped(self.where):
            entries = self.client.hgetall(self.keys(queue).workers)
        return {worker: concurrency for worker, (expires, concurrency) in _workers(entries)
                if expires >= now_ms}

    def loads(self, queues: Sequence[str]) -> dict[str, tuple[int, int]]:
        """{queue: (in flight, held)} of ``queues``, in one round trip (reads only)."""
        with _wrapped(self.where):
            pipe = self.client.pipeline(transaction=False)
            for queue in queues:
                pipe.hmget(self.keys(queue).stat, "inflight", "held:i", "held:b")
            rows = pipe.execute()
        return {q: (int(n or 0), int(hi or 0) + int(hb or 0))
                for q, (n, hi, hb) in zip(queues, rows)}

    def snapshot(self, queue: str) -> dict[str, Any]:
        """Totals and the figures of every group of ``queue`` (reads, not atomic).

        Reads every group: O(groups), for tests and tools that need them all. Status
        displays read :meth:`queue_figures` and :meth:`busiest_groups` instead.
        """
        with _wrapped(self.where):
            groups = sorted(_text(g) for g in self.client.smembers(self.keys(queue).groups))
        return {**self.queue_figures(queue), "groups": self.group_figures(queue, groups)}

    def queue_figures(self, queue: str) -> dict[str, Any]:
        """Totals of ``queue`` in O(1): held per class, delayed, in flight, groups with
        work, ready groups per class, releases and skipped copies so far (``stat``
        counters)."""
        k = self.keys(queue)
        with _wrapped(self.where):
            pipe = self.client.pipeline(transaction=False)
            pipe.hmget(k.stat, "inflight", "held:i", "held:b", "released", "skipped")
            pipe.zcard(k.delayed)
            pipe.scard(k.groups)
            pipe.zcard(k.ready("i"))
            pipe.zcard(k.ready("b"))
            stat, delayed, groups, ready_i, ready_b = pipe.execute()
        inflight, held_i, held_b, released, skipped = (int(v or 0) for v in stat)
        return {"queue": queue, "inflight": inflight, "delayed": delayed,
                "held_interactive": held_i, "held_background": held_b, "released": released,
                "skipped": skipped,
                "group_count": groups, "ready_interactive": ready_i, "ready_background": ready_b}

    def top_groups(self, queue: str, limit: int) -> list[tuple[str, int]]:
        """The ``limit`` groups holding the most messages, most first, with their count
        (the ``backlog`` ranking: O(log G + limit))."""
        if limit <= 0:
            return []
        with _wrapped(self.where):
            rows: list[Any] = self.client.zrevrange(self.keys(queue).backlog, 0, limit - 1,
                                                    withscores=True)
        return [(_text(g), int(n)) for g, n in rows]

    def busiest_groups(self, queue: str, limit: int) -> list[dict[str, Any]]:
        """Figures (:meth:`group_figures`) of at most ``limit`` groups with work, most held
        first, then most in flight, then by name. Reads O(limit) keys: the ``backlog``
        ranking, then, if it has fewer, other groups with work (in flight or delayed)."""
        names = [g for g, _ in self.top_groups(queue, limit)]
        if len(names) < limit:
            seen = set(names)
            with _wrapped(self.where):
                for member in self.client.sscan_iter(self.keys(queue).groups, count=200):
                    name = _text(member)
                    if name not in seen:
                        names.append(name)
                        seen.add(name)
                        if len(names) >= limit:
                            break
        rows = self.group_figures(queue, names)
        rows.sort(key=lambda r: (-(r["held_interactive"] + r["held_background"]),
                                 -r["inflight"], r["group"]))
        return rows

    def group_figures(self, queue: str, groups: list[str]) -> list[dict[str, Any]]:
        """Held, delayed, in flight, cap and weight in force of each of ``groups``;
        ``limited`` lists what a runtime limit sets ("cap", "weight"). One round trip."""
        k = self.keys(queue)
        with _wrapped(self.where):
            pipe = self.client.pipeline(transaction=False)
            for g in groups:
                pipe.llen(k.held("i", g))
                pipe.llen(k.held("b", g))
                pipe.hmget(k.group(g), "n", "d")
                pipe.hget(k.caps, g)
                pipe.hget(k.weights, g)
                pipe.hexists(k.limit_caps, g)
                pipe.hexists(k.limit_weights, g)
            pipe.hgetall(k.conf)
            *rows, conf = pipe.execute()
        conf = {_text(a): _text(b) for a, b in conf.items()}
        out = []
        for i, g in enumerate(groups):
            held_i, held_b, (n, d), cap, weight, cap_limited, weight_limited = \
                rows[i * 7:i * 7 + 7]
            cap_value = int(_first(cap, conf.get("cap"), -1))
            out.append({
                "group": g, "held_interactive": held_i, "held_background": held_b,
                "delayed": int(d or 0), "inflight": int(n or 0),
                "cap": None if cap_value < 0 else cap_value,
                "weight": float(_first(weight, conf.get("weight"), 1)),
                "limited": [name for name, on in (("cap", cap_limited),
                                                  ("weight", weight_limited)) if on],
            })
        return out

    def limit(self, queue: str, group: str, cap: int | str = KEEP,
              weight: float | str = KEEP) -> tuple[int | None, float]:
        """Set (or with :data:`RESET` clear) ``group``'s runtime cap and weight in
        ``queue``; they take precedence over the settings and survive restarts.
        ``cap`` -1 means no cap, 0 pauses the group. Returns the cap and weight now in
        force (cap None: none).

        Raises:
            InvalidGroup: ``group`` is not a group name.
            InvalidLimit: ``cap`` or ``weight`` is out of range (:mod:`celery_fair.limits`);
                nothing was written.
        """
        group = validate_group(group)
        cap_now, weight_now = self._run("limit", queue, group, _cap_arg(group, cap),
                                        _weight_arg(group, weight))
        value = int(_text(cap_now))
        return (None if value < 0 else value), float(_text(weight_now))

    def summarize(self, queue: str, groups: Sequence[str]) -> list[GroupFigures]:
        """Counts and head due times of ``groups`` (one short script; reads only)."""
        if not groups:
            return []
        flat = self._run("summarize", queue, *groups)
        rows = (flat[i:i + 6] for i in range(0, len(flat), 6))
        return [GroupFigures(g, int(hi), int(hb), int(n), int(d), _seconds(ti), _seconds(tb))
                for g, (hi, hb, n, d, ti, tb) in zip(groups, rows)]

    def quarantine(self, queue: str, dispatch_id: str, value: bytes, reason: str) -> None:
        """Keep an undecodable message aside (never dropped) and free its slot."""
        k = self.keys(queue)
        with _wrapped(self.where):
            pipe = self.client.pipeline(transaction=True)
            pipe.hset(k.quarantine, dispatch_id, value)
            pipe.hset(k.quarantine_why, dispatch_id, reason)
            pipe.lrem(k.quarantine_order, 1, dispatch_id)
            pipe.lpush(k.quarantine_order, dispatch_id)
            pipe.execute()
        self.release(queue, dispatch_id)
        self.trim_quarantine(queue)

    def _quarantined(self, queue: str, hold_ids: list[Any]) -> None:
        _log_quarantined(self.keys(queue), hold_ids)
        self.trim_quarantine(queue)

    def trim_quarantine(self, queue: str, keep: int = QUARANTINE_MAX) -> list[str]:
        """Keep the newest ``keep`` entries of ``queue``'s quarantine; each older one is
        dropped with an ERROR log line naming it. Returns the ids dropped. (Entries of a
        version before the quarantine kept its order are not counted, nor dropped.)"""
        k = self.keys(queue)
        with _wrapped(self.where):
            if self.client.llen(k.quarantine_order) <= keep:
                return []
            pipe = self.client.pipeline(transaction=True)  # each id is dropped once
            pipe.lrange(k.quarantine_order, keep, -1)
            pipe.ltrim(k.quarantine_order, 0, keep - 1)
            dropped = [_text(i) for i in reversed(pipe.execute()[0])]  # oldest first
            if dropped:
                pipe = self.client.pipeline(transaction=True)
                pipe.hdel(k.quarantine, *dropped)
                pipe.hdel(k.quarantine_why, *dropped)
                pipe.execute()
        for hold_id in dropped:
            logger.error("queue %s: quarantined message %s dropped: the quarantine keeps "
                         "the newest %d (%s)", queue, hold_id, keep, k.quarantine)
        return dropped

    def close(self) -> None:
        self.client.close()


def _log_quarantined(keys: QueueKeys, hold_ids: list[Any]) -> None:
    logger.error("queue %s: held message(s) %s could not be decoded (not written by "
                 "celery_fair, or damaged) and were moved to %s; other messages are not "
                 "affected", keys.queue, ", ".join(_text(h) for h in hold_ids), keys.quarantine)


def _workers(entries: Mapping[Any, Any]) -> Iterator[tuple[str, tuple[int, int]]]:
    """The ``workers`` hash as ``(worker, (expires_ms, concurrency))``."""
    for worker, value in entries.items():
        expires, _, concurrency = _text(value).partition(":")
        yield _text(worker), (int(expires), int(concurrency))


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a SCAN MATCH pattern."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)


def _cap_arg(group: str, cap: int | str) -> str:
    """limit.lua's ARGV for ``cap``: KEEP, RESET, -1 (no cap) or a checked cap."""
    if cap in (KEEP, RESET) or (cap == -1 and not isinstance(cap, bool)):
        return str(cap)
    return str(limits.cap(cap, f"concurrency for group {group!r}"))


def _weight_arg(group: str, weight: float | str) -> str:
    if weight in (KEEP, RESET):
        return str(weight)
    return repr(limits.weight(weight, f"weight for group {group!r}"))


def _pick_args(limit: int, capacity: int | None, now_ms: int, lease_ms: int,
               push: DirectPush | None, queued_deadline_ms: int,
               token: str | None) -> list[Any]:
    token = token or uuid.uuid4().hex[:12] + "."
    args: list[Any] = [now_ms, limit, -1 if capacity is None else capacity, lease_ms, token]
    if push is not None:
        args += [push.queue, push.sep, ",".join(map(str, push.priority_steps)),
                 queued_deadline_ms, push.exchange, push.routing_key, push.binding_key]
    return args


def _picked(flat: list[Any], push: DirectPush | None
            ) -> tuple[list[Pushed], list[Picked], list[Any]]:
    """Unpack pick.lua's answer: pushed, picked and quarantined (an entry without a
    dispatch id)."""
    pushed: list[Pushed] = []
    if push is not None:
        count = int(flat.pop(0))
        for i in range(0, 3 * count, 3):
            due = _text(flat[i + 1])
            pushed.append(Pushed(_text(flat[i]), float(due) if due else None,
                                 _text(flat[i + 2])))
        del flat[:3 * count]
    picked, quarantined = [], []
    for i in range(0, len(flat), 3):
        if flat[i]:
            picked.append(Picked(_text(flat[i]), _text(flat[i + 1]), flat[i + 2]))
        else:
            quarantined.append(flat[i + 1])
    return pushed, picked, quarantined


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _seconds(value: Any) -> float | None:
    text = _text(value)
    return float(text) if text else None


@dataclass(frozen=True)
class GroupFigures:
    """One group as ``summarize`` sees it; ``due_*``: when its oldest held message of
    that class became due (epoch seconds), None when it holds none (or an old message)."""

    group: str
    held_interactive: int
    held_background: int
    inflight: int
    delayed: int
    due_interactive: float | None
    due_background: float | None


def now_ms() -> int:
    return int(time.time() * 1000)


def as_policy(caps: Mapping[str, int], weights: Mapping[str, float], default_cap: int | None,
              reserve: int) -> Policy:
    return Policy(default_cap, reserve, 1.0, caps, weights)
