"""The Redis store's affinity routing (see ``routing.py``): the map (``aff``: group ->
worker, ``assign.lua``), the workers' routed dispatches in flight (``wflight``, kept by
pick, release, reclaim and renew through the record's ``w``) and the routed pick
(``pick.lua`` with ``include/routing.lua``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from .connection import _text, _wrapped
from .keys import QueueKeys
from .models import Picked
from .routing import Routed


class RedisRouting:
    """Routes groups to workers (a mixin of :class:`~celery_fair.store.redis.RedisStore`)."""

    client: redis.Redis
    where: str
    supports_affinity = True

    def keys(self, queue: str) -> QueueKeys:
        raise NotImplementedError  # RedisStore gives them

    def _run(self, name: str, queue: str, *args: Any) -> Any:
        raise NotImplementedError  # RedisStore runs its scripts

    def _pipelined(self, prefix: str, calls: list[tuple[str, list[Any]]],
                   register: str | None = None, replicate: bool = False) -> list[Any]:
        raise NotImplementedError  # RedisStore runs its scripts

    def _quarantined(self, queue: str, ids: list[Any]) -> None:
        raise NotImplementedError  # RedisStore logs them

    def promote(self, queue: str, now_ms: int, limit: int) -> tuple[int, int | None]:
        raise NotImplementedError  # RedisStore promotes

    def pick_routed(self, queue: str, limit: int, capacity: int | None, now_ms: int,
                    lease_ms: int, workers: Mapping[str, int], spill_ms: int | None, *,
                    promote: bool = False, token: str | None = None) -> Routed:
        if not workers:  # no live target: nothing goes (pick.lua would pick unrouted)
            return Routed(promoted=self.promote(queue, now_ms, 1000) if promote else (0, None))
        spec = "".join(f"{w}\n{n}\n" for w, n in workers.items())
        # pick.lua's ARGV: no direct push (ARGV[6] to [12] empty), then the routing
        args: list[Any] = [now_ms, limit, -1 if capacity is None else capacity, lease_ms,
                           token or uuid.uuid4().hex[:12] + ".", "", "", "", "", "", "", "", spec,
                           -1 if spill_ms is None else spill_ms]
        calls = [("pick", args)]
        if promote:
            calls.insert(0, ("promote", [now_ms, 1000]))
        # replicated before anything is published (see RedisStore.pick_and_push)
        answers = self._pipelined(self.keys(queue).prefix, calls, replicate=True)
        promoted: tuple[int, int | None] = (0, None)
        if promote:
            moved, nxt, bad = answers.pop(0)
            if bad:
                self._quarantined(queue, bad)
            promoted = (int(moved), None if int(nxt) < 0 else int(nxt))
        flat, hosts, unassigned = answers[0]
        picked = [Picked(_text(flat[i]), _text(flat[i + 1]), flat[i + 2])
                  for i in range(0, len(flat), 3) if flat[i]]
        quarantined = [flat[i + 1] for i in range(0, len(flat), 3) if not flat[i]]
        if quarantined:
            self._quarantined(queue, quarantined)
        return Routed(picked, [_text(h) for h in hosts], sorted(_text(g) for g in unassigned),
                      promoted)

    def assign(self, queue: str, changes: Sequence[tuple[str, str | None, str]]) -> int:
        moves = 0
        for start in range(0, len(changes), 500):  # Redis is blocked while a script runs
            args = [part for group, old, new in changes[start:start + 500]
                    for part in (group, "*" if old is None else old, new)]
            if args:
                moves += int(self._run("assign", queue, *args)[1])
        return moves

    def assignments(self, queue: str) -> dict[str, str]:
        with _wrapped(self.where):
            found = self.client.hgetall(self.keys(queue).aff)
        return {_text(g): _text(w) for g, w in found.items()}

    def worker_inflight(self, queue: str) -> dict[str, int]:
        with _wrapped(self.where):
            found = self.client.hgetall(self.keys(queue).wflight)
        return {_text(w): int(n) for w, n in found.items() if int(n) > 0}

    def affinity_moves(self, queue: str) -> int:
        with _wrapped(self.where):
            moves = self.client.hget(self.keys(queue).stat, "moves")
        return int(moves or 0)
