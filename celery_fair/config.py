"""Settings read from ``app.conf`` (``fair_*``), validated once with clear errors.

Every setting lives in :data:`SETTINGS`; the README's settings table and the docs are
generated from it, so a setting documented is a setting validated.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from celery import Celery

from . import limits
from .assign import assign_ref
from .config_keys import check_table_prefix, reject_unknown
from .config_keys import invalid_setting as _fail
from .errors import ConfigurationError, InvalidLimit
from .names import validate_group
from .policies import PolicyChoice, read_policies
from .queues import declared_queues
from .redact import safe_url
from .rules import TaskRules, parse_rules
from .settings import _DEFAULTS, MIN_REPLICAS_TIMEOUT, SETTINGS, Setting, settings_table  # noqa: F401 (re-exported)
from .urls import (
    CLUSTER_SCHEMES,
    REDIS_SCHEMES,
    SENTINEL_SCHEMES,
    SQL_SCHEMES,
    check_redis_url,
    describe_schemes,
    parse_cluster_url,
    parse_sentinel_url,
    scheme_of,
)

ON_STORE_ERROR = ("raise", "publish")


@dataclass(frozen=True)
class FairConfig:
    """The validated ``fair_*`` settings of one Celery app."""

    store_url: str
    key_prefix: str
    default_group: str
    default_concurrency: int | None
    group_concurrency: Mapping[str, int]
    group_weights: Mapping[str, float]
    default_rate: limits.Rate | None  # fair_default_rate_limit
    group_rates: Mapping[str, limits.Rate | None]  # fair_group_rate_limits
    max_held: int | None  # fair_group_max_held: None unlimited
    max_held_overrides: Mapping[str, int | None]
    max_inflight: int | None  # None: auto
    dispatch_ahead: int | None  # None: 'auto'
    interactive_reserve: int
    lease_seconds: float
    done_ttl: int
    batch_size: int
    direct_push: bool
    tasks: TaskRules = field(default_factory=TaskRules)  # fair_tasks, for install()
    quick_start: bool = False  # fair_quick_start: lifecycle.starts_quickly
    group_resolver: Any = None  # fair_group_resolver: for contrib.django / contrib.flask
    metrics_port: int | None = None
    metrics_address: str = "0.0.0.0"
    metrics_groups: int = 10
    on_store_error: str = "raise"  # or "publish": straight to the broker, unfairly
    store_socket_timeout: float = 5.0
    store_connect_timeout: float = 5.0
    store_retries: int = 3
    spool_dir: str | None = None  # None: spool.default_root()
    store_table_prefix: str = "fair_"  # the SQL store's tables: <prefix>queues, ...
    report_interval: float = 10.0  # seconds; 0: no periodic report (reporting.py)
    log_utc: bool = True  # log timestamps in UTC (logtime.py)
    store_master_name: str | None = None  # fair_store_transport_options: Sentinel only
    store_sentinel_kwargs: Mapping[str, Any] = field(default_factory=dict, repr=False)
    store_replicas: int = 0  # fair_store_replicas: WAIT for these on hold/release/cancel
    store_replicas_timeout: float = 1.0
    policy: PolicyChoice = PolicyChoice()  # fair_policy and its companions
    queue_policies: Mapping[str, PolicyChoice] = field(default_factory=dict)
    assign: Any = None  # fair_assign: a function, or its path (assign.load_assign)

    def policy_for(self, queue: str) -> PolicyChoice:
        """The policy ``queue`` runs (``fair_queue_policies``, else the app-wide one)."""
        return self.queue_policies.get(queue, self.policy)

    def max_held_of(self, group: str) -> int | None:
        """The most tasks ``group`` may hold (None: unlimited)."""
        return self.max_held_overrides.get(group, self.max_held)

    @classmethod
    def from_app(cls, app: Celery) -> FairConfig:
        """Read and validate the app's settings; raise ConfigurationError on the first bad one."""
        conf = app.conf
        reject_unknown(conf, getattr(app, "namespace", None), _DEFAULTS)
        get: Callable[[str], Any] = lambda name: conf.get(name, _DEFAULTS[name])  # noqa: E731
        store_url = _store_url(get("fair_store_url"), conf.get("broker_url"))
        master_name, sentinel_kwargs = _transport_options(
            store_url, conf.get("fair_store_transport_options"),
            conf.get("broker_transport_options") if get("fair_store_url") is None else None)
        policy, queue_policies = read_policies(get, lambda: declared_queues(app))
        return cls(
            store_url=store_url, policy=policy, queue_policies=queue_policies,
            store_master_name=master_name, store_sentinel_kwargs=sentinel_kwargs,
            store_replicas=_replicas(store_url, get("fair_store_replicas")),
            store_replicas_timeout=_replicas_timeout(
                get("fair_store_replicas_timeout"), get("fair_store_socket_timeout"),
                get("fair_store_replicas")),
            key_prefix=_nonempty_str("fair_key_prefix", get("fair_key_prefix")),
            default_group=_default_group(get("fair_default_group")),
            default_concurrency=_optional_cap("fair_default_concurrency",
                                              get("fair_default_concurrency")),
            group_concurrency=_group_map("fair_group_concurrency",
                                         get("fair_group_concurrency"), _cap),
            group_weights=_group_map("fair_group_weights", get("fair_group_weights"), _weight),
            default_rate=_rate("fair_default_rate_limit", get("fair_default_rate_limit")),
            group_rates=_group_map("fair_group_rate_limits", get("fair_group_rate_limits"),
                                   _rate),
            max_held=_max_held("fair_group_max_held", get("fair_group_max_held")),
            max_held_overrides=_group_map("fair_group_max_held_overrides",
                                          get("fair_group_max_held_overrides"), _max_held),
            max_inflight=_auto_or_count("fair_max_inflight", get("fair_max_inflight"), 1),
            # capacity.dispatch_ahead: what "auto" is per queue
            dispatch_ahead=_auto_or_count("fair_dispatch_ahead", get("fair_dispatch_ahead"), 0),
            interactive_reserve=_cap("fair_interactive_reserve",
                                     get("fair_interactive_reserve"), minimum=0),
            lease_seconds=_positive("fair_lease_seconds", get("fair_lease_seconds")),
            done_ttl=_count("fair_done_ttl", get("fair_done_ttl"), minimum=0),
            batch_size=_count("fair_batch_size", get("fair_batch_size")),
            direct_push=_flag("fair_direct_push", get("fair_direct_push")),
            quick_start=_flag("fair_quick_start", get("fair_quick_start")),
            tasks=parse_rules(get("fair_tasks")),
            group_resolver=_resolver_ref("fair_group_resolver", get("fair_group_resolver")),
            metrics_port=_port("fair_metrics_port", get("fair_metrics_port")),
            metrics_address=_nonempty_str("fair_metrics_address", get("fair_metrics_address")),
            metrics_groups=_count("fair_metrics_groups", get("fair_metrics_groups"), minimum=0),
            on_store_error=_choice("fair_on_store_error", get("fair_on_store_error"),
                                   ON_STORE_ERROR),
            store_socket_timeout=_positive("fair_store_socket_timeout",
                                           get("fair_store_socket_timeout")),
            store_connect_timeout=_positive("fair_store_connect_timeout",
                                            get("fair_store_connect_timeout")),
            store_retries=_count("fair_store_retries", get("fair_store_retries"), minimum=0),
            spool_dir=_optional_path("fair_spool_dir", get("fair_spool_dir")),
            store_table_prefix=check_table_prefix(get("fair_store_table_prefix")),
            report_interval=_positive("fair_report_interval", get("fair_report_interval"),
                                      zero="no report"),
            log_utc=_flag("fair_log_utc", get("fair_log_utc")),
            assign=assign_ref(get("fair_assign")),
        )


