"""What the web integrations share: finding a request's group (the Django middleware and
the Flask extension), and waits written for people (the Flower and Django admin pages).

A *group resolver* is a callable ``request -> group`` (a tenant id, a user id), or None
for "no group" (the task's own rule, the parent task or ``fair_default_group`` decide).
It is given as the callable itself or as its dotted path, the way Django settings name
code (``CELERY_FAIR_GROUP_RESOLVER = "myapp.tenancy.tenant_of"``).

:func:`position_json` is a task's place as a JSON-ready dict, for a Django or Flask view
(``JsonResponse(position_json(app, task_id))``, ``jsonify(position_json(app, task_id))``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Callable

from celery.utils.imports import symbol_by_name

from ..config import _resolver_ref
from ..errors import ConfigurationError, InvalidGroup
from ..groups import fair_context
from ..names import validate_group
from ..position import position

#: A request's group: a callable of the framework's request object.
Resolver = Callable[[Any], Any]
#: The setting (Django) and config key (Flask) naming the resolver.
SETTING = "CELERY_FAIR_GROUP_RESOLVER"


def load_resolver(value: Any, setting: str = SETTING) -> Resolver | None:
    """The resolver ``value`` names: a callable, a dotted path to one, or None.

    Raises:
        ConfigurationError: ``value`` is neither, or the path does not import, or it
            names something that is not callable.
    """
    value = _resolver_ref(setting, value)
    if not isinstance(value, str):
        return value  # type: ignore[no-any-return]
    try:
        found = symbol_by_name(value)  # "pkg.mod.func" or "pkg.mod:func"
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigurationError(
            f"setting {setting}={value!r} does not import: {exc}") from exc
    if not callable(found):
        raise ConfigurationError(
            f"setting {setting}={value!r} names {type(found).__name__} {found!r}: "
            "expected a callable request -> group")
    return found  # type: ignore[no-any-return]


def request_group(resolver: Resolver, request: Any, describe: str) -> str | None:
    """Run the resolver on a request; a bad group raises an error naming the resolver.

    Parameters:
        describe: the request, as the error should name it (``GET /upload``).
    """
    value = resolver(request)
    if value is None:
        return None
    try:
        return validate_group(value)
    except InvalidGroup as exc:
        name = getattr(resolver, "__qualname__", repr(resolver))
        raise InvalidGroup(
            f"group resolver {name} gave {value!r} for {describe}: {exc}") from None


@contextlib.contextmanager
def request_scope(group: str | None, interactive: bool) -> Iterator[None]:
    """The ``fair_context`` of one request (reset when the block ends, error or not)."""
    with fair_context(group=group, interactive=interactive or None):
        yield


def position_json(app: Any, task_id: str) -> dict[str, Any]:
    """Where ``task_id`` stands (:func:`celery_fair.position`) as a JSON-ready dict:
    ``in_group``, ``groups_ahead``, ``dispatches_ahead``, ``eta_seconds``, ``state``,
    ``queue``, ``group``, ``lower_bound``. Raises as :func:`celery_fair.position` does."""
    return position(app, task_id).as_json()
