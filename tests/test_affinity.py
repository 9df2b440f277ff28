"""Group → worker assignment (``celery_fair.affinity``): jump consistent hash over slots
taken in join order, measured over 10,000 groups. Pure functions: no store, no worker."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from celery_fair.affinity import group_key, join, jump, leave, moved, owner

GROUPS = [f"tenant-{i}" for i in range(10_000)]


def workers(n: int) -> list[str | None]:
    table: list[str | None] = []
    for i in range(n):
        table = join(table, f"w{i}")
    return table


@pytest.mark.parametrize(("key", "buckets", "bucket"), [
    # The published reference vectors of Lamping and Veach's function.
    (1, 1, 0), (42, 57, 43), (0xDEAD10CC, 1, 0), (0xDEAD10CC, 666, 361), (256, 1024, 520),
    (1, 128, 55), (129, 128, 120), (128, 100_000_000, 38_172_097)])
def test_jump_gives_the_reference_buckets(key: int, buckets: int, bucket: int) -> None:
    assert jump(key, buckets) == bucket


def test_jump_refuses_no_buckets() -> None:
    with pytest.raises(ValueError, match="buckets=0: expected at least 1"):
        jump(1, 0)


def test_a_groups_key_is_the_same_in_every_process() -> None:
    """Not Python's hash(), which each process salts: dispatchers must agree."""
    code = "from celery_fair.affinity import group_key; print(group_key('acme'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env=dict(os.environ, PYTHONHASHSEED="12345"))
    assert int(other.stdout) == group_key("acme")
    assert group_key("acme") != group_key("acme", probe=1)


def test_a_joining_worker_takes_its_share_and_nothing_else_moves() -> None:
    """For n = 1..20 workers: the (n+1)-th moves 1/(n+1) of the groups (within 5
    percentage points), all of them to itself. Prints the table."""
    rows = []
    for n in range(1, 21):
        before = workers(n)
        after = join(before, "new")
        changed = moved(GROUPS, before, after)
        assert {owner(g, after) for g in changed} == {"new"}, n
        rows.append((n, len(changed) / len(GROUPS), 1 / (n + 1)))
    print("\n".join(f"{n:>2} -> {n + 1:>2}: moved {got:.4f}, ideal {ideal:.4f}"
                     for n, got, ideal in rows))
    assert all(abs(got - ideal) <= 0.05 for _, got, ideal in rows), rows


@pytest.mark.parametrize("n", [2, 5, 20])
def test_each_worker_gets_about_an_equal_share(n: int) -> None:
    shares = Counter(owner(g, workers(n)) for g in GROUPS)
    assert set(shares) == {f"w{i}" for i in range(n)}
    assert max(shares.values()) / min(shares.values()) < 1.5, shares


@pytest.mark.parametrize("gone", ["w0", "w4", "w9"])
def test_a_leaving_worker_moves_only_its_groups_and_spreads_them(gone: str) -> None:
    before = workers(10)
    after = leave(before, gone)
    changed = moved(GROUPS, before, after)
    assert sorted(changed) == sorted(g for g in GROUPS if owner(g, before) == gone)
    spread = Counter(owner(g, after) for g in changed)
    assert gone not in spread and len(spread) == 9, spread


def test_a_replacement_takes_exactly_the_groups_of_the_worker_it_replaced() -> None:
    """A rolling restart: a worker leaves, a new one joins into its empty slot."""
    before = workers(10)
    after = join(leave(before, "w3"), "w3-new")
    assert after.index("w3-new") == before.index("w3")
    assert {g: owner(g, after) for g in GROUPS} == {
        g: "w3-new" if owner(g, before) == "w3" else owner(g, before) for g in GROUPS}


def test_joining_into_an_empty_slot_moves_groups_only_to_the_newcomer() -> None:
    before = leave(leave(workers(10), "w2"), "w6")
    after = join(before, "new")
    changed = moved(GROUPS, before, after)
    assert changed and {owner(g, after) for g in changed} == {"new"}


def test_joining_twice_changes_nothing_and_no_worker_owns_nothing() -> None:
    table = workers(3)
    assert join(table, "w1") == table
    assert owner("acme", []) is None
    assert leave(["w0"], "w0") == []  # the last one gone: the table starts again
    assert owner("acme", [None, "w1", None]) == "w1"
