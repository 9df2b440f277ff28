"""The held message: what a publish carried, in a form the store keeps as one byte string.

Layout of a stored value (the Lua scripts read only the prefix)::

    <class><front><cost>:<group byte length>:<group><meta JSON>\\n<body bytes>

``class`` is ``i`` (interactive) or ``b`` (background); ``front`` is ``1`` when the message
re-enters at the head of its group (retries). The meta JSON holds everything kombu needs to
publish the message verbatim: headers, properties, exchange, routing key, queues to declare.
JSON never contains a raw newline, so the first ``\\n`` after the prefix ends it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kombu.utils.json import dumps, loads

from .errors import CorruptMessage

INTERACTIVE = "i"
BACKGROUND = "b"


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

    @property
    def task_id(self) -> str:
        return str(self.headers.get("id", ""))

    @property
    def task_name(self) -> str:
        return str(self.headers.get("task", ""))

    def encode(self, group: str, klass: str, cost: float, front: bool) -> bytes:
        """The stored value: routing prefix for the scripts, then meta and body."""
        meta = dumps({
            "h": self.headers, "p": self.properties, "e": self.exchange,
            "r": self.routing_key, "q": self.queue, "ct": self.content_type,
            "ce": self.content_encoding, "dm": self.delivery_mode, "pr": self.priority,
        }).encode()
        group_bytes = group.encode()
        prefix = f"{klass}{1 if front else 0}{_cost_text(cost)}:{len(group_bytes)}:".encode()
        return b"".join((prefix, group_bytes, meta, b"\n", self.body))

    @classmethod
    def decode(cls, value: bytes) -> tuple[str, str, Envelope]:
        """Parse a stored value into ``(group, class, envelope)``."""
        try:
            klass = value[:1].decode()
            first = value.index(b":", 2)
            second = value.index(b":", first + 1)
            size = int(value[first + 1:second])
            start = second + 1
            group = value[start:start + size].decode()
            newline = value.index(b"\n", start + size)
            meta = loads(value[start + size:newline])
            body = value[newline + 1:]
            envelope = cls(
                body=body, content_type=meta["ct"], content_encoding=meta["ce"],
                headers=meta["h"], exchange=meta["e"], routing_key=meta["r"],
                queue=meta["q"], delivery_mode=meta["dm"], priority=meta["pr"],
                properties=meta["p"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise CorruptMessage(f"held message could not be decoded: {exc!r}") from None
        return group, klass, envelope


def _cost_text(cost: float) -> str:
    return str(int(cost)) if float(cost).is_integer() else repr(float(cost))
