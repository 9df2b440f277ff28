"""The held message: what a publish carried, in a form the store keeps as one byte string.

Layout of a stored value::

    <class><front><cost>:<group byte length>:<group><meta JSON>\\n<headers JSON>\\n
    <properties JSON>\\n<body bytes>

``class`` is ``i`` (interactive) or ``b`` (background); ``front`` is ``1`` when the message
re-enters at the head of its group (retries). The JSON parts hold everything kombu needs to
publish the message verbatim: exchange, routing key, target queue, content type and
encoding, delivery mode and priority (meta), then the headers and the properties. The meta
also holds ``t``: when the message became due for dispatch (epoch seconds; its hold time,
or its ETA if later), first so that ``summarize.lua`` reads it without decoding, and
``sg``, its subgroup under ``fair_subgroup = "path"`` (``common.lua`` decodes the meta
for it when a message is placed in its group's list). JSON
never contains a raw newline, so each ``\\n`` after the prefix ends one part. Headers and
properties are parts of their own so that ``pick.lua`` can build kombu's Redis message from
them without decoding them (the direct push, see ``direct.py`` and ``publisher.py``). A
value written before that split (meta with ``h`` and ``p`` inside, then the body) still
decodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kombu.utils.json import loads

from . import limits
from .errors import CorruptMessage
from .json_text import ENCODER
from .store.models import Placement

INTERACTIVE = "i"
BACKGROUND = "b"
#: The stored value's prefix: <class><front><cost>:<group length>:<group>.
_PREFIX = re.compile(rb"([ib])([01])([^:]+):(\d+):")
#: The due time (meta ``t``), first in the meta JSON.
_DUE = re.compile(rb'\{"t": ?([\d.eE+-]+)')


@dataclass
class Envelope:
    """One captured publish."""

    body: bytes
    content_type: str
    content_encoding: str
    headers: dict[str, Any]
    exchange: str
    routing_key: str
    queue: str
    delivery_mode: int | None = None
    priority: int | None = None
    properties: dict[str, Any] = field(default_factory=dict)
    due_at: float | None = None  # epoch seconds the message became due (meta ``t``)
    #: fair_subgroup 'path': the subgroup inside its group (meta ``sg``; None: none)
    subgroup: str | None = None

    @property
    def task_id(self) -> str:
        return str(self.headers.get("id", ""))

    @property
    def task_name(self) -> str:
        return str(self.headers.get("task", ""))

    def meta(self) -> bytes:
        """The meta part of the stored value (JSON): due time, destination, content type
        and encoding, delivery mode and priority."""
        fields: dict[str, Any] = {} if self.due_at is None else {"t": self.due_at}
        if self.subgroup is not None:  # common.lua subgroup_of reads it
            fields["sg"] = self.subgroup
        text: str = ENCODER.encode({
            **fields, "e": self.exchange, "r": self.routing_key, "q": self.queue,
            "ct": self.content_type, "ce": self.content_encoding,
            "dm": self.delivery_mode, "pr": self.priority,
        })
        return text.encode()

    def encode(self, group: str, klass: str, cost: float, front: bool,
               meta: bytes | None = None) -> bytes:
        """The stored value: routing prefix for the scripts, then meta and body. ``meta``:
        :meth:`meta` when the caller has it already (many envelopes that share it)."""
        meta = self.meta() if meta is None else meta
        return b"".join((value_prefix(group, klass, cost, front), meta, b"\n",
                         ENCODER.encode(self.headers).encode(), b"\n",
                         ENCODER.encode(self.properties).encode(), b"\n", self.body))

    @classmethod
    def decode(cls, value: bytes) -> tuple[str, str, Envelope]:
        """Parse a stored value into ``(group, class, envelope)``."""
        try:
            klass, group, end = _prefix(value)
            newline = value.index(b"\n", end)
            meta = loads(value[end:newline])
            if "h" not in meta:  # headers and properties in parts of their own
                first = value.index(b"\n", newline + 1)
                second = value.index(b"\n", first + 1)
                meta["h"] = loads(value[newline + 1:first])
                meta["p"] = loads(value[first + 1:second])
                newline = second
            body = value[newline + 1:]
            envelope = cls(
                body=body, content_type=meta["ct"], content_encoding=meta["ce"],
                headers=meta["h"], exchange=meta["e"], routing_key=meta["r"],
                queue=meta["q"], delivery_mode=meta["dm"], priority=meta["pr"],
                properties=meta["p"], due_at=meta.get("t"), subgroup=meta.get("sg"))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise CorruptMessage(f"held message could not be decoded: {exc!r}") from None
        return group, klass, envelope


def value_prefix(group: str, klass: str, cost: float, front: bool) -> bytes:
    """The start of a stored value, up to its meta: ``<class><front><cost>:<group byte
    length>:<group>``."""
    group_bytes = group.encode()
    return f"{klass}{1 if front else 0}{_cost_text(cost)}:{len(group_bytes)}:".encode() \
        + group_bytes


def placement_of(value: bytes, hold_id: str = "") -> Placement:
    """Where a stored value goes, read from its prefix only (no JSON), as ``common.lua``'s
    ``decode`` reads it: for what reads a stored value's placement back (the publisher's
    observers, ``fair inspect``, tests), never for ``hold``, which is given it.

    Raises:
        CorruptMessage: naming ``hold_id`` (when given), when the value is not one
            celery_fair wrote (class, front, cost in range, group).
    """
    match = _PREFIX.match(value)
    try:
        size = int(match.group(4)) if match else -1
        group = value[match.end():match.end() + size].decode() if match else ""
        cost = limits.cost(float(match.group(3))) if match else 0.0
    except (ValueError, UnicodeDecodeError):
        match = None
    if match is None or not group or len(group.encode()) != size:
        raise CorruptMessage(f"hold {hold_id or '?'}: the stored value does not decode "
                             "(expected envelope.py's layout: class, front, cost in range, "
                             "group)")
    return Placement(group, match.group(1).decode(), cost, match.group(2) == b"1")


def due_of(value: bytes) -> float | None:
    """When a stored value became due (meta ``t``, epoch seconds), None when it has none
    or its prefix does not decode; reads no more than the prefix and that number."""
    match = _PREFIX.match(value)
    if match is None:
        return None
    due = _DUE.match(value, match.end() + int(match.group(4)))
    return float(due.group(1)) if due else None


def subgroup_of(value: bytes) -> str | None:
    """The subgroup a stored value names (meta ``sg``; None: none, or a value that does
    not decode), as ``common.lua``'s ``subgroup_of`` reads it."""
    match = _PREFIX.match(value)
    if match is None:
        return None
    start = match.end() + int(match.group(4))
    try:
        sub = loads(value[start:value.index(b"\n", start)]).get("sg")
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError):
        return None
    return sub if isinstance(sub, str) else None


def _prefix(value: bytes) -> tuple[str, str, int]:
    """Class, group and the offset where the meta JSON starts."""
    klass = value[:1].decode()
    first = value.index(b":", 2)
    second = value.index(b":", first + 1)
    size = int(value[first + 1:second])
    start = second + 1
    return klass, value[start:start + size].decode(), start + size


def _cost_text(cost: float) -> str:
    return str(int(cost)) if float(cost).is_integer() else repr(float(cost))