_cache: weakref.WeakKeyDictionary[Celery, FairConfig] = weakref.WeakKeyDictionary()


def get_config(app: Celery) -> FairConfig:
    """The app's validated settings, read once per app."""
    config = _cache.get(app)
    if config is None:
        config = _cache[app] = FairConfig.from_app(app)
    return config


def reset_config(app: Celery) -> None:
    """Forget the cached settings (after changing ``app.conf`` in tests)."""
    _cache.pop(app, None)


def _store_url(url: Any, broker_url: Any) -> str:
    """``fair_store_url`` (or the broker's URL when that is Redis or Sentinel), checked."""
    if url is None:
        broker = broker_url if isinstance(broker_url, str) else ""
        url = (broker.split(";")[0] if broker.startswith(("redis://", "rediss://", "unix://"))
               else broker if scheme_of(broker) == "sentinel" else None)  # kombu's: all
        if url is None:
            raise ConfigurationError(
                "setting fair_store_url is required: the broker is not Redis "
                f"({safe_url(broker) or 'unset'!s}), so celery_fair needs a store to hold "
                f"tasks in ({describe_schemes()})")
    schemes = REDIS_SCHEMES + SENTINEL_SCHEMES + CLUSTER_SCHEMES + SQL_SCHEMES
    if not isinstance(url, str) or scheme_of(url) not in schemes:
        raise _fail("fair_store_url", safe_url(url) if isinstance(url, str) else url,
                    f"a URL of a store celery_fair supports ({describe_schemes()})")
    for kinds, parse, example in _PARSED_URLS:
        if scheme_of(url) in kinds:
            try:
                parse(url)
            except ValueError as exc:
                raise _fail("fair_store_url", safe_url(url), f"{example} ({exc})") from None
    return url


