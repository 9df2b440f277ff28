"""Who made a control, and its entry in the store's audit log (``store/audit.py``).

:mod:`celery_fair.controls` records each change it writes here; ``celery -A proj fair
audit`` and :func:`read` show them. The actor is the one given (``actor=``: a name, or a
Django user, named by ``str()``), else the OS user running the process.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from .errors import InvalidControl
from .store import store_for
from .store.audit import AUDIT_MAX, AuditEntry
from .store.base import Store, now_ms

__all__ = ["AUDIT_MAX", "MAX_REASON", "MAX_SECONDS", "AuditEntry", "actor_name",
           "check_reason", "check_seconds", "read", "record", "utc_text"]

#: Longest reason kept (characters); longer is refused, not cut.
MAX_REASON = 500
#: Longest duration of a pause or a boost (``for_seconds``): 366 days.
MAX_SECONDS = 366 * 86400
_MAX_ACTOR = 200


def os_user() -> str:
    """The OS user running this process (``uid <n>`` when it has no name)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container's uid without a passwd entry
        return f"uid {os.getuid()}"


def actor_name(actor: Any = None) -> str:
    """The actor as the log names it: ``actor`` (a name, or an object such as a Django
    user: its ``str()``), else the OS user.

    Raises:
        InvalidControl: the name is blank or longer than 200 characters.
    """
    if actor is None:
        return os_user()
    name = str(actor).strip()
    if not name or len(name) > _MAX_ACTOR:
        raise InvalidControl(f"actor must be a name of 1 to {_MAX_ACTOR} characters, "
                             f"got {str(actor)[:40]!r}")
    return name


def check_reason(reason: Any) -> str | None:
    """``reason`` checked: None, or a text of at most :data:`MAX_REASON` characters.

    Raises:
        InvalidControl: naming what was expected and what was given.
    """
    if reason is None:
        return None
    if not isinstance(reason, str):
        raise InvalidControl(f"reason must be a text, got {type(reason).__name__}")
    reason = reason.strip()
    if len(reason) > MAX_REASON:
        raise InvalidControl(f"reason must be at most {MAX_REASON} characters, got "
                             f"{len(reason)}")
    return reason or None


def check_seconds(value: Any, name: str = "for_seconds") -> float | None:
    """A control's duration (``name``) checked (None: no end).

    Raises:
        InvalidControl: naming the accepted range and what was given.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value <= MAX_SECONDS:
        raise InvalidControl(f"{name} must be a number of seconds above 0 and at most "
                             f"{MAX_SECONDS} (366 days), got {value!r}")
    return float(value)


def record(store: Store, action: str, args: Mapping[str, Any], *, actor: str,
           reason: str | None = None, until_ms: int | None = None) -> AuditEntry:
    """Append one entry (``actor`` already checked by :func:`actor_name`), now."""
    entry = AuditEntry(now_ms(), actor, action, dict(args), reason, until_ms)
    store.audit_append(entry)
    return entry


def utc_text(ms: int) -> str:
    """A store time (ms) as the log shows it: ISO 8601 in UTC, to the second."""
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def read(app: Any, limit: int = 100, since_ms: int | None = None) -> list[AuditEntry]:
    """The newest ``limit`` entries of ``app``'s audit log, newest first (``since_ms``:
    only those made at or after it)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidControl(f"limit must be a positive integer, got {limit!r}")
    return store_for(app).audit_read(limit, since_ms)
