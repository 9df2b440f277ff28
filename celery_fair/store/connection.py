"""The Redis client side of the store: timeouts and retries, and store errors for
redis-py's. Shared by the store's scripts (redis.py), its reads (redis_reads.py) and the
check (checking.py)."""

from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import AskError, ClusterDownError, RedisClusterException, TryAgainError
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError

from ..errors import (
    ConfigurationError,
    CorruptMessage,
    GroupFull,
    InvalidLimit,
    ReplicationTimeout,
    SingletonDropped,
    StoreConnectionError,
    StoreError,
    StoreFull,
)
from ..settings import MIN_REPLICAS_TIMEOUT
from .base import now_ms as base_now_ms


@contextmanager
def _explained(operation: str, queue: str) -> Iterator[None]:
    try:
        yield
    except (StoreConnectionError, StoreFull, CorruptMessage, ReplicationTimeout):
        raise
    except GroupFull as full:
        raise full.in_queue(queue) from None
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
        # retry_on_error: redis-py before 6 retries only the errors listed there (a lost
        # connection included), whatever the Retry's own list says.
        retried = [redis.ConnectionError, redis.TimeoutError] if self.retries > 0 else []
        return {"socket_timeout": self.socket_timeout,
                "socket_connect_timeout": self.connect_timeout,
                "retry": OuterRetry(ExponentialBackoff(cap=1.0, base=0.05), self.retries),
                "retry_on_timeout": self.retries > 0,
                "retry_on_error": retried}

    def longest_wait(self) -> float:
        """Upper bound of one failing command's time (seconds): every try waiting out
        the connect and the socket timeout, plus backoff between tries (at most 1 s)."""
        tries = self.retries + 1
        return tries * (self.connect_timeout + self.socket_timeout) + self.retries * 1.0


def client_options(bounds: Bounds | None, options: dict[str, Any]) -> dict[str, Any]:
    """redis-py client options: ``options``, then what ``bounds`` and keep-alives say."""
    options.setdefault("health_check_interval", 30)
    options.setdefault("socket_keepalive", True)
    for name, value in (bounds or Bounds()).client_options().items():
        options.setdefault(name, value)
    return options


def check_replicas(replicas: Any, timeout: Any) -> None:
    """The replicas a write waits for and how long, checked before any is made.

    Raises:
        ConfigurationError: naming the value and what is expected.
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ConfigurationError(f"replicas={replicas!r}: expected a whole number of "
                                 "replicas to wait for, 0 or more")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not MIN_REPLICAS_TIMEOUT <= timeout < float("inf"):
        raise ConfigurationError(f"replicas_timeout={timeout!r}: expected seconds, at least "
                                 f"{MIN_REPLICAS_TIMEOUT:g} (WAIT counts whole milliseconds; "
                                 "0 would wait for ever)")


def wait_ms(timeout: float) -> int:
    """WAIT's timeout for ``timeout`` seconds: whole milliseconds, never 0 (for ever)."""
    return max(1, math.ceil(timeout * 1000))


def check_replicated(acknowledged: int, wanted: int, timeout: float, where: str,
                     operation: str) -> None:
    """Raise ReplicationTimeout unless ``acknowledged`` (WAIT's answer) reaches ``wanted``
    (fair_store_replicas). WAIT counts the replicas that have every write of its
    connection so far, the scripts of its round trip included."""
    if acknowledged < wanted:
        raise ReplicationTimeout(
            f"celery_fair store ({where}): {operation} acknowledged by {acknowledged} of "
            f"{wanted} replicas within {timeout:g} s (fair_store_replicas, "
            "fair_store_replicas_timeout): the master has it, a failover may lose it",
            acknowledged=acknowledged, wanted=wanted)


@contextmanager
def _wrapped(where: str = "",
             unreachable: type[StoreConnectionError] = StoreConnectionError) -> Iterator[None]:
    at = f" ({where})" if where else ""
    try:
        yield
    except MasterNotFoundError:  # its message is every sentinel client's repr
        raise unreachable(f"celery_fair store unreachable{at}: no sentinel named a master "
                          "(the sentinels are down or unreachable, or none monitors a "
                          "master of that name)") from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise unreachable(f"celery_fair store unreachable{at}: {exc}") from exc
    except (RedisClusterException, ClusterDownError, TryAgainError, AskError) as exc:
        # A cluster without a node to ask, a slot no primary serves (a failover under
        # way), a slot being migrated (ASK, TRYAGAIN) or just moved (MOVED, an AskError):
        # an outage, retried like a lost connection. The node ran nothing.
        raise unreachable(f"celery_fair store unreachable{at}: {exc}") from exc
    except redis.exceptions.OutOfMemoryError as exc:
        # Redis refuses a script's first write when full, and only its first (a script
        # is atomic): nothing was written.
        raise StoreFull(f"celery_fair store full{at}: {exc}") from exc
    except redis.ResponseError as exc:
        # A pipeline puts the command (with a value's head) before the script's own error:
        # keep only the error.
        reply = str(exc).rpartition("of pipeline caused error: ")[2]
        if reply.startswith("FULL "):  # hold.lua: the group is full, nothing written
            _, count, limit, group = reply.split(" ", 3)
            raise GroupFull(group=group, count=int(count), limit=int(limit)) from None
        if reply.startswith("DROPPED "):  # hold.lua: singleton_mode 'drop', no write
            _, task_id, key = reply.split(" ", 2)
            raise SingletonDropped(task_id, key) from None
        if reply.startswith("LIMIT "):  # limit.lua refused a limit: nothing written
            raise InvalidLimit(reply[6:]) from None
        if reply.startswith("CORRUPT "):  # a script refused a value (hold.lua): no write
            raise CorruptMessage(f"celery_fair store refused{at}: {reply[8:]}") from exc
        raise StoreError(f"celery_fair store failed{at}: {exc}") from exc
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


class Taken:
    """A connection taken before a hold's round trip (so that failing to connect, the
    only certain "not sent", is told apart from a reply lost), then handed to the round
    trip that sends on it, or given back (``give``: to the lane it came from)."""

    def __init__(self, give: Callable[[Any], None], connection: Any) -> None:
        self.give, self.connection = give, connection

    def take(self) -> Any:
        connection, self.connection = self.connection, None
        return connection

    def put_back(self) -> None:
        if self.connection is not None:
            self.give(self.take())


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a SCAN MATCH pattern."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _seconds(value: Any) -> float | None:
    text = _text(value)
    return float(text) if text else None


def _stamp(value: Any) -> float | None:
    """A time in ms stored by a script, in epoch seconds; None when absent or damaged (a
    reader falls back to something else, and ``check`` has nothing to repair)."""
    try:
        ms = float(_text(value))
    except ValueError:
        return None
    return ms / 1000 if math.isfinite(ms) else None


now_ms = base_now_ms  # kept importable from here
