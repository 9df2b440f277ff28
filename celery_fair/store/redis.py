"""The Redis store: each operation is one Lua script (``lua/<operation>.lua``).

Its plain reads and worker registry are in redis_reads.py, the client plumbing (timeouts,
retries, errors) in connection.py."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import redis
from redis.commands.core import Script

from ..limits import runtime_of
from .base import (
    CANCELLED_SECONDS,
    CHECK_BATCH,
    KEEP,
    PRUNE_GRACE_MS,
    QUARANTINE_MAX,
    RESET,
    TOMBSTONE_SECONDS,
    BeginAnswer,
    BeginResult,
    DirectPush,
    Picked,
    Policy,
    Pushed,
    Store,
)
from .checking import Checker
from .connection import (
    Bounds,
    Taken,
    _explained,
    _text,
    _wrapped,
    check_replicas,
    check_replicated,
    client_options,
    describe,
    now_ms,
    wait_ms,
)
from .connection import now_ms as _wall_ms
from .keys import QueueKeys, queues_key
from .lane import Lane, LaneScript, round_trip
from .models import RESEND_SECONDS
from .redis_bulk import RedisBulk
from .redis_controls import RedisAudit, RedisBoosting, RedisPausing, RedisThrottling
from .redis_policy import RedisPolicy
from .redis_pushing import RedisPushing
from .redis_reads import RedisReads
from .redis_registry import RedisRegistry
from .redis_routing import RedisRouting
from .scripts import OPERATIONS, source

# Kept importable from here, where they were defined before connection.py and
# redis_reads.py took them.
__all__ = ["CANCELLED_SECONDS", "CHECK_BATCH", "KEEP", "PRUNE_GRACE_MS", "QUARANTINE_MAX",
           "RESET", "TOMBSTONE_SECONDS", "Bounds", "RedisStore", "as_policy",
           "describe", "now_ms"]

logger = logging.getLogger(__name__)

class RedisStore(RedisReads, RedisBulk, RedisPolicy, RedisAudit, RedisPausing, RedisBoosting,
                 RedisThrottling, RedisRegistry, RedisRouting, RedisPushing, Store):
    """Fair queues of one namespace in one Redis database."""

    #: the hot path's round trips (lane.py); a ClusterStore (whose scripts go to the
    #: slot's primary) has none
    _lane: Lane | None = None

    @property
    def resend_seconds(self) -> int:
        """How long hold.lua and hold_many.lua remember a task id's message (k_sent):
        RESEND_SECONDS when writes wait for replicas, else 0 (see RESEND_SECONDS)."""
        return RESEND_SECONDS if self.replicas else 0

    @property
    def remembers_sent(self) -> bool:  # type: ignore[override]
        return self.resend_seconds > 0

    def __init__(self, client: redis.Redis, namespace: str = "fair", *,
                 where: str | None = None, replicas: int = 0,
                 replicas_timeout: float = 1.0) -> None:
        self.client = client
        self.namespace = namespace
        self.where = where or describe(client)
        #: fair_store_replicas: hold, pick, release and cancel WAIT for these (_pipelined)
        check_replicas(replicas, replicas_timeout)
        self.replicas, self.replicas_timeout = replicas, replicas_timeout
        lane = self._lane = Lane(client)
        self._scripts: dict[str, Script] = {
            name: LaneScript(lane, source(name)) for name in OPERATIONS}

    @classmethod
    def from_url(cls, url: str, namespace: str = "fair", bounds: Bounds | None = None,
                 replicas: int = 0, replicas_timeout: float = 1.0,
                 **options: Any) -> RedisStore:
        """A store on ``url``; every command bounded in time by ``bounds`` (defaults:
        the ``fair_store_*`` settings' defaults) unless ``options`` say otherwise."""
        return cls(redis.Redis.from_url(url, **client_options(bounds, options)), namespace,
                   replicas=replicas, replicas_timeout=replicas_timeout)

    def _run(self, name: str, queue: str, *args: Any) -> Any:
        with _explained(name, queue), _wrapped(self.where):
            return self._scripts[name](keys=[self.keys(queue).prefix], args=args)

    # -- the atomic operations ---------------------------------------------------------

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
        ids are ``<token><call>.<n>`` (``<call>`` counted in the store, so never reused).
        With fair_store_replicas, the pick waits for them like a release (``WAIT``):
        ReplicationTimeout when they fall short, and the caller publishes nothing, as
        for a pick a failover may undo (its messages held again after their pick lease,
        not run twice)."""
        args = _pick_args(limit, capacity, now_ms, lease_ms, push, queued_deadline_ms, token)
        return self._picked(queue, self._durably("pick", queue, *args), push)

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
        steps, not one), waiting for fair_store_replicas as ``pick_and_push`` does."""
        prefix = self.keys(queue).prefix
        calls = [("promote", [now_ms, 1000]),
                 ("reclaim", [now_ms, 1000, TOMBSTONE_SECONDS]),
                 ("pick", _pick_args(limit, capacity, now_ms, lease_ms, push,
                                     queued_deadline_ms, None))]
        if not reclaim:
            del calls[1]
        answers = self._pipelined(prefix, calls, replicate=True)
        if not reclaim:
            answers.insert(1, (0, 0))
        (moved, nxt, bad), (requeued, lost), flat = answers
        if bad:
            self._quarantined(queue, bad)
        return ((int(moved), None if int(nxt) < 0 else int(nxt)),
                (int(requeued), int(lost)), self._picked(queue, flat, push))

    def _pipelined(self, prefix: str, calls: list[tuple[str, list[Any]]],
                   register: str | None = None, replicate: bool = False,
                   taken: Taken | None = None) -> list[Any]:
        """Run scripts in one round trip. EVALSHA directly: a redis-py pipeline of Script
        objects would first ask SCRIPT EXISTS, a round trip of its own, every time. After
        a script cache flush (NOSCRIPT) they are loaded again and the calls retried; the
        scripts that had run already are run again, which is harmless for the callers
        (a pick run twice gives out new dispatch ids: see pick.lua). With ``register``,
        that queue is added to the set of fair queues after the scripts, in the same round
        trip: after, so that a dispatcher's prune of an idle queue (forget.lua, which
        drops it only while nothing is held) cannot fall between the two and drop it.
        With ``replicate`` and fair_store_replicas N, a ``WAIT N`` ends the round trip
        (:func:`~.connection.check_replicated`). ``taken``: the connection a hold took
        before (``holding``), its first try's."""
        with _wrapped(self.where):
            return self._pipelined_on(self.client, prefix, calls, register, replicate,
                                      taken)

    def _pipelined_on(self, client: Any, prefix: str, calls: list[tuple[str, list[Any]]],
                      register: str | None, replicate: bool,
                      taken: Taken | None = None) -> list[Any]:
        """:meth:`_pipelined` on ``client`` (a cluster's: the primary of the slot)."""
        wait = self.replicas if replicate else 0
        for attempt in (1, 2):
            commands: list[tuple[Any, ...]] = [
                ("EVALSHA", self._scripts[name].sha, 1, prefix, *args) for name, args in calls]
            if register is not None:
                commands.append(("SADD", queues_key(self.namespace), register))
            if wait:
                commands.append(("WAIT", wait, wait_ms(self.replicas_timeout)))
            answers = round_trip(client, self._lane, commands,
                                 None if taken is None else taken.take())
            taken = None  # its first try's only
            try:
                for answer in answers:
                    if isinstance(answer, redis.ResponseError):
                        raise answer
                if wait:
                    check_replicated(int(answers.pop()), wait, self.replicas_timeout,
                                     self.where, "/".join(name for name, _ in calls))
                return answers[:-1] if register is not None else answers
            except redis.exceptions.NoScriptError:
                if attempt == 2:
                    raise
                for name, _ in calls:
                    script = self._scripts[name]
                    script.sha = _text(client.script_load(script.script))
        raise AssertionError("unreachable")

    def confirm(self, queue: str, dispatch_ids: Iterable[str], deadline_ms: int) -> list[str]:
        ids = list(dispatch_ids)
        if not ids:
            return []
        return [_text(d) for d in self._run("confirm", queue, deadline_ms, *ids)]

    def begin_run(self, queue: str, dispatch_id: str, deadline_ms: int, *, now_ms: int,
                  run: str, acks_late: bool, host: str = "") -> BeginAnswer:
        return _begun(self._run("begin", queue, dispatch_id, deadline_ms, now_ms, run,
                                int(acks_late), host, ""))

    def take_over(self, queue: str, dispatch_id: str, deadline_ms: int, *, now_ms: int,
                  run: str, acks_late: bool, host: str, token: str) -> BeginAnswer:
        return _begun(self._run("begin", queue, dispatch_id, deadline_ms, now_ms, run,
                                int(acks_late), host, token))

    def renew(self, queue: str, dispatch_ids: Iterable[str], deadline_ms: int) -> int:
        ids = list(dispatch_ids)
        return int(self._run("renew", queue, deadline_ms, *ids)) if ids else 0

    def release(self, queue: str, dispatch_id: str, done_seconds: int = 0,
                run: str | None = None, runtime: float | None = None,
                now_ms: int | None = None) -> bool:
        reported = runtime_of(runtime)
        return bool(self._durably("release", queue, dispatch_id, done_seconds, run or "",
                                  "" if reported is None else repr(reported),
                                  "" if now_ms is None else now_ms))

    def _durably(self, name: str, queue: str, *args: Any) -> Any:
        """Run a script; with fair_store_replicas, WAIT for them in the same round trip."""
        if not self.replicas:
            return self._run(name, queue, *args)
        with _explained(name, queue):
            return self._pipelined(self.keys(queue).prefix, [(name, list(args))],
                                   replicate=True)[0]

    def reclaim(self, queue: str, now_ms: int, limit: int) -> tuple[int, int]:
        requeued, lost = self._run("reclaim", queue, now_ms, limit, TOMBSTONE_SECONDS)
        return int(requeued), int(lost)

    def promote(self, queue: str, now_ms: int, limit: int) -> tuple[int, int | None]:
        moved, nxt, bad = self._run("promote", queue, now_ms, limit)
        if bad:
            self._quarantined(queue, bad)
        return int(moved), (None if int(nxt) < 0 else int(nxt))

    def cancel(self, queue: str, task_ids: Iterable[str], *, token: str | None = None,
               now_ms: int | None = None) -> list[tuple[str, bytes]]:
        """See :meth:`Store.cancel`. The copies under suffixed ids come from their task
        id's index in the store (O(copies), no scan). ``token`` names the call (made
        unique when None): the same call reaching Redis again within
        :data:`CANCELLED_SECONDS` (redis-py resending it after its reply was lost) gets
        the first one's answer, so what it removed is never lost with that reply."""
        ids = list(dict.fromkeys(task_ids))
        if not ids:
            return []
        flat = self._durably("cancel", queue, CANCELLED_SECONDS, token or uuid.uuid4().hex,
                             _wall_ms() if now_ms is None else now_ms, *ids)
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
        checker = Checker(self, queue, [1 if repair else 0, now_ms, lease_ms], batch, reads)
        checker.run()
        if repair:
            self.trim_quarantine(queue)  # the repair may have quarantined messages
        return checker.findings

    # -- the quarantine (reads: redis_reads.py) ----------------------------------

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


def _begun(reply: Any) -> BeginAnswer:
    """``begin.lua``'s reply: a BeginResult number, or the token of the run holding it."""
    if isinstance(reply, bytes):
        return BeginAnswer(None, reply.decode())
    return BeginAnswer(BeginResult(int(reply)))


def _log_quarantined(keys: QueueKeys, hold_ids: list[Any]) -> None:
    logger.error("queue %s: held message(s) %s could not be decoded (not written by "
                 "celery_fair, or damaged) and were moved to %s; other messages are not "
                 "affected", keys.queue, ", ".join(_text(h) for h in hold_ids), keys.quarantine)


def _pick_args(limit: int, capacity: int | None, now_ms: int, lease_ms: int,
               push: DirectPush | None, queued_deadline_ms: int,
               token: str | None) -> list[Any]:
    token = token or uuid.uuid4().hex[:12] + "."
    args: list[Any] = [now_ms, limit, -1 if capacity is None else capacity, lease_ms, token]
    if push is not None:
        args += [push.queue, push.sep, ",".join(map(str, push.priority_steps)),
                 queued_deadline_ms, push.exchange, push.routing_key, push.binding_key]
        if push.refill_ms:
            args += ["", "", push.refill_ms]  # no affinity with the direct push
    return args


def _picked(flat: list[Any], push: DirectPush | None
            ) -> tuple[list[Pushed], list[Picked], list[Any]]:
    """Unpack pick.lua's answer: pushed, picked and quarantined (an entry without a
    dispatch id)."""
    pushed: list[Pushed] = []
    if push is not None:
        count = int(flat.pop(0))
        for i in range(0, 5 * count, 5):
            due = _text(flat[i + 1])
            pushed.append(Pushed(_text(flat[i]), float(due) if due else None,
                                 _text(flat[i + 2]), _text(flat[i + 3]), _text(flat[i + 4])))
        del flat[:5 * count]
    picked, quarantined = [], []
    for i in range(0, len(flat), 3):
        if flat[i]:
            picked.append(Picked(_text(flat[i]), _text(flat[i + 1]), flat[i + 2]))
        else:
            quarantined.append(flat[i + 1])
    return pushed, picked, quarantined


def as_policy(caps: Mapping[str, int], weights: Mapping[str, float], default_cap: int | None,
              reserve: int) -> Policy:
    return Policy(default_cap, reserve, 1.0, caps, weights)
