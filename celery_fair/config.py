"""Settings read from ``app.conf`` (``fair_*``), validated once with clear errors.

Every setting lives in :data:`SETTINGS`; the README's settings table and the docs are
generated from it, so a setting documented is a setting validated.
"""

from __future__ import annotations

import difflib
import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from celery import Celery

from .errors import ConfigurationError
from .rules import TaskRules, parse_rules


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    doc: str


SETTINGS: tuple[Setting, ...] = (
    Setting("fair_store_url", None,
            "Redis URL of the holding store. Default: the broker URL when it is Redis."),
    Setting("fair_key_prefix", "fair", "Prefix of every Redis key celery_fair writes."),
    Setting("fair_default_group", "default",
            "Group of a fair task whose group cannot be resolved otherwise."),
    Setting("fair_default_concurrency", None,
            "Most tasks of one group in flight at once (None: no cap)."),
    Setting("fair_group_concurrency", {}, "Per-group caps overriding the default: {group: n}."),
    Setting("fair_group_weights", {},
            "Per-group weights (default 1): a weight-2 group gets twice the share."),
    Setting("fair_max_inflight", "auto",
            "Tasks in flight per fair queue: 'auto' (sum of live workers' pool sizes "
            "consuming the queue) or a positive number."),
    Setting("fair_interactive_reserve", 1,
            "Extra slots above a group's cap usable only by interactive tasks."),
    Setting("fair_lease_seconds", 30,
            "How long a dispatched task's slot survives without a sign of life from a worker."),
    Setting("fair_policy", "wfq",
            "Scheduling policy: 'wfq' (weighted start-time fair queueing; equal weights "
            "give round robin)."),
    Setting("fair_batch_size", 100, "Most messages one dispatcher pick takes at once."),
    Setting("fair_tasks", {},
            "Tasks published by name (send_task, beat) that celery_fair.install(app) holds: "
            "{name or glob: {'group': 'kwarg:NAME' / 'arg:N' / 'header:NAME' / "
            "'value:GROUP' (or a list of them, or a callable (args, kwargs) -> group), "
            "'interactive': bool, 'cost': n}}."),
)
_DEFAULTS = {s.name: s.default for s in SETTINGS}


def settings_table() -> str:
    """The settings as a Markdown table (the README's table is this, verbatim)."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    rows += [f"| `{s.name}` | `{s.default!r}` | {s.doc} |" for s in SETTINGS]
    return "\n".join(rows)
POLICIES = ("wfq",)
MAX_GROUP_LENGTH = 200


@dataclass(frozen=True)
class FairConfig:
    """The validated ``fair_*`` settings of one Celery app."""

    store_url: str
    key_prefix: str
    default_group: str
    default_concurrency: int | None
    group_concurrency: Mapping[str, int]
    group_weights: Mapping[str, float]
    max_inflight: int | None  # None: auto
    interactive_reserve: int
    lease_seconds: float
    policy: str
    batch_size: int
    tasks: TaskRules = field(default_factory=TaskRules)  # fair_tasks, for install()

    @classmethod
    def from_app(cls, app: Celery) -> FairConfig:
        """Read and validate the app's settings; raise ConfigurationError on the first bad one."""
        conf = app.conf
        _reject_unknown(conf)
        get: Callable[[str], Any] = lambda name: conf.get(name, _DEFAULTS[name])  # noqa: E731
        return cls(
            store_url=_store_url(get("fair_store_url"), conf.get("broker_url")),
            key_prefix=_nonempty_str("fair_key_prefix", get("fair_key_prefix")),
            default_group=_default_group(get("fair_default_group")),
            default_concurrency=_optional_count("fair_default_concurrency",
                                                get("fair_default_concurrency")),
            group_concurrency=_group_map("fair_group_concurrency",
                                         get("fair_group_concurrency"), _count),
            group_weights=_group_map("fair_group_weights", get("fair_group_weights"), _weight),
            max_inflight=_max_inflight(get("fair_max_inflight")),
            interactive_reserve=_count("fair_interactive_reserve",
                                       get("fair_interactive_reserve"), minimum=0),
            lease_seconds=_positive("fair_lease_seconds", get("fair_lease_seconds")),
            policy=_choice("fair_policy", get("fair_policy"), POLICIES),
            batch_size=_count("fair_batch_size", get("fair_batch_size")),
            tasks=parse_rules(get("fair_tasks")),
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


def _reject_unknown(conf: Mapping[str, Any]) -> None:
    for key in list(conf.keys()):
        lowered = str(key).lower()
        if lowered.startswith("fair_") and lowered not in _DEFAULTS:
            close = difflib.get_close_matches(lowered, list(_DEFAULTS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigurationError(f"unknown celery_fair setting {key!r}{hint}")


def _fail(name: str, value: Any, expected: str) -> ConfigurationError:
    return ConfigurationError(f"setting {name}={value!r} is invalid: expected {expected}")


def _store_url(url: Any, broker_url: Any) -> str:
    if url is None:
        broker = broker_url if isinstance(broker_url, str) else ""
        if broker.split(";")[0].startswith(("redis://", "rediss://", "unix://")):
            return broker.split(";")[0]
        raise ConfigurationError(
            "setting fair_store_url is required: the broker is not Redis "
            f"({broker or 'unset'!s}), so celery_fair needs a Redis URL to hold tasks in")
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        raise _fail("fair_store_url", url, "a redis://, rediss:// or unix:// URL")
    return url


def _nonempty_str(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(name, value, "a non-empty string")
    return value


def _default_group(value: Any) -> str:
    from .groups import validate_group

    try:
        return validate_group(value)
    except ValueError as exc:
        raise ConfigurationError(f"setting fair_default_group is invalid: {exc}") from None


def _count(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(name, value, f"an integer >= {minimum}")
    return value


def _optional_count(name: str, value: Any) -> int | None:
    return None if value is None else _count(name, value)


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise _fail(name, value, "a positive number of seconds")
    return float(value)


def _weight(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or not 1e-6 <= value <= 1e6:
        raise _fail(name, value, "a weight between 1e-06 and 1e+06")
    return float(value)


def _group_map(name: str, value: Any, check: Callable[[str, Any], Any]) -> dict[str, Any]:
    from .groups import validate_group

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


def _max_inflight(value: Any) -> int | None:
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail("fair_max_inflight", value, "'auto' or an integer >= 1")
    return value


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _fail(name, value, "one of " + ", ".join(repr(c) for c in choices))
    return str(value)
