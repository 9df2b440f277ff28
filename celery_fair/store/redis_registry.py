"""The Redis store's worker registry (see ``registry.py``): the ``workers`` hash (worker
-> ``<expires ms>:<pool>``, the format every version reads) and the ``wmeta`` hash
(worker -> ``<started ms>:<slot>``), both written by ``register.lua`` so that a slot is
taken atomically."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import redis

from .connection import _text, _wrapped
from .keys import QueueKeys
from .models import PRUNE_GRACE_MS, LiveWorker
from .registry import by_slot


class RedisRegistry:
    """Registers workers (a mixin of :class:`~celery_fair.store.redis.RedisStore`)."""

    client: redis.Redis
    where: str

    def keys(self, queue: str) -> QueueKeys:
        raise NotImplementedError  # RedisStore gives them

    def _run(self, name: str, queue: str, *args: Any) -> Any:
        raise NotImplementedError  # RedisStore runs its scripts

    def register_worker(self, queue: str, worker: str, concurrency: int, expires_ms: int,
                        now_ms: int) -> None:
        """A worker consuming ``queue`` with ``concurrency`` slots is alive until then
        (``register.lua``: its start and slot, see ``registry.py``).

        A worker seen for the first time wakes the dispatchers: it brings capacity. The
        entries of workers long dead are dropped in the same script, so the hashes stay
        as small as the set of live workers while reads stay reads.
        """
        if self._run("register", queue, worker, concurrency, expires_ms, now_ms,
                     now_ms - PRUNE_GRACE_MS):
            k = self.keys(queue)
            with _wrapped(self.where):
                pipe = self.client.pipeline(transaction=False)
                pipe.lpush(k.wake, "1")
                pipe.ltrim(k.wake, 0, 0)
                pipe.execute()

    def unregister_worker(self, queue: str, worker: str) -> None:
        k = self.keys(queue)
        with _wrapped(self.where):
            pipe = self.client.pipeline(transaction=True)
            pipe.hdel(k.workers, worker)
            pipe.hdel(k.wmeta, worker)
            pipe.execute()

    def prune_workers(self, queue: str, before_ms: int) -> int:
        """Forget the workers of ``queue`` whose registration expired before
        ``before_ms``; returns how many. (A worker that registers again is back, as a
        newcomer.)"""
        k = self.keys(queue)
        with _wrapped(self.where):
            dead = [worker for worker, (expires, _) in _workers(self.client.hgetall(k.workers))
                    if expires < before_ms]
            if not dead:
                return 0
            pipe = self.client.pipeline(transaction=True)
            pipe.hdel(k.workers, *dead)
            pipe.hdel(k.wmeta, *dead)
            return int(pipe.execute()[0])

    def worker_pools(self, queue: str, now_ms: int) -> dict[str, int]:
        """The live workers consuming ``queue``: {worker: pool size} (reads only)."""
        with _wrapped(self.where):
            entries = self.client.hgetall(self.keys(queue).workers)
        return {worker: concurrency for worker, (expires, concurrency) in _workers(entries)
                if expires >= now_ms}

    def live_workers(self, queue: str, now_ms: int) -> list[LiveWorker]:
        k = self.keys(queue)
        with _wrapped(self.where):
            pipe = self.client.pipeline(transaction=True)
            pipe.hgetall(k.workers)
            pipe.hgetall(k.wmeta)
            entries, metas = pipe.execute()
        meta = {_text(w): _text(v).partition(":") for w, v in metas.items()}
        found = []
        for worker, (expires, pool) in _workers(entries):
            if expires >= now_ms:
                started, _, slot = meta.get(worker, ("", "", ""))
                found.append(LiveWorker(worker, pool, int(started) if started else None,
                                        int(slot) if slot else None))
        return sorted(found, key=by_slot)


def _workers(entries: Mapping[Any, Any]) -> Iterator[tuple[str, tuple[int, int]]]:
    """The ``workers`` hash as ``(worker, (expires_ms, concurrency))``."""
    for worker, value in entries.items():
        expires, _, concurrency = _text(value).partition(":")
        yield _text(worker), (int(expires), int(concurrency))
