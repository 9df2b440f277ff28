"""Singleton keys (issue 14 item 4): at most one task per key in flight at a time.

A task names its key like its group: ``@fair_task(singleton="doc_id")`` (an argument
name) or ``singleton=callable`` (``(args, kwargs) -> key``), or per call
``apply_async(fair_singleton=...)``. ``singleton_mode`` says what a new task of a key
that already has one *waiting* (held, not dispatched) does: ``"wait"`` (default) waits
its turn, ``"drop"`` is not held (REVOKED, one log line). The store keeps the order
(DESIGN.md, "Singleton keys"); this module validates what the task side gives it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Mapping
from typing import Any

from .errors import InvalidOption

#: Headers of a held message with a singleton key (kept by a retry, not by children).
SINGLETON_HEADER, SINGLETON_MODE_HEADER = "fair_singleton", "fair_singleton_mode"
WAIT, DROP = "wait", "drop"
MODES = (WAIT, DROP)
#: A key is a Redis key part, like a group name: at most this many characters.
MAX_KEY_LENGTH = 200


def validate_key(value: Any, where: str = "fair singleton key") -> str:
    """``value`` as a singleton key (a str or an int, 1 to 200 characters, no control
    characters), or :class:`InvalidOption` naming ``where`` and what is expected."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidOption(f"{where} {value!r} has type {type(value).__name__}: "
                            "expected str or int")
    key = str(value)
    if not 0 < len(key) <= MAX_KEY_LENGTH:
        raise InvalidOption(f"{where} {key[:40]!r} is {len(key)} characters long: "
                            f"expected 1 to {MAX_KEY_LENGTH}")
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in key):
        raise InvalidOption(f"{where} {key!r} contains control characters or lone "
                            "surrogates: expected printable text")
    return key


def validate_mode(value: Any, where: str = "singleton_mode") -> str:
    """``value`` as a singleton mode, or :class:`InvalidOption` naming ``where``."""
    if value not in MODES:
        raise InvalidOption(f"{where}={value!r} is invalid: expected 'wait' or 'drop'")
    return str(value)


def singleton_headers(explicit: tuple[Any, Any], headers: Mapping[str, Any],
                      rule_key: Callable[[], Any], rule_mode: Any) -> dict[str, str]:
    """The singleton headers of one publication (none without a key). Precedence as for
    the group (holding.placement): the call's ``fair_singleton``/``fair_singleton_mode``,
    the message's own headers (a retry keeps its key), the task's rule. Unlike the group,
    neither ``fair_context`` nor the parent task gives a key: a key names one task's
    work, not its caller's."""
    key, mode = explicit
    if mode is not None:
        validate_mode(mode, "fair_singleton_mode")
    if key is None:
        key = headers.get(SINGLETON_HEADER)
    if key is None:
        key = rule_key()
    if key is None:
        return {}
    mode = mode or headers.get(SINGLETON_MODE_HEADER) or rule_mode or WAIT
    return {SINGLETON_HEADER: validate_key(key), SINGLETON_MODE_HEADER: validate_mode(mode)}
