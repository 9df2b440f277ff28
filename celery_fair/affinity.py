"""Which live worker a group's tasks go to (``fair_affinity = "hash"``): pure functions.

Workers hold *slots*, numbered in the order they joined (so, by start time). A group's
slot is the jump consistent hash (Lamping and Veach, 2014) of the group over the number
of slots. A slot whose worker left stays in the table, empty, so that no other group
moves: a group whose slot is empty is hashed again, with a salt, until it lands on a
taken slot. A worker that joins takes the first empty slot, else a new one at the end.

Moves, as the tests measure over 10,000 groups (``tests/test_affinity.py``):

- a worker joins at the end (no empty slot): the groups jump hashing gives the new slot,
  1/(n+1) of them, move to it, and no other group moves;
- a worker leaves: only its groups move (each to the slot its salted hash finds);
- a worker joins into an empty slot: the groups whose first hash is that slot come back
  to it (those the leaving worker had), and the groups salted past it onto that slot.

The table is what every dispatcher must agree on, so it lives in the store and a slot is
taken atomically there; this module only reads and rewrites a table it is given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

#: A slot table: the worker holding each slot, or None where a worker left.
Slots = Sequence[str | None]

#: Salted hashes tried for a group whose slot is empty before the first taken slot in
#: order is used (with half the slots empty, 64 misses in a row is 1 chance in 2**64).
MAX_PROBES = 64

_MASK = (1 << 64) - 1


def jump(key: int, buckets: int) -> int:
    """Jump consistent hash: the bucket in ``[0, buckets)`` of the 64-bit ``key``.

    Going from n to n+1 buckets moves 1/(n+1) of the keys, all of them to the new bucket.
    """
    if buckets < 1:
        raise ValueError(f"buckets={buckets!r}: expected at least 1")
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & _MASK
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def group_key(group: str, probe: int = 0) -> int:
    """A stable 64-bit hash of ``group`` (the same in every process, unlike ``hash``),
    salted by ``probe`` after the first try."""
    data = group.encode() if probe == 0 else f"{probe}\x00{group}".encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def owner(group: str, slots: Slots) -> str | None:
    """The worker ``group``'s tasks go to under ``slots`` (None: no worker at all)."""
    if not any(slots):
        return None
    for probe in range(MAX_PROBES):
        worker = slots[jump(group_key(group, probe), len(slots))]
        if worker is not None:
            return worker
    return next(w for w in slots if w is not None)


def join(slots: Slots, worker: str) -> list[str | None]:
    """``slots`` with ``worker`` in it: unchanged when it holds a slot already, else in
    the first empty slot, else in a new slot at the end."""
    table = list(slots)
    if worker in table:
        return table
    if None in table:
        table[table.index(None)] = worker
    else:
        table.append(worker)
    return table


def leave(slots: Slots, worker: str) -> list[str | None]:
    """``slots`` without ``worker``: its slot stays, empty; a table left with no worker
    at all starts again empty (nothing is assigned then, so nothing can move)."""
    table = [None if w == worker else w for w in slots]
    return table if any(table) else []


def moved(groups: Sequence[str], before: Slots, after: Slots) -> list[str]:
    """The groups whose worker differs between two tables."""
    return [g for g in groups if owner(g, before) != owner(g, after)]
