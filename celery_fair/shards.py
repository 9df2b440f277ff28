"""``celery -A proj fair dispatch --shard i/n``: a dispatcher serving only its share of
the fair queues, so that several dispatchers split the work by queue (on a Redis Cluster,
each then mostly talks to the primaries of its own queues' slots).

A queue belongs to shard ``crc32(name) mod n``: stable across processes, versions and
stores, and spread evenly over the shards. It is a load split, not an exclusive lease:
dispatchers serving one queue together stay safe (each pick is atomic in the store), so
shards that overlap during a redeploy with another ``n`` cost nothing but some double
work, and a queue whose shard has no dispatcher is not served until one starts.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count``: the fair queues whose hash mod ``count`` is
    ``index``."""

    index: int
    count: int

    def serves(self, queue: str) -> bool:
        return self.of(queue) == self.index

    def of(self, queue: str) -> int:
        """The shard of ``queue`` among ``count``."""
        return zlib.crc32(queue.encode()) % self.count

    def refuse_others(self, queues: list[str]) -> None:
        """Refuse queues named with ``-Q`` that this shard does not serve: the
        dispatcher would leave them unserved, saying nothing.

        Raises:
            ValueError: naming each such queue's shard.
        """
        others = [f"{q!r} is in shard {self.of(q)}/{self.count}" for q in queues
                  if not self.serves(q)]
        if others:
            raise ValueError(f"--shard {self} does not serve every queue given with -Q: "
                             f"{', '.join(others)}; give -Q only the shard's queues, or "
                             "leave out -Q to serve all of the shard's")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


#: ASCII digits (str.isdigit takes '²', which int() refuses).
_WHOLE = re.compile(r"[0-9]+")


def parse_shard(text: str) -> Shard:
    """The shard of ``"i/n"`` (0 <= i < n).

    Raises:
        ValueError: not of that form (the message says what is expected).
    """
    index, slash, count = text.strip().partition("/")
    if not slash or not _WHOLE.fullmatch(index) or not _WHOLE.fullmatch(count):
        raise ValueError(f"expected i/n (this dispatcher's shard i of n, e.g. 0/3), "
                         f"not {text!r}")
    if int(count) < 1 or int(index) >= int(count):
        raise ValueError(f"expected i/n with n >= 1 and 0 <= i < n, not {text!r}")
    return Shard(int(index), int(count))
