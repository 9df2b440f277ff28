"""The Redis store: each operation is one Lua script (``lua/<operation>.lua``)."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import redis
from redis.commands.core import Script

from ..errors import StoreConnectionError, StoreError
from .base import BeginResult, Picked, Policy, Store
from .keys import QueueKeys, queues_key
from .scripts import OPERATIONS, source

#: How long the record of a superseded or lost dispatch is kept (seconds). A stale copy
#: delivered later than this runs as an unknown dispatch.
TOMBSTONE_SECONDS = 86_400


@contextmanager
def _wrapped() -> Iterator[None]:
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise StoreConnectionError(f"celery_fair store unreachable: {exc}") from exc
    except redis.RedisError as exc:
        raise StoreError(f"celery_fair store failed: {exc}") from exc


class RedisStore(Store):
    """Fair queues of one namespace in one Redis database."""

    def __init__(self, client: redis.Redis, namespace: str = "fair") -> None:
        self.client = client
        self.namespace = namespace
        self._scripts: dict[str, Script] = {
            name: client.register_script(source(name)) for name in OPERATIONS}
        self._known_queues: set[str] = set()

    @classmethod
    def from_url(cls, url: str, namespace: str = "fair", **options: Any) -> RedisStore:
        options.setdefault("health_check_interval", 30)
        options.setdefault("socket_keepalive", True)
        return cls(redis.Redis.from_url(url, **options), namespace)

    def keys(self, queue: str) -> QueueKeys:
        return QueueKeys(self.namespace, queue)

    def _run(self, name: str, queue: str, *args: Any) -> Any:
        with _wrapped():
            return self._scripts[name](keys=[self.keys(queue).prefix], args=args)

    # -- the atomic operations ---------------------------------------------------------

    def hold(self, queue: str, hold_id: str, value: bytes, due_ms: int, now_ms: int) -> str:
        if queue not in self._known_queues:
            with _wrapped():
                self.client.sadd(queues_key(self.namespace), queue)
            self._known_queues.add(queue)
        return _text(self._run("hold", queue, hold_id, value, due_ms, now_ms))

    def pick(self, queue: str, limit: int, capacity: int | None, now_ms: int,
             lease_ms: int) -> list[Picked]:
        token = uuid.uuid4().hex[:12] + "."
        flat = self._run("pick", queue, now_ms, limit, -1 if capacity is None else capacity,
                         lease_ms, token)
        return [Picked(_text(flat[i]), _text(flat[i + 1]), flat[i + 2])
                for i in range(0, len(flat), 3)]

    def confirm(self, queue: str, dispatch_ids: Iterable[str], deadline_ms: int) -> list[str]:
        ids = list(dispatch_ids)
        if not ids:
            return []
        return [_text(d) for d in self._run("confirm", queue, deadline_ms, *ids)]

    def begin(self, queue: str, dispatch_id: str, deadline_ms: int) -> BeginResult:
        return BeginResult(int(self._run("begin", queue, dispatch_id, deadline_ms)))

    def renew(self, queue: str, dispatch_ids: Iterable[str], deadline_ms: int) -> int:
        ids = list(dispatch_ids)
        return int(self._run("renew", queue, deadline_ms, *ids)) if ids else 0

    def release(self, queue: str, dispatch_id: str) -> bool:
        return bool(self._run("release", queue, dispatch_id))

    def reclaim(self, queue: str, now_ms: int, limit: int) -> tuple[int, int]:
        requeued, lost = self._run("reclaim", queue, now_ms, limit, TOMBSTONE_SECONDS)
        return int(requeued), int(lost)

    def promote(self, queue: str, now_ms: int, limit: int) -> tuple[int, int | None]:
        moved, nxt = self._run("promote", queue, now_ms, limit)
        return int(moved), (None if int(nxt) < 0 else int(nxt))

    def configure(self, queue: str, policy: Policy) -> None:
        self._run("configure", queue,
                  -1 if policy.default_cap is None else policy.default_cap,
                  policy.interactive_reserve, policy.default_weight,
                  json.dumps(dict(policy.caps)), json.dumps(dict(policy.weights)))

    def cancel(self, queue: str, task_ids: Iterable[str]) -> list[tuple[str, bytes]]:
        ids = list(dict.fromkeys(task_ids))
        if not ids:
            return []
        ids += self._suffixed_copies(queue, ids)
        flat = self._run("cancel", queue, *ids)
        return [(_text(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]

    def _suffixed_copies(self, queue: str, ids: list[str]) -> list[str]:
        """Hold ids ``<id>~<n>`` of ``ids`` (an id held twice). Found by a scan of the
        held ids, done only in a queue that ever had such a copy (``stat`` ``dup``)."""
        k = self.keys(queue)
        with _wrapped():
            if not int(self.client.hget(k.stat, "dup") or 0):
                return []
            held = [_text(key) for key, _ in self.client.hscan_iter(k.msg, match="*~*",
                                                                     count=1000)]
        wanted = set(ids)
        return [hid for hid in held if hid not in wanted and any(
            hid[:i] in wanted for i, ch in enumerate(hid) if ch == "~")]

    # -- reads and bookkeeping outside the hot path -----------------------------------

    def queues(self) -> list[str]:
        """Every fair queue that has held a message, sorted."""
        with _wrapped():
            return sorted(_text(q) for q in self.client.smembers(queues_key(self.namespace)))

    def wait(self, queues: Iterable[str], timeout: float) -> bool:
        """Block until a wake marker appears on one of ``queues`` or ``timeout`` passes."""
        keys = [self.keys(q).wake for q in queues]
        if not keys:
            time.sleep(timeout)
            return False
        with _wrapped():
            return self.client.blpop(keys, timeout=max(timeout, 0.001)) is not None

    def register_worker(self, queue: str, worker: str, concurrency: int,
                        expires_ms: int) -> None:
        """A worker consuming ``queue`` with ``concurrency`` slots is alive until then.

        A worker seen for the first time wakes the dispatchers: it brings capacity.
        """
        k = self.keys(queue)
        with _wrapped():
            if self.client.hset(k.workers, worker, f"{expires_ms}:{concurrency}"):
                pipe = self.client.pipeline(transaction=False)
                pipe.lpush(k.wake, "1")
                pipe.ltrim(k.wake, 0, 0)
                pipe.execute()

    def unregister_worker(self, queue: str, worker: str) -> None:
        with _wrapped():
            self.client.hdel(self.keys(queue).workers, worker)

    def worker_capacity(self, queue: str, now_ms: int) -> int:
        """Sum of the pool sizes of live workers consuming ``queue``; forgets dead ones."""
        key = self.keys(queue).workers
        with _wrapped():
            entries = self.client.hgetall(key)
            total, dead = 0, []
            for worker, value in entries.items():
                expires, _, concurrency = _text(value).partition(":")
                if int(expires) < now_ms:
                    dead.append(worker)
                else:
                    total += int(concurrency)
            if dead:
                self.client.hdel(key, *dead)
        return total

    def snapshot(self, queue: str) -> dict[str, Any]:
        """Per-group figures of ``queue`` for status displays (reads, not atomic)."""
        k = self.keys(queue)
        with _wrapped():
            groups = sorted(_text(g) for g in self.client.smembers(k.groups))
            pipe = self.client.pipeline(transaction=False)
            for g in groups:
                pipe.llen(k.held("i", g))
                pipe.llen(k.held("b", g))
                pipe.hmget(k.group(g), "n", "d")
                pipe.hget(k.caps, g)
                pipe.hget(k.weights, g)
            pipe.hgetall(k.conf)
            pipe.hget(k.stat, "inflight")
            pipe.zcard(k.delayed)
            *rows, conf, inflight, delayed = pipe.execute()
        conf = {_text(a): _text(b) for a, b in conf.items()}
        out = []
        for i, g in enumerate(groups):
            held_i, held_b, (n, d), cap, weight = rows[i * 5:i * 5 + 5]
            cap_value = int(cap if cap is not None else conf.get("cap", -1))
            out.append({
                "group": g, "held_interactive": held_i, "held_background": held_b,
                "delayed": int(d or 0), "inflight": int(n or 0),
                "cap": None if cap_value < 0 else cap_value,
                "weight": float(weight if weight is not None else conf.get("weight", 1)),
            })
        return {"queue": queue, "inflight": int(inflight or 0), "delayed": delayed,
                "groups": out}

    def quarantine(self, queue: str, dispatch_id: str, value: bytes, reason: str) -> None:
        """Keep an undecodable message aside (never dropped) and free its slot."""
        k = self.keys(queue)
        with _wrapped():
            self.client.hset(f"{k.prefix}:quarantine", dispatch_id, value)
            self.client.hset(f"{k.prefix}:quarantine:why", dispatch_id, reason)
        self.release(queue, dispatch_id)

    def close(self) -> None:
        self.client.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_stores: dict[tuple[int, str, str], RedisStore] = {}


def store_for_url(url: str, namespace: str) -> RedisStore:
    """One store per process, URL and namespace (a new one after fork)."""
    key = (os.getpid(), url, namespace)
    store = _stores.get(key)
    if store is None:
        store = _stores[key] = RedisStore.from_url(url, namespace)
    return store


def now_ms() -> int:
    return int(time.time() * 1000)


def as_policy(caps: Mapping[str, int], weights: Mapping[str, float], default_cap: int | None,
              reserve: int) -> Policy:
    return Policy(default_cap, reserve, 1.0, caps, weights)
