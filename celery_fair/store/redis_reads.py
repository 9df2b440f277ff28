"""The store's reads and worker registry, outside the hot path: figures for status,
metrics and dashboards; the live workers of each queue and their pools; the wake-ups a
dispatcher waits on. Plain Redis commands, no Lua where a read needs none."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import redis
from redis.commands.core import Script

from .base import PRUNE_GRACE_MS, GroupFigures
from .connection import _first, _seconds, _text, _wrapped, now_ms
from .keys import QueueKeys, queues_key


class RedisReads:
    """What :class:`~celery_fair.store.redis.RedisStore` reads and registers with plain
    commands (a mixin: the store gives the client, namespace and scripts)."""

    client: redis.Redis
    namespace: str
    where: str
    _scripts: dict[str, Script]

    def keys(self, queue: str) -> QueueKeys:
        return QueueKeys(self.namespace, queue)

    def _run(self, name: str, queue: str, *args: Any) -> Any:
        raise NotImplementedError  # RedisStore runs its scripts

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

    def summarize(self, queue: str, groups: Sequence[str]) -> list[GroupFigures]:
        """Counts and head due times of ``groups`` (one short script; reads only)."""
        if not groups:
            return []
        flat = self._run("summarize", queue, *groups)
        rows = (flat[i:i + 6] for i in range(0, len(flat), 6))
        return [GroupFigures(g, int(hi), int(hb), int(n), int(d), _seconds(ti), _seconds(tb))
                for g, (hi, hb, n, d, ti, tb) in zip(groups, rows)]


def _workers(entries: Mapping[Any, Any]) -> Iterator[tuple[str, tuple[int, int]]]:
    """The ``workers`` hash as ``(worker, (expires_ms, concurrency))``."""
    for worker, value in entries.items():
        expires, _, concurrency = _text(value).partition(":")
        yield _text(worker), (int(expires), int(concurrency))
