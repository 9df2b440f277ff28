"""The ``fair_tasks`` setting: tasks published by name that celery_fair holds.

Code that cannot import or decorate a task (``app.send_task("proj.convert", ...)``, beat,
another service) names it in ``fair_tasks``; :func:`celery_fair.install` then holds its
messages exactly like a :class:`~celery_fair.FairTask`'s. The format::

    app.conf.fair_tasks = {
        # task name or glob pattern: rule (every key optional)
        "proj.convert": {"group": "header:x_tenant", "interactive": False, "cost": 1},
        "reports.*": {"group": ["kwarg:tenant_id", "arg:0"], "cost": 5},
        "billing.*": {},  # group from fair_context, the parent task, fair_default_group
    }

``group`` says where a message's group comes from: ``"kwarg:NAME"`` (a keyword argument),
``"arg:N"`` (the N-th positional argument), ``"header:NAME"`` (a message header set with
``headers={...}``), ``"value:GROUP"`` (always that group), a list of those (the first that
yields a value wins), or a callable ``(args, kwargs) -> group``. An exact name wins over
patterns; patterns are tried in the setting's order. A pattern never matches Celery's own
``celery.*`` tasks (name them exactly to hold them), and ``celery.ping`` is never held.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Union

from .errors import ConfigurationError, InvalidCost
from .names import validate_cost, validate_group

#: Where one message's group comes from: (kind, name) or a callable (args, kwargs) -> group.
GroupSource = Union[tuple[str, str], Callable[[Sequence[Any], Mapping[str, Any]], Any]]

SOURCE_KINDS = ("kwarg", "arg", "header", "value")
RULE_KEYS = ("group", "interactive", "cost")
NEVER_HELD = frozenset({"celery.ping"})


@dataclass(frozen=True)
class TaskRule:
    """How messages of the tasks matching ``pattern`` are held."""

    pattern: str
    group: tuple[GroupSource, ...] = ()
    interactive: bool | None = None
    cost: float = 1.0

    def group_of(self, args: Sequence[Any], kwargs: Mapping[str, Any],
                 headers: Mapping[str, Any]) -> Any:
        """The raw group value of one message, or None when no source yields one."""
        for source in self.group:
            value = _lookup(source, args, kwargs, headers)
            if value is not None:
                return value
        return None


def _lookup(source: GroupSource, args: Sequence[Any], kwargs: Mapping[str, Any],
            headers: Mapping[str, Any]) -> Any:
    if callable(source):
        return source(args, kwargs)
    kind, name = source
    if kind == "kwarg":
        return kwargs.get(name)
    if kind == "arg":
        index = int(name)
        return args[index] if index < len(args) else None
    if kind == "header":
        return headers.get(name)
    return name  # value


class TaskRules:
    """The parsed ``fair_tasks`` setting: which rule, if any, a task name falls under."""

    def __init__(self, rules: Sequence[TaskRule] = ()) -> None:
        self.exact = {r.pattern: r for r in rules if not _is_pattern(r.pattern)}
        self.patterns = [r for r in rules if _is_pattern(r.pattern)]
        self._cache: dict[str, TaskRule | None] = {}

    def __bool__(self) -> bool:
        return bool(self.exact or self.patterns)

    def match(self, name: str) -> TaskRule | None:
        """The rule of task ``name``: its exact entry, else the first matching pattern."""
        try:
            return self._cache[name]
        except KeyError:
            pass
        rule = self.exact.get(name)
        if rule is None and not name.startswith("celery."):
            rule = next((r for r in self.patterns if fnmatch.fnmatchcase(name, r.pattern)),
                        None)
        if name in NEVER_HELD:
            rule = None
        if len(self._cache) < 10_000:
            self._cache[name] = rule
        return rule


def _is_pattern(name: str) -> bool:
    return any(ch in name for ch in "*?[")


def parse_rules(value: Any) -> TaskRules:
    """Validate the ``fair_tasks`` setting; raise ConfigurationError saying what is wrong."""
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"setting fair_tasks={value!r} is invalid: expected a dict of "
            "{task name or glob: {'group': ..., 'interactive': ..., 'cost': ...}}")
    return TaskRules([_parse_rule(name, rule) for name, rule in value.items()])


def _parse_rule(name: Any, rule: Any) -> TaskRule:
    where = f"setting fair_tasks[{name!r}]"
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{where}: a key must be a task name or glob pattern")
    if not isinstance(rule, Mapping):
        raise ConfigurationError(
            f"{where}={rule!r} is invalid: expected a dict with keys among "
            f"{', '.join(RULE_KEYS)}")
    unknown = sorted(set(map(str, rule)) - set(RULE_KEYS))
    if unknown:
        raise ConfigurationError(
            f"{where} has unknown key(s) {', '.join(unknown)}: expected "
            f"{', '.join(RULE_KEYS)}")
    return TaskRule(name, _parse_group(where, rule.get("group")),
                    _parse_interactive(where, rule.get("interactive")),
                    _parse_cost(where, rule.get("cost", 1)))


def _parse_group(where: str, value: Any) -> tuple[GroupSource, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ConfigurationError(f"{where}['group'] is an empty list")
    return tuple(_parse_source(where, item) for item in items)


def _parse_source(where: str, item: Any) -> GroupSource:
    if callable(item):
        return item  # type: ignore[no-any-return]
    expected = ("expected 'kwarg:NAME', 'arg:N', 'header:NAME', 'value:GROUP' "
                "or a callable (args, kwargs) -> group")
    if not isinstance(item, str) or ":" not in item:
        raise ConfigurationError(f"{where}['group']={item!r} is invalid: {expected}")
    kind, _, name = item.partition(":")
    if kind not in SOURCE_KINDS or not name:
        raise ConfigurationError(f"{where}['group']={item!r} is invalid: {expected}")
    if kind == "arg" and not (name.isdigit() and name.isascii()):
        raise ConfigurationError(
            f"{where}['group']={item!r} is invalid: 'arg:N' takes a position (0, 1, ...)")
    if kind == "value":
        _valid_group(where, name)
    return (kind, name)


def _valid_group(where: str, name: str) -> None:
    try:
        validate_group(name)
    except ValueError as exc:
        raise ConfigurationError(f"{where}['group']: {exc}") from None


def _parse_interactive(where: str, value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ConfigurationError(
            f"{where}['interactive']={value!r} is invalid: expected True, False or None")
    return value


def _parse_cost(where: str, value: Any) -> float:
    try:
        return validate_cost(value)
    except InvalidCost as exc:
        raise ConfigurationError(f"{where}['cost']: {exc}") from None
