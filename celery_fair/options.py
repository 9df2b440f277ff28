"""Misspelt celery_fair options raise instead of landing a task in the default group.

Celery takes any keyword of ``@app.task``/``shared_task`` as a task attribute, and any
``apply_async`` option as a message property, so a misspelt ``fair_grup=`` would be
accepted silently. The rule, the same wherever options are given: a name is refused when
it starts with ``fair_`` but is not a celery_fair option, or when it is close (difflib) to
a celery_fair option or to its other spelling (``group`` for ``fair_group`` and the other
way round). Any other name is left to Celery, and so is an attribute Celery's ``Task``
has: those are legitimate.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from celery import Task

from .errors import InvalidOption

#: The ``fair_*`` attributes of a FairTask (and ``apply_async`` options).
TASK_OPTIONS = ("fair_group", "fair_interactive", "fair_cost", "fair_singleton",
                "fair_singleton_mode")
#: How close (difflib ratio) a name must be to an option to be taken for a misspelling:
#: one wrong, missing or extra letter in ``group``, ``interactive`` or ``cost``.
CUTOFF = 0.8


#: Celery's own task attributes (read from the class dicts: ``hasattr(Task, "app")`` would
#: bind Celery's base Task class to the current app).
_CELERY_TASK_ATTRIBUTES = frozenset(name for klass in Task.__mro__ for name in vars(klass))


def _spellings(options: Iterable[str]) -> dict[str, str]:
    """Every spelling of each option (as given, with and without ``fair_``) -> the option."""
    out: dict[str, str] = {}
    for option in options:
        stem = option.removeprefix("fair_")
        out.update({stem: option, f"fair_{stem}": option})
    return out


def reject_misspelt(names: Iterable[str], options: Iterable[str], where: str) -> None:
    """Raise :class:`InvalidOption` for the first of ``names`` that looks meant as one of
    ``options`` but is not one (see the module's rule); ``where`` names what was given."""
    known = tuple(options)
    for name in names:
        if name in known or name.startswith("_") or name in _CELERY_TASK_ATTRIBUTES:
            continue
        wrong = _misspelt(name, known)
        if wrong is not None:
            raise InvalidOption(f"{where}: {wrong}")


@functools.lru_cache(maxsize=1024)
def _misspelt(name: str, known: tuple[str, ...]) -> str | None:
    """Why ``name`` is refused as a misspelling of one of ``known``, or None (Celery's);
    remembered, so that an ``apply_async`` option such as ``countdown`` costs difflib
    once per process, not once per call."""
    spellings = _spellings(known)
    close = difflib.get_close_matches(name, list(spellings), n=1, cutoff=CUTOFF)
    if not close and not name.startswith("fair_"):
        return None
    hint = f"; did you mean {spellings[close[0]]!r}?" if close else ""
    return (f"unknown celery_fair option {name!r}{hint} (expected one of "
            f"{', '.join(map(repr, known))})")


def class_options(namespace: Mapping[str, Any]) -> list[str]:
    """The names of a task class's own attributes that are options, not methods written in
    its body (a method ``grouper`` is no misspelt ``group``; a callable option is)."""
    return [name for name, value in namespace.items()
            if not (inspect.isfunction(value) and value.__name__ == name)
            and not isinstance(value, (staticmethod, classmethod, property))]
