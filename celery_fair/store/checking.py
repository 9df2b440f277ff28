"""Runs ``check.lua``'s steps over one fair queue (:meth:`RedisStore.check`).

The steps and why a check in steps is exact beside live dispatchers: ``check.lua``'s
header and DESIGN.md, "Invariants and `fair check`".
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

from .connection import _glob_escape, _text, _wrapped
from .keys import QueueKeys


class CheckedStore(Protocol):
    """What the checker needs of :class:`~celery_fair.store.redis.RedisStore` (named by
    its shape, so this module need not import the store that imports it)."""

    client: Any
    where: str

    def _run(self, name: str, queue: str, *args: Any) -> Any: ...

    def keys(self, queue: str) -> QueueKeys: ...


class Checker:
    """One run of ``check.lua``'s steps over one fair queue (see its header)."""

    def __init__(self, store: CheckedStore, queue: str, head: list[Any], batch: int,
                 reads: list[int] | None) -> None:
        self.store, self.queue, self.head, self.batch = store, queue, head, batch
        self.reads = reads if reads is not None else []
        self.findings: list[tuple[str, str, str, str]] = []
        self.token = uuid.uuid4().hex

    def call(self, step: str, *args: Any) -> str:
        """Run one step call; its ``next`` ('' when the step is done)."""
        flat = self.store._run("check", self.queue, *self.head, step, self.batch,
                               self.token, *args)
        self.reads.append(int(flat[1]))
        self.findings += [(_text(flat[i]), _text(flat[i + 1]), _text(flat[i + 2]),
                           _text(flat[i + 3])) for i in range(2, len(flat), 4)]
        return _text(flat[0])

    def scan(self, step: str) -> None:
        cursor = "0"
        while cursor:
            cursor = self.call(step, cursor)

    def run(self) -> None:
        if self.call("fixed") == "blocked":
            return
        groups, dispatch_ids = self.keys_found()
        for chunk in _chunks(sorted(groups), self.batch):
            at = self.call("lists", json.dumps(chunk), "")
            while at:
                at = self.call("lists", json.dumps(chunk), at)
        self.scan("delayed")
        self.scan("msg")
        cursor = "0"
        while cursor:
            cursor = self.call("dispatch", cursor, "[]")
        for chunk in _chunks(sorted(dispatch_ids), self.batch):
            self.call("dispatch", "", json.dumps(chunk))
        groups |= self.members(f"{self.store.keys(self.queue).prefix}:check:groups", "set")
        for chunk in _chunks(sorted(groups), self.batch):
            self.call("group", json.dumps(chunk))
        self.call("final")

    def keys_found(self) -> tuple[set[str], set[str]]:
        """Groups and dispatch ids of the queue's keys (SCAN; not atomic: each step
        re-reads what it is given), and the groups of its sets."""
        k = self.store.keys(self.queue)
        groups: set[str] = set()
        dispatch_ids: set[str] = set()
        parts = {f"{k.prefix}:q:i:": groups, f"{k.prefix}:q:b:": groups,
                 f"{k.prefix}:g:": groups, f"{k.prefix}:d:": dispatch_ids}
        with _wrapped(self.store.where):
            for raw in self.store.client.scan_iter(match=_glob_escape(k.prefix) + ":*",
                                                   count=1000):
                key = _text(raw)
                for head, found in parts.items():
                    if key.startswith(head):
                        found.add(key[len(head):])
        groups |= self.members(k.groups, "set")
        for key in (k.ready("i"), k.ready("b"), k.backlog):
            groups |= self.members(key, "zset")
        return groups, dispatch_ids

    def members(self, key: str, kind: str) -> set[str]:
        client = self.store.client
        with _wrapped(self.store.where):
            if kind == "set":
                return {_text(m) for m in client.sscan_iter(key, count=1000)}
            return {_text(m) for m, _ in client.zscan_iter(key, count=1000)}


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
