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

import zlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count``: the fair queues whose hash mod ``count`` is
    ``index``."""

    index: int
    count: int

    def serves(self, queue: str) -> bool:
        return zlib.crc32(queue.encode()) % self.count == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """The shard of ``"i/n"`` (0 <= i < n).

    Raises:
        ValueError: not of that form (the message says what is expected).
    """
    index, slash, count = text.strip().partition("/")
    if not slash or not index.isdigit() or not count.isdigit():
        raise ValueError(f"expected i/n (this dispatcher's shard i of n, e.g. 0/3), "
                         f"not {text!r}")
    if int(count) < 1 or int(index) >= int(count):
        raise ValueError(f"expected i/n with n >= 1 and 0 <= i < n, not {text!r}")
    return Shard(int(index), int(count))
