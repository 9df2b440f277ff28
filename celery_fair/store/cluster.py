"""The Redis store on a Redis Cluster (``redis+cluster://host:port[,host:port...]/``), with
redis-py's ``RedisCluster`` client.

Every key of a fair queue carries the hash tag ``{<queue>}`` (keys.py), so each script
runs on the primary of one slot, and different fair queues spread over the primaries.
What differs from one Redis (DESIGN.md, "Redis Cluster"):

- The namespace's own keys (``<ns>:queues``, ``<ns>:dispatchers``, ``<ns>:audit``) are in
  slots of their own: plain commands, never in a script or round trip with a queue's keys.
  A hold adds its queue to ``<ns>:queues`` after its script, in a second round trip (a
  cluster pipeline sends to several nodes at once, in no order; retried, never making a
  certain hold unknown); ``forget_queue`` drops the queue first and puts it back when the
  queue turns out not to be empty, or the ask failed. Either way a queue that holds
  anything is in the set once both ends are done; a process killed in between is what
  :meth:`ClusterStore.unregistered_queues` (``fair check``) finds.
- Scripts never follow an ASK: each runs on the node that owns its slot (a script
  declares only the prefix, which is never stored, so while its slot migrates the owner
  answers ASK to every script, and the importing node has only part of the keys). A
  queue whose slot is migrating raises :class:`SlotMigrating` until the migration ends.
- The scripts of one round trip (``_pipelined``) go to the primary of the queue's slot on
  that node's own connection, a ``WAIT`` for fair_store_replicas with them (a WAIT
  counts the writes of its own connection).
- :meth:`wait` blocks (BLPOP) on one queue's wake key only; with several queues it takes
  every wake key without blocking (one pipeline: a round trip per primary) every
  :data:`POLL_SECONDS` until one is woken or the timeout passes.
- No direct push: ``pick.lua`` would write kombu's keys, which are not in its slot, and
  kombu's Redis transport does not run on a cluster.
- SCANs (``fair check``, ``flush``, the pytest plugin's cleanup) run on every primary
  (redis-py's cluster ``scan_iter``).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Callable

import redis
import redis.cluster
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    RedisClusterException,
    TryAgainError,
)
from redis.retry import Retry

from ..errors import (
    ConfigurationError,
    SlotMigrating,
    StoreConnectionError,
    StoreError,
    StoreUnreachable,
)
from ..redact import safe_url
from ..urls import parse_cluster_url
from .connection import (
    _GET_CONNECTION_ARGS,
    Bounds,
    Taken,
    _glob_escape,
    _text,
    _wrapped,
    check_replicas,
    client_options,
)
from .keys import queues_key
from .redis import RedisStore
from .scripts import OPERATIONS, source
from .sentinel import RedisOptions

#: How often an idle dispatcher serving several fair queues looks at their wake keys.
POLL_SECONDS = 0.05

logger = logging.getLogger(__name__)

#: Errors after which the slot's primary is looked up again: a failover (a lost
#: connection, CLUSTERDOWN), a migration that ended (MOVED) or is under way (ASK,
#: TRYAGAIN). AskError covers MovedError.
_MOVED = (redis.ConnectionError, redis.TimeoutError, AskError, ClusterDownError,
          TryAgainError)
#: Of those, the refusals: the node ran nothing.
_REFUSED = (AskError, ClusterDownError, TryAgainError)


class ClusterScript(Script):
    """A Lua script run by EVALSHA on the node owning its first key's slot, never
    following an ASK (see the module's docstring); loaded there after a NOSCRIPT."""

    def __init__(self, store: ClusterStore, script: str) -> None:  # no client needed yet
        self.store, self.script = store, script
        self.sha = hashlib.sha1(script.encode()).hexdigest()

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        keys, args = list(keys or []), list(args or [])

        def run(node: redis.Redis) -> Any:
            try:
                return node.evalsha(self.sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                self.store._load_scripts(node)
                return node.evalsha(self.sha, len(keys), *keys, *args)

        return self.store._on_primary(keys[0], run)


class ClusterStore(RedisStore):
    """Fair queues of one namespace on a Redis Cluster."""

    supports_direct_push = False
    supports_app_scope = False  # a script reaches one slot (fair_scope 'app' refused)

    def same_redis(self, connection_kwargs: Mapping[str, Any]) -> bool:
        return False  # see the module's docstring

    def __init__(self, open_client: Callable[[], RedisCluster], namespace: str = "fair",
                 *, where: str, retries: int = 3, replicas: int = 0,
                 replicas_timeout: float = 1.0) -> None:
        # The client is made on first use: making it asks a node for the slots, and a
        # dispatcher waits for an unreachable store (ping) rather than failing to start.
        self._open: Callable[[], RedisCluster] = open_client
        self._client: RedisCluster | None = None
        self._opening = threading.Lock()  # one client, whichever thread asks first
        self.namespace, self.where, self.retries = namespace, where, retries
        check_replicas(replicas, replicas_timeout)
        self.replicas, self.replicas_timeout = replicas, replicas_timeout
        self._scripts = {name: ClusterScript(self, source(name, cluster=True))
                         for name in OPERATIONS}

    @property
    def client(self) -> Any:  # type: ignore[override]
        if self._client is None:
            with self._opening, _wrapped(self.where):
                if self._client is None:
                    self._client = self._open()
        return self._client

    @classmethod
    def from_cluster_url(cls, url: str, namespace: str, bounds: Bounds | None,
                         options: RedisOptions) -> ClusterStore:
        """A store on the cluster of the nodes of ``url``, its connections bounded by
        ``bounds`` like a plain Redis store's (the retries are the cluster client's:
        each one looks the slot's primary up again).

        Raises:
            ConfigurationError: ``url`` is not a cluster URL, or names a database but 0.
        """
        try:
            parsed = parse_cluster_url(url)
        except ValueError as exc:
            raise ConfigurationError(
                f"setting fair_store_url={safe_url(url)!r} is invalid: {exc}") from None
        if not hasattr(redis.cluster, "TransactionStrategy"):
            # the store's MULTI/EXEC round trips (one slot each) need redis-py's cluster
            # transactions, new in redis-py 6.2
            raise ConfigurationError(
                f"setting fair_store_url={safe_url(url)!r} needs redis-py 6.2 or later for "
                f"a Redis Cluster (installed: {redis.__version__}): pip install 'redis>=6.2'")
        bounds = bounds or Bounds()
        kwargs = client_options(bounds, {})
        for name in ("retry", "retry_on_timeout", "retry_on_error"):  # the cluster's own
            kwargs.pop(name)

        def open_client() -> RedisCluster:
            return RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in parsed.nodes],
                username=parsed.username, password=parsed.password,
                retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), bounds.retries),
                **kwargs)

        return cls(open_client, namespace, where=parsed.where(), retries=bounds.retries,
                   replicas=options.replicas, replicas_timeout=options.replicas_timeout)

    def _primary(self, key: str) -> redis.Redis:
        """The client of the primary serving ``key``'s slot."""
        client = self.client
        return client.get_redis_connection(client.get_node_from_key(key))  # type: ignore[no-any-return]

    def _connect(self, key: str) -> Taken | None:
        """See :meth:`RedisStore._connect`: on the primary of ``key``'s slot, looked up
        again after a failover, and put back (the round trip takes its own). Raises
        redis-py's errors, or StoreUnreachable when no client could be made: in both
        cases nothing was sent."""
        def connect(node: redis.Redis) -> None:
            pool = node.connection_pool
            pool.release(pool.get_connection(*_GET_CONNECTION_ARGS))

        try:
            self._on_primary(key, connect)
        except StoreConnectionError as exc:  # from making the client
            raise StoreUnreachable(str(exc)) from exc.__cause__
        return None

    def _pipelined(self, prefix: str, calls: list[tuple[str, list[Any]]],
                   register: str | None = None, replicate: bool = False,
                   taken: Taken | None = None) -> list[Any]:
        """See :meth:`RedisStore._pipelined`: on the slot's primary; ``register``'s SADD
        after, in a round trip of its own (the set is in another slot). No ``taken``
        here (``_connect`` puts its connection back)."""
        with _wrapped(self.where):
            answers: list[Any] = self._on_primary(prefix, lambda node: self._pipelined_on(
                node, prefix, calls, None, replicate))
        if register is not None:
            self._register(register)
        return answers

    def _register(self, queue: str) -> None:
        """A hold's SADD of its queue, after its script: idempotent, so retried like a
        script (:meth:`_on_primary`). The scripts ran: should the SADD still fail, the
        hold is not unknown; the queue is registered by its next hold, or by
        ``fair check`` (:meth:`unregistered_queues`), which an ERROR line asks for."""
        key = queues_key(self.namespace)
        try:
            with _wrapped(self.where):
                self._on_primary(key, lambda node: node.sadd(key, queue))
        except StoreConnectionError as exc:
            logger.error("celery_fair: fair queue %s holds a task but could not be added "
                         "to %s (%s); its next hold adds it, and `celery -A <app> fair "
                         "check --repair` does", queue, key, exc)
        except StoreError as exc:  # full, or a foreign key
            logger.error("celery_fair: fair queue %s holds a task but could not be added "
                         "to %s (%s); `celery -A <app> fair check --repair` adds it once "
                         "that is fixed", queue, key, exc)

    def _load_scripts(self, node: redis.Redis) -> None:
        """Load every script on ``node`` (one round trip), not only the one missing: a
        promote/reclaim/pick pipeline meeting NOSCRIPT for some of its scripts runs the
        others all the same, and runs them again once loaded (a pick's first picks then
        wait for their pick lease)."""
        pipe = node.pipeline(transaction=False)
        for script in self._scripts.values():
            pipe.script_load(script.script)
        pipe.execute()

    def _on_primary(self, key: str, run: Callable[[redis.Redis], Any]) -> Any:
        """``run`` on the primary of ``key``'s slot; after a lost connection, a MOVED or
        CLUSTERDOWN (a failover, a migration done), an ASK or TRYAGAIN (a migration under
        way: never followed), up to ``retries`` more times on the one the cluster then
        names (with backoff, as the cluster client does its own commands). When every
        try was refused and the last by ASK or TRYAGAIN: :class:`SlotMigrating`."""
        refused = True  # every try was refused unrun (ASK, MOVED, TRYAGAIN, CLUSTERDOWN)
        for attempt in range(self.retries + 1):
            try:
                return run(self._primary(key))
            except _MOVED as exc:
                refused = refused and isinstance(exc, _REFUSED)
                if attempt == self.retries:
                    if refused and isinstance(exc, (AskError, TryAgainError)) \
                            and not isinstance(exc, MovedError):
                        raise SlotMigrating(
                            f"celery_fair store unreachable ({self.where}): the slot of "
                            f"{key!r} is migrating to another node (resharding); its fair "
                            "queue waits until the migration ends") from exc
                    raise
                time.sleep(min(1.0, 0.05 * 2 ** attempt))
                try:
                    self.client.nodes_manager.initialize()
                except (redis.RedisError, RedisClusterException):
                    pass  # no node answers yet: the next try fails or finds one
        raise AssertionError("unreachable")

    def wait(self, queues: Iterable[str], timeout: float) -> set[str]:
        """See :meth:`RedisStore.wait`. One queue: BLPOP on its wake key. Several: their
        keys are in different slots (one BLPOP cannot take them), so each is taken
        without blocking every :data:`POLL_SECONDS` (one pipelined DEL per key: a round
        trip per primary), and every queue found woken is returned."""
        by_key = {self.keys(q).wake: q for q in queues}
        if len(by_key) <= 1:
            return super().wait(by_key.values(), timeout)
        deadline = time.monotonic() + timeout
        while True:
            with _wrapped(self.where):
                pipe = self.client.pipeline(transaction=False)
                for key in by_key:
                    pipe.delete(key)
                woken = {q for q, taken in zip(by_key.values(), pipe.execute()) if taken}
            left = deadline - time.monotonic()
            if woken or left <= 0:
                return woken
            time.sleep(min(POLL_SECONDS, left))

    def forget_queue(self, queue: str) -> bool:
        """See :meth:`RedisStore.forget_queue`: drop the queue from the set, then ask
        ``forget.lua`` whether it is empty, and put it back when not, or when the ask
        failed. A hold adds its queue after its script: if that script ran before the
        check, the check sees it; if after, so does its SADD, after our SREM. (A process
        killed between the SREM and the SADD: :meth:`unregistered_queues`.)"""
        key = queues_key(self.namespace)
        with _wrapped(self.where):
            if not self.client.srem(key, queue):
                return False
            try:
                if self._scripts["forget"](keys=[self.keys(queue).prefix], args=[queue]):
                    return True
            except BaseException:
                self.client.sadd(key, queue)  # it may hold work: keep it served
                raise
            self.client.sadd(key, queue)
        return False

    def unregistered_queues(self, repair: bool) -> list[str]:
        """The fair queues holding work (``forget.lua`` answers 0) but missing from the
        set, found by their ``msg`` or ``stat`` hash on any primary (SCANs over each);
        with ``repair``, added back. ``fair check`` asks (check.py)."""
        key, ns = queues_key(self.namespace), self.namespace
        with _wrapped(self.where):
            known = {_text(q) for q in self.client.smembers(key)}
            found = {_text(k)[len(ns) + 2:-len(f"}}:{kind}")] for kind in ("msg", "stat")
                     for k in self.client.scan_iter(
                         match=f"{_glob_escape(ns)}:{{*}}:{kind}", count=1000)}
            lost = sorted(q for q in found - known if not self._scripts["forget"](
                keys=[self.keys(q).prefix], args=[q]))
            if repair and lost:
                self.client.sadd(key, *lost)
        return lost

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
