"""The audit log of operator controls, a family of the store contract
(:class:`~celery_fair.store.base.Store` inherits it): who changed what, when, why, and
until when.

Every control of :mod:`celery_fair.controls` appends one :class:`AuditEntry` after it
has written its change, and ``celery -A proj fair audit`` reads them back, newest first.
The log is bounded: a store keeps the last :data:`AUDIT_MAX` entries of its namespace
(Redis: a list trimmed on each append; SQL: the ``audit`` table, trimmed on each
append; memory: a bounded deque), so a script that loops over a control cannot fill the
store. Controls are rare (a person or a script acting), so the trim's cost does not
matter. The caller's clock, as for the heartbeats.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AUDIT_MAX", "Audit", "AuditEntry"]

#: Entries a store keeps per namespace (the oldest are dropped past it).
AUDIT_MAX = 10_000


@dataclass(frozen=True)
class AuditEntry:
    """One control as it was made.

    ``action`` is the control's name (``limit``, ``pause``, ``resume``, ``expire``, ``purge``),
    ``args`` its arguments (JSON values: the queue, the group, the numbers), ``actor``
    who made it (the OS user, the Django user, or an explicit ``actor=``), ``reason`` the
    reason given, ``until_ms`` when the change expires by itself (None: it does not).
    """

    at_ms: int
    actor: str
    action: str
    args: Mapping[str, Any] = field(default_factory=dict)
    reason: str | None = None
    until_ms: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {"at_ms": self.at_ms, "actor": self.actor, "action": self.action,
                "args": dict(self.args), "reason": self.reason, "until_ms": self.until_ms}

    def dumps(self) -> str:
        """The entry as one JSON document (how the Redis and SQL stores keep it)."""
        return json.dumps(self.as_json())  # args in their order: how `fair audit` shows them

    @classmethod
    def loads(cls, doc: str | bytes) -> AuditEntry:
        data = json.loads(doc)
        return cls(int(data["at_ms"]), str(data["actor"]), str(data["action"]),
                   dict(data.get("args") or {}), data.get("reason"), data.get("until_ms"))


class Audit(abc.ABC):
    """The audit log of one namespace (every fair queue's controls together)."""

    @abc.abstractmethod
    def audit_append(self, entry: AuditEntry) -> None:
        """Append ``entry`` and drop the oldest entries past :data:`AUDIT_MAX`. A resend
        may append it twice (a log of intents, not a state)."""

    @abc.abstractmethod
    def audit_read(self, limit: int = 100, since_ms: int | None = None) -> list[AuditEntry]:
        """The newest ``limit`` entries (at most), newest first; with ``since_ms``, only
        those made at or after it. Reads only."""
