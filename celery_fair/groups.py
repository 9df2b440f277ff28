"""Which group and class a task belongs to: ``fair_context`` and resolution rules
(validation is in names.py)."""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Union

from .errors import InvalidGroup
from .limits import PATH_SUBGROUP
from .names import validate_group

#: How a task names its group: an argument name, a callable ``(args, kwargs) -> group``.
GroupRule = Union[str, Callable[[Sequence[Any], Mapping[str, Any]], Any], None]


@dataclass(frozen=True)
class FairScope:
    group: str | None
    interactive: bool | None


_scope: contextvars.ContextVar[FairScope | None] = contextvars.ContextVar(
    "celery_fair_scope", default=None)


@contextlib.contextmanager
def fair_context(group: Any = None, interactive: bool | None = None) -> Iterator[None]:
    """Set the group and class of fair tasks published inside the block.

    Web middleware uses it per request: ``with fair_context(group=user.tenant_id,
    interactive=True): convert.delay(...)``. A task's own rule and call-time
    ``fair_group=`` take precedence.
    """
    scope = FairScope(None if group is None else validate_group(group), interactive)
    token = _scope.set(scope)
    try:
        yield
    finally:
        _scope.reset(token)


def split_path(group: str, mode: str) -> tuple[str, str | None]:
    """The group a task is held in and its subgroup: under ``fair_subgroup`` 'path' a
    group named "acme/alice" is the subgroup "alice" of the group "acme" (split at its
    first "/"; a name with nothing before or after it stays whole); else the name."""
    if mode != PATH_SUBGROUP:
        return group, None
    head, slash, tail = group.partition("/")
    return (head, tail) if head and tail else (group, None)


def current_scope() -> FairScope | None:
    """The innermost active :func:`fair_context`, if any."""
    return _scope.get()


class GroupResolver:
    """Turns a task's ``group=`` rule into a function of the call's arguments."""

    def __init__(self, rule: GroupRule, run: Callable[..., Any], task_name: str,
                 option: str = "group", error: type[Exception] = InvalidGroup) -> None:
        # ``option``/``error``: the same rule names a singleton key (singleton.py)
        self.rule = rule
        self.task_name = task_name
        self._position: int | None = None
        if isinstance(rule, str):
            self._position = _argument_position(rule, run, task_name, option, error)
        elif rule is not None and not callable(rule):
            raise error(
                f"task {task_name}: {option}={rule!r} must be an argument name or a "
                f"callable (args, kwargs) -> {option}")

    def __call__(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """The raw group value for a call, or None when the rule gives none."""
        rule = self.rule
        if rule is None:
            return None
        if isinstance(rule, str):
            if rule in kwargs:
                return kwargs[rule]
            if self._position is not None and self._position < len(args):
                return args[self._position]
            return None
        return rule(args, kwargs)


def _argument_position(name: str, run: Callable[..., Any], task_name: str, option: str,
                       error: type[Exception]) -> int | None:
    try:
        params = list(inspect.signature(run).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params) and name not in {p.name for p in params}:
        return None
    for index, param in enumerate(params):
        if param.name == name:
            if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
                return index
            return None
    raise error(
        f"task {task_name}: {option}={name!r} is not an argument of the task "
        f"(arguments: {', '.join(p.name for p in params) or 'none'})")
