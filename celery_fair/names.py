"""Group names and task costs as a user gives them: the validators every entry point shares.

A leaf module (it imports only errors and limits), so settings, rules, the store and the
task side can all validate a group without importing each other.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from . import limits
from .errors import InvalidGroup

#: Longest group name, in characters.
MAX_GROUP_LENGTH = 200


def validate_group(value: Any) -> str:
    """Return ``value`` as a group name, or raise :class:`InvalidGroup` saying why.

    Strings and integers (tenant ids) are accepted; the name must be 1 to 200 characters
    with no control characters. Any other unicode is safe in Redis keys.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidGroup(
            f"fair group {value!r} has type {type(value).__name__}: expected str or int")
    name = str(value)
    if not name:
        raise InvalidGroup("fair group is empty: expected 1 to 200 characters")
    if len(name) > MAX_GROUP_LENGTH:
        raise InvalidGroup(
            f"fair group {name[:40]!r}... is {len(name)} characters long: "
            f"expected at most {MAX_GROUP_LENGTH}")
    if any(unicodedata.category(ch) == "Cc" for ch in name):
        raise InvalidGroup(f"fair group {name!r} contains control characters")
    if any(unicodedata.category(ch) == "Cs" for ch in name):
        raise InvalidGroup(f"fair group {name!r} contains lone surrogates: expected text "
                           "that encodes to UTF-8")
    return name


def validate_cost(value: Any) -> float:
    """Return ``value`` as a task cost, or raise :class:`InvalidCost` (:func:`limits.cost`)."""
    return limits.cost(value)