#: The store URLs read beyond their scheme: (schemes, parser, what is expected).
_PARSED_URLS: tuple[tuple[tuple[str, ...], Callable[[str], object], str], ...] = (
    (REDIS_SCHEMES, check_redis_url, "a Redis URL such as redis://host:6379/0"),
    (SENTINEL_SCHEMES, parse_sentinel_url,
     "a Sentinel URL such as redis+sentinel://host:26379,host:26380/0"),
    (CLUSTER_SCHEMES, parse_cluster_url,
     "a Redis Cluster URL such as redis+cluster://host:7000,host:7001/"))


_TRANSPORT_KEYS = ("master_name", "sentinel_kwargs")


def _transport_options(url: str, value: Any, broker_options: Any
                       ) -> tuple[str | None, dict[str, Any]]:
    """``fair_store_transport_options``: the Sentinel master's name and the sentinels'
    connection options; when the store is the broker (fair_store_url unset), the broker's
    own transport options are the default."""
    name = "fair_store_transport_options"
    sentinel = scheme_of(url) in SENTINEL_SCHEMES
    if value is None and sentinel and isinstance(broker_options, Mapping):
        value = {k: broker_options[k] for k in _TRANSPORT_KEYS if k in broker_options}
    value = {} if value is None else value
    if not isinstance(value, Mapping) or set(value) - set(_TRANSPORT_KEYS):
        shown = f"a dict of keys {sorted(map(str, value))}" if isinstance(value, Mapping) \
            else type(value).__name__  # never its values: sentinel_kwargs has a password
        raise ConfigurationError(
            f"setting {name} is invalid ({shown}): expected a dict with 'master_name' and "
            "optionally 'sentinel_kwargs' (a Sentinel store's options)")
    if value and not sentinel:
        raise ConfigurationError(
            f"setting {name} is for a Sentinel store, but fair_store_url="
            f"{safe_url(url)!r} is not one (redis+sentinel:// or sentinel://)")
    master = value.get("master_name")
    if sentinel and (not isinstance(master, str) or not master):
        raise ConfigurationError(
            f"setting {name} must name the Sentinel master of fair_store_url="
            f"{safe_url(url)!r}: {name} = {{'master_name': 'mymaster'}} (the name in the "
            "sentinels' `sentinel monitor <name> ...`)")
    kwargs = value.get("sentinel_kwargs") or {}
    if not isinstance(kwargs, Mapping) or not all(
            isinstance(k, str) and isinstance(v, (str, int, float, bool, type(None)))
            for k, v in kwargs.items()):
        raise ConfigurationError(
            f"setting {name}['sentinel_kwargs'] is invalid: expected a dict of redis-py "
            "connection options (str, number, bool or None values), like {'password': ...}")
    return master, dict(kwargs)


def _replicas(url: str, value: Any) -> int:
    replicas = _count("fair_store_replicas", value, minimum=0)
    if replicas and scheme_of(url) in SQL_SCHEMES:
        raise ConfigurationError(
            "setting fair_store_replicas applies to a Redis store only: a SQL database's "
            "own synchronous replication (PostgreSQL's synchronous_commit and "
            "synchronous_standby_names) makes its commits wait for standbys")
    return replicas


