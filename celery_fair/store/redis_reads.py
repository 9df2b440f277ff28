"""The store's reads, outside the hot path: figures for status, metrics and dashboards;
the dispatchers' beats; the wake-ups a dispatcher waits on (the worker registry is
``redis_registry.py``). Plain Redis commands, no Lua where a read needs none."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import redis
from redis.commands.core import Script

from ..envelope import placement_of
from .base import (
    PRUNE_GRACE_MS,
    DispatcherBeat,
    GroupFigures,
    GroupHeads,
    Location,
    QueueFigures,
    busiest_first,
    limited_by,
    snapshot_of,
)
from .connection import _first, _seconds, _stamp, _text, _wrapped
from .held import HeldMessage
from .keys import QueueKeys, dispatchers_key, queues_key
from .locating import CLASS_NAMES, Locating, place_of
from .models import PLACEMENT_CLASSES


class RedisReads(Locating):
    """What :class:`~celery_fair.store.redis.RedisStore` reads and registers with plain
    commands (a mixin: the store gives the client, namespace and scripts)."""

    client: redis.Redis
    namespace: str
    where: str
    _scripts: dict[str, Script]
    _lane: Any

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
            # through the lane (lane.py; a cluster's store has none): a dispatcher waits
            # once per step
            popped = self.client.blpop(list(by_key), timeout=timeout) if self._lane is None \
                else self._lane.call("BLPOP", *by_key, timeout)
        return set() if not popped else {by_key[_text(popped[0])]}

    def forget_queue(self, queue: str) -> bool:
        """Drop ``queue`` from the set of fair queues if nothing is held, delayed, in
        flight or quarantined in it (atomic: ``forget.lua``); True when dropped. A later
        hold adds it again."""
        with _wrapped(self.where):
            forgotten = bool(self._scripts["forget"](
                keys=[self.keys(queue).prefix, queues_key(self.namespace)], args=[queue]))
        return forgotten  # a later hold from any process adds it again

    def beat(self, dispatcher: DispatcherBeat, now_ms: int, ttl_ms: int) -> None:
        """One HSET of the beat (JSON with its expiry) in the namespace's ``dispatchers``
        hash, and the HDEL of beats expired PRUNE_GRACE_MS ago (read in the same round
        trip)."""
        key = dispatchers_key(self.namespace)
        doc = json.dumps({**dispatcher.as_json(), "expires_ms": now_ms + ttl_ms})
        with _wrapped(self.where):
            pipe = self.client.pipeline(transaction=False)
            pipe.hset(key, dispatcher.id, doc)
            pipe.hgetall(key)
            entries = pipe.execute()[1]
            dead = [beat.id for beat, expires in _beats(entries)
                    if expires < now_ms - PRUNE_GRACE_MS]
            if dead:
                self.client.hdel(key, *dead)

    def dispatchers(self, now_ms: int) -> list[DispatcherBeat]:
        with _wrapped(self.where):
            entries = self.client.hgetall(dispatchers_key(self.namespace))
        return sorted((beat for beat, expires in _beats(entries) if expires >= now_ms),
                      key=lambda beat: beat.id)

    def forget_dispatcher(self, dispatcher_id: str) -> None:
        with _wrapped(self.where):
            self.client.hdel(dispatchers_key(self.namespace), dispatcher_id)

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
        return snapshot_of(self.queue_figures(queue), self.group_figures(queue, groups))

    def queue_figures(self, queue: str) -> QueueFigures:
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
        return QueueFigures(queue, inflight=inflight, delayed=delayed, held_interactive=held_i,
                            held_background=held_b, released=released, skipped=skipped,
                            group_count=groups, ready_interactive=ready_i,
                            ready_background=ready_b)

    def top_groups(self, queue: str, limit: int) -> list[tuple[str, int]]:
        """The ``limit`` groups holding the most messages, most first, with their count
        (the ``backlog`` ranking: O(log G + limit))."""
        if limit <= 0:
            return []
        with _wrapped(self.where):
            rows: list[Any] = self.client.zrevrange(self.keys(queue).backlog, 0, limit - 1,
                                                    withscores=True)
        return [(_text(g), int(n)) for g, n in rows]

    def busiest_groups(self, queue: str, limit: int) -> list[GroupFigures]:
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
        return busiest_first(self.group_figures(queue, names))

    def group_figures(self, queue: str, groups: Sequence[str]) -> list[GroupFigures]:
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
            pipe.smembers(k.parked_lists)
            *rows, conf, parked_lists = pipe.execute()
            parked = self._parked_counts(k, parked_lists, groups)
        conf = {_text(a): _text(b) for a, b in conf.items()}
        out = []
        for i, g in enumerate(groups):
            held_i, held_b, (n, d), cap, weight, cap_limited, weight_limited = \
                rows[i * 7:i * 7 + 7]
            held_i += parked.get(("i", g), 0)  # parked (caps per subgroup): held too
            held_b += parked.get(("b", g), 0)
            cap_value = int(_first(cap, conf.get("cap"), -1))
            out.append(GroupFigures(
                g, held_interactive=held_i, held_background=held_b, delayed=int(d or 0),
                inflight=int(n or 0), cap=None if cap_value < 0 else cap_value,
                weight=float(_first(weight, conf.get("weight"), 1)),
                limited=limited_by(cap_limited, weight_limited)))
        return out

    def _parked_counts(self, k: Any, members: Any, groups: Sequence[str]
                       ) -> dict[tuple[str, str], int]:
        """(class, group) -> its parked ids (caps per subgroup), for ``groups``; one
        round trip when any is parked."""
        wanted = set(groups)
        lists = [(_text(m)[0], *_text(m)[2:].split("/", 1)) for m in members]
        lists = [(c, g, s) for c, g, s in lists if g in wanted]
        if not lists:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for c, g, s in lists:
            pipe.llen(k.parked(c, g, s))
        out: dict[tuple[str, str], int] = {}
        for (c, g, _), n in zip(lists, pipe.execute()):
            out[(c, g)] = out.get((c, g), 0) + int(n)
        return out

    def summarize(self, queue: str, groups: Sequence[str]) -> list[GroupHeads]:
        """Counts, head due times and head times of ``groups`` (one short script; reads
        only)."""
        if not groups:
            return []
        flat = self._run("summarize", queue, *groups)
        rows = (flat[i:i + 8] for i in range(0, len(flat), 8))
        return [GroupHeads(g, int(hi), int(hb), int(n), int(d), _seconds(ti), _seconds(tb),
                           _stamp(si), _stamp(sb))
                for g, (hi, hb, n, d, ti, tb, si, sb) in zip(groups, rows)]


    # -- where a task stands (``fair inspect``) --------------------------------------

    def held_messages(self, queue: str, group: str, limit: int,
                      klass: str | None = None) -> list[HeldMessage]:
        k, classes = self.keys(queue), [klass] if klass else list(PLACEMENT_CLASSES)
        with _wrapped(self.where):
            pipe = self.client.pipeline(transaction=True)  # both lists at one instant
            for c in classes:
                pipe.lrange(k.held(c, group), 0, limit - 1)
            ids = [(c, _text(i)) for c, got in zip(classes, pipe.execute())
                   for i in [*got, *self._parked_ids(k, c, group)]]
            values = self.client.hmget(k.msg, [i for _, i in ids[:limit]]) if ids else []
        # a message picked between the two reads has no value any more: not held
        return [HeldMessage(i, c, v.encode() if isinstance(v, str) else v)
                for (c, i), v in zip(ids, values) if v is not None]

    def _parked_ids(self, k: Any, klass: str, group: str) -> list[str]:
        """Caps per subgroup: the ids g's class list has parked, by subgroup name then
        order (after the list, as the memory store's ``held_ids``)."""
        head = f"{klass}:{group}/"
        subs = sorted(m[len(head):] for m in map(_text, self.client.smembers(k.parked_lists))
                      if m.startswith(head))
        return [_text(i) for sub in subs
                for i in self.client.lrange(k.parked(klass, group, sub), 0, -1)]

    def _held_at(self, queue: str, task_id: str) -> Location | None:
        k = self.keys(queue)
        client: Any = self.client  # redis-py's reply types are unions
        with _wrapped(self.where):
            value = client.hget(k.msg, task_id)
            if value is None:
                return None
            placed = placement_of(value, task_id)
            group, klass = placed.group, placed.klass
            where = Location(task_id, queue, group, CLASS_NAMES.get(klass, klass), "held")
            # one snapshot of where it stands: a pick between the value's read and these
            # took it (its dispatch is found next), never "held" with no place
            pipe = client.pipeline(transaction=True)
            pipe.hexists(k.msg, task_id)
            pipe.zscore(k.delayed, task_id)
            pipe.lpos(k.held(klass, group), task_id)
            still, due, position = pipe.execute()
            if not still:
                return None
            if due is not None:
                return dataclasses.replace(where, state="delayed", due_ms=int(due))
            if position is None and task_id in (parked := self._parked_ids(k, klass, group)):
                position = client.llen(k.held(klass, group)) + parked.index(task_id)
        place = place_of(self, queue, klass, group, None if position is None else int(position))
        return dataclasses.replace(where, place=place)

    def _copies_at(self, queue: str, task_id: str) -> list[str]:
        with _wrapped(self.where):
            return sorted(_text(h) for h in self.client.smembers(self.keys(queue).copies(task_id)))

    def _dispatched_at(self, queue: str, task_id: str) -> Location | None:
        """A picked, queued or running dispatch of ``task_id`` (read through the leases:
        one per task in flight)."""
        k = self.keys(queue)
        with _wrapped(self.where):
            dispatch_ids = [_text(d) for d in self.client.zrange(k.leases, 0, -1)]
            pipe = self.client.pipeline(transaction=False)
            for did in dispatch_ids:
                pipe.hmget(k.dispatch(did), "id", "s", "g", "c")
            records = pipe.execute()
        for did, (hold_id, state, group, klass) in zip(dispatch_ids, records):
            if hold_id is not None and _text(hold_id).split("~")[0] == task_id:
                return Location(task_id, queue, _text(group),
                                CLASS_NAMES.get(_text(klass), _text(klass)), _text(state),
                                dispatch_id=did)
        return None

    def ready_rank(self, queue: str, klass: str, group: str) -> tuple[int | None, float]:
        """See :meth:`~celery_fair.store.locating.PlaceReads.ready_rank`."""
        k = self.keys(queue)
        client: Any = self.client
        with _wrapped(self.where):
            rank = client.zrank(k.ready(klass), group)
            tag = float(self.client.hget(k.group(group), "t" + klass) or 0)
            if rank is None:  # it re-enters the ready set at the virtual time at the earliest
                tag = max(tag, float(self.client.hget(k.vt, klass) or 0))
        return (None if rank is None else int(rank)), tag

    def ready_before(self, queue: str, klass: str, start: float,
                     limit: int) -> list[tuple[str, float]]:
        """See :meth:`~celery_fair.store.locating.PlaceReads.ready_before`."""
        with _wrapped(self.where):
            rows: list[Any] = self.client.zrangebyscore(
                self.keys(queue).ready(klass), "-inf", f"({start}", start=0, num=limit,
                withscores=True)
        return [(_text(g), float(t)) for g, t in rows]


    # -- the summaries dashboards read (summary.py), and maintenance ----------------

    def claim_writer(self, queue: str, ms: int) -> bool:
        """See :meth:`Store.claim_writer` (a ``SET NX PX`` guard key)."""
        with _wrapped(self.where):
            return bool(self.client.set(f"{self.keys(queue).summary}:writer", "1", nx=True,
                                        px=ms))

    def put_summary(self, queue: str, doc: str, ttl_seconds: int) -> None:
        """See :meth:`Store.put_summary`."""
        with _wrapped(self.where):
            self.client.set(self.keys(queue).summary, doc, ex=ttl_seconds)

    def summaries(self, queues: Sequence[str]) -> dict[str, str | None]:
        """See :meth:`Store.summaries` (one round trip)."""
        with _wrapped(self.where):
            pipe = self.client.pipeline(transaction=False)
            for queue in queues:
                pipe.get(self.keys(queue).summary)
            values = pipe.execute()
        return {queue: None if value is None else _text(value)
                for queue, value in zip(queues, values)}

    def flush(self) -> None:
        """See :meth:`Store.flush`: SCAN and DEL the namespace's keys, 500 at a time."""
        client: Any = self.client
        pattern = self.namespace.replace("[", "\\[").replace("*", "\\*") + ":*"
        with _wrapped(self.where):
            doomed = [key for key in client.scan_iter(match=pattern, count=1000)
                      if not key.endswith((b":workers", b":wmeta", b":dispatchers"))]
            for start in range(0, len(doomed), 500):
                client.delete(*doomed[start:start + 500])
            client.delete(queues_key(self.namespace))

    def advice(self) -> list[str]:
        """See :func:`~celery_fair.store.safety.unsafe_settings`."""
        from .safety import unsafe_settings

        return unsafe_settings(self.client)


def _beats(entries: Mapping[Any, Any]) -> Iterator[tuple[DispatcherBeat, int]]:
    """The ``dispatchers`` hash as ``(beat, expires_ms)``."""
    for value in entries.values():
        doc = json.loads(value)
        yield DispatcherBeat.from_json(doc), int(doc["expires_ms"])
