"""What the Fair queues page shows of the controls in force, read live from the store:
pauses and boosts, each with who set it and why, rate limits and throttles.

A refresh reads one key (or table) per family per listed queue (:meth:`Store.pauses`,
:meth:`Store.boosts`, :meth:`Store.rates`, :meth:`Store.throttles`) and, only while a
pause or a boost is in force, the newest entry of the audit log. A pause or a boost
keeps only its end, so who set it and why come from its audit entry:
:class:`ControlNotes` keeps, between refreshes, the newest ``pause`` and ``boost`` entry
per queue and group in force, and reads older entries again only when the log changed
since the last refresh (the few new ones, or up to :data:`AUDIT_DEPTH` when more came
than a refresh could follow).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..audit import utc_text
from ..limits import Rate
from ..store.audit import AuditEntry
from ..store.base import Store, now_ms

__all__ = ["AUDIT_DEPTH", "AUDIT_STEP", "ControlNotes", "InForce", "notes_for",
           "read_in_force", "short_utc"]

#: Audit entries read (newest first) when the log cannot be followed from the last
#: refresh: a pause or boost set before the newest AUDIT_DEPTH entries shows no actor.
AUDIT_DEPTH = 500
#: Entries read first when the log changed: more than a refresh usually brings.
AUDIT_STEP = 20

#: (action, queue, group): the control an audit entry set ('' for a whole queue).
Key = tuple[str, str, str]


@dataclass
class InForce:
    """One fair queue's pauses and boosts as the page shows them.

    ``pauses``: {group ('' for the whole queue): {"until": UTC text or None, "by",
    "reason"}}; ``boosts``: {group: {"weight", "until", "by", "reason"}} ("by" and
    "reason" None when no audit entry was found)."""

    pauses: dict[str, dict[str, Any]] = field(default_factory=dict)
    boosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: {group: its own rate ("10/s (burst 20)", "none": no rate limit)} of the groups
    #: with one (a setting or a runtime limit); the others have ``default_rate``.
    rates: dict[str, str] = field(default_factory=dict)
    default_rate: str | None = None
    #: {group: when its throttle ends (UTC, to the ms)}, only those not ended yet
    throttles: dict[str, str] = field(default_factory=dict)

    def rate_of(self, group: str) -> str:
        """The rate limit in force for ``group`` as the page shows it ('' for none)."""
        if group in self.rates:
            return "" if self.rates[group] == "none" else self.rates[group]
        return f"{self.default_rate} (default)" if self.default_rate else ""


def read_in_force(store: Store, queues: list[str], notes: ControlNotes,
                  default_rate: Rate | None = None) -> dict[str, InForce]:
    """Every listed queue's :class:`InForce`: four store reads per queue, plus the audit
    log's newest entry while a pause or boost is in force (:class:`ControlNotes`).
    ``default_rate``: ``fair_default_rate_limit``, the rate of a group without its own."""
    pauses = {q: store.pauses(q) for q in queues}
    boosts = {q: store.boosts(q) for q in queues}
    rates = {q: store.rates(q) for q in queues}
    throttles = {q: store.throttles(q) for q in queues}
    now = now_ms()
    wanted = {("pause", q, g) for q in queues for g in pauses[q]} | \
        {("boost", q, g) for q in queues for g in boosts[q]}
    found = notes.lookup(store, wanted)
    out = {}
    for q in queues:
        shown = InForce()
        for g, until in pauses[q].items():
            shown.pauses[g] = _note(found.get(("pause", q, g)), until)
        for g, (weight, until) in boosts[q].items():
            shown.boosts[g] = {"weight": weight, **_note(found.get(("boost", q, g)), until)}
        shown.rates = {g: "none" if r is None else str(r) for g, r in rates[q].items()}
        shown.default_rate = None if default_rate is None else str(default_rate)
        shown.throttles = {g: utc_ms(until) for g, until in throttles[q].items()
                           if until > now}
        out[q] = shown
    return out


def _note(entry: AuditEntry | None, until: int | None) -> dict[str, Any]:
    return {"until": None if until is None else utc_text(until),
            "by": entry.actor if entry else None, "reason": entry.reason if entry else None}


def utc_ms(ms: float) -> str:
    """A store time (ms) to the millisecond, in UTC (a throttle lasts a moment), with
    its date when it is not today."""
    at = datetime.fromtimestamp(ms / 1000, timezone.utc)
    text = at.strftime("%H:%M:%S.%f")[:-3] + "Z"
    return text if at.date() == datetime.now(timezone.utc).date() else \
        at.strftime("%Y-%m-%d ") + text


def short_utc(text: str) -> str:
    """A :func:`~celery_fair.audit.utc_text` for a table cell: its time alone when it is
    today (UTC), else its date and time (``2026-11-27 10:20Z``)."""
    day, _, time_of_day = text.partition("T")
    today = utc_text(now_ms()).partition("T")[0]
    return time_of_day if day == today else f"{day} {time_of_day[:5]}Z"


class ControlNotes:
    """The newest ``pause`` and ``boost`` audit entry of each queue and group in force,
    carried from refresh to refresh (one per store; refreshes run in Flower's thread
    pool, so a lock keeps them apart)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._newest: AuditEntry | None = None  # the log's newest entry when last read
        self._latest: dict[Key, AuditEntry] = {}

    def lookup(self, store: Store, wanted: set[Key]) -> dict[Key, AuditEntry]:
        """The newest entry of each key of ``wanted`` found in the log; reads nothing
        when ``wanted`` is empty. Keys no longer wanted are forgotten: a control set
        again later writes a newer entry, which the next read follows."""
        if not wanted:
            return {}
        with self._lock:
            self._follow(store)
            self._latest = {k: e for k, e in self._latest.items() if k in wanted}
            return dict(self._latest)

    def _follow(self, store: Store) -> None:
        head = store.audit_read(1)
        if not head or head[0] == self._newest:
            return  # nothing appended since the last read (the usual refresh)
        entries = store.audit_read(AUDIT_STEP)
        top = entries[0] if entries else head[0]
        if self._newest is not None and self._newest in entries:
            entries = entries[:entries.index(self._newest)]  # only the new ones
        else:  # the first read, or more new entries than a step: start afresh
            if len(entries) == AUDIT_STEP:
                entries = store.audit_read(AUDIT_DEPTH)
            self._latest = {}
        for entry in reversed(entries):  # oldest first: a newer entry replaces an older
            key = _key(entry)
            if key is not None:
                self._latest[key] = entry
        self._newest = top


def _key(entry: AuditEntry) -> Key | None:
    """The pause or group boost an entry set (a task's boost sets nothing that lasts)."""
    args = entry.args
    if entry.action not in ("pause", "boost") or "task" in args:
        return None
    return entry.action, str(args.get("queue")), str(args.get("group") or "")


_NOTES: dict[int, ControlNotes] = {}
_NOTES_LOCK = threading.Lock()


def notes_for(store: Store) -> ControlNotes:
    """The :class:`ControlNotes` of ``store`` (stores are kept for the process's life:
    ``store_for_url``)."""
    with _NOTES_LOCK:
        return _NOTES.setdefault(id(store), ControlNotes())