def _replicas_timeout(value: Any, socket_timeout: Any, replicas: Any) -> float:
    """The WAIT timeout; below the socket timeout only matters when writes wait
    (``fair_store_replicas`` > 0): a short socket timeout alone is no error."""
    seconds = _positive("fair_store_replicas_timeout", value)
    if seconds < MIN_REPLICAS_TIMEOUT:
        raise _fail("fair_store_replicas_timeout", value,
                    f"at least {MIN_REPLICAS_TIMEOUT:g} seconds (WAIT counts whole "
                    "milliseconds; 0 would wait for ever)")
    if replicas and isinstance(socket_timeout, (int, float)) and seconds >= socket_timeout:
        raise _fail("fair_store_replicas_timeout", value,
                    f"fewer seconds than fair_store_socket_timeout ({socket_timeout}): "
                    "a write waiting for its replicas must not outlast its socket")
    return seconds


def _nonempty_str(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(name, value, "a non-empty string")
    return value


def _default_group(value: Any) -> str:
    try:
        return validate_group(value)
    except ValueError as exc:
        raise ConfigurationError(f"setting fair_default_group is invalid: {exc}") from None


def _count(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(name, value, f"an integer >= {minimum}")
    return value


def _cap(name: str, value: Any, minimum: int = 1) -> int:
    try:
        return limits.cap(value, "a cap", minimum)
    except InvalidLimit as exc:
        raise _fail(name, value, str(exc).removeprefix("a cap must be ")) from None


def _optional_cap(name: str, value: Any) -> int | None:
    return None if value is None else _cap(name, value)


def _max_held(name: str, value: Any) -> int | None:
    try:
        return limits.max_held(value, "a limit")
    except InvalidLimit as exc:
        raise _fail(name, value, str(exc).removeprefix("a limit must be ")) from None


def _rate(name: str, value: Any) -> limits.Rate | None:
    """None, a rate ('10/s') or {'rate': '10/s', 'burst': n}."""
    if value is None:
        return None
    rate, burst = value, 1
    if isinstance(value, Mapping):
        if set(value) - {"rate", "burst"} or "rate" not in value:
            raise _fail(name, value, "a rate such as '10/s', or {'rate': '10/s', 'burst': n}")
        rate, burst = value["rate"], value.get("burst", 1)
    try:
        return limits.rate(rate, "a rate", burst)
    except InvalidLimit as exc:
        raise _fail(name, value, str(exc).removeprefix("a rate must be ")) from None


def _optional_path(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.path.isabs(value):
        raise _fail(name, value, "None or an absolute directory path")
    return os.fspath(value)


def _port(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise _fail(name, value, "None or a port number from 0 to 65535 (0: any free port)")
    return value


def _positive(name: str, value: Any, zero: str = "") -> float:
    """Seconds above 0; with ``zero`` (what 0 means), 0 as well."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise _fail(name, value, "a positive number of seconds"
                                 + (f", or 0 ({zero})" if zero else ""))
    return float(value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(name, value, "True or False")
    return value


def _weight(name: str, value: Any) -> float:
    try:
        return limits.weight(value, "a weight")
    except InvalidLimit as exc:
        raise _fail(name, value, str(exc).removeprefix("a weight must be ")) from None


def _group_map(name: str, value: Any, check: Callable[[str, Any], Any]) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(name, value, "a dict of {group: value}")
    out = {}
    for group, item in value.items():
        try:
            key = validate_group(group)
        except ValueError as exc:
            raise ConfigurationError(f"setting {name} has an invalid group: {exc}") from None
        out[key] = check(f"{name}[{group!r}]", item)
    return out


def _auto_or_count(name: str, value: Any, minimum: int) -> int | None:
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(name, value, f"'auto' or an integer >= {minimum}")
    return value


def _resolver_ref(name: str, value: Any) -> Any:
    """A callable, a dotted path to one (imported by the web integration, where the
    app's modules can be imported), or None."""
    if value is None or callable(value):
        return value
    if isinstance(value, str) and value.replace(":", ".").count(".") >= 1 \
            and all(part.isidentifier() for part in value.replace(":", ".").split(".")):
        return value
    raise _fail(name, value, "a callable request -> group, or its dotted path "
                             "('package.module.function')")


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _fail(name, value, "one of " + ", ".join(repr(c) for c in choices))
    return str(value)
