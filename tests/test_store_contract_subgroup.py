"""The store contract for ``fair_subgroup = "path"`` (two-level fairness): groups go as
the policy says; inside a group (and class) the subgroups take turns by self-clocked fair
queueing (a hold's key: the later of the list's virtual time and its subgroup's last
key, plus cost / the subgroup's weight, weights keyed "<group>/<subgroup>"), so a
subgroup that arrives behind another's flood is served interleaved with it. Front holds
still go first; delayed holds take their key when due; a change of the setting keeps
the lists. Every backend (memory, Redis, SQLite, PostgreSQL, MariaDB)."""

from __future__ import annotations

from collections import Counter

import pytest

from celery_fair.envelope import BACKGROUND, Envelope
from celery_fair.errors import InvalidGroup, InvalidLimit
from celery_fair.store.base import Placement, Policy, Store
from celery_fair.store.models import SMALLEST, WFQ

from .backends import BACKENDS
from .store_helpers import (  # noqa: F401  (the fixture ``store``: any_store)
    NOW,
    Q,
    each_policy,
    group_of,
    pick,
    store_fixture,
)

with_subgroups = pytest.mark.parametrize("any_store", BACKENDS, indirect=True)


def subgroups(store: Store, name: str = WFQ, weights: dict | None = None,
              subgroup: str = "path", cap: int | None = None) -> None:
    store.configure(Q, Policy(cap, 0, 1.0, {}, weights or {}, name=name,
                              subgroup=subgroup))


def value(group: str, sub: str | None, hold_id: str, cost: float, front: bool) -> bytes:
    envelope = Envelope(body=hold_id.encode(), content_type="application/json",
                        content_encoding="utf-8", headers={"id": hold_id, "task": "t"},
                        exchange="", routing_key=Q, queue=Q, due_at=NOW / 1000,
                        subgroup=sub)
    return envelope.encode(group, BACKGROUND, cost, front)


def hold(store: Store, hold_id: str, sub: str | None, group: str = "acme", cost: float = 1,
         front: bool = False, due: int = 0, at: int = NOW, max_held: int | None = None) -> str:
    data = value(group, sub, hold_id, cost, front)
    where = Placement(group, BACKGROUND, cost, front, max_held, subgroup=sub)
    return store.hold(Q, hold_id, data, where, due, at)


def flood(store: Store, n: int) -> None:
    """Two-level fairness configured, and alice's ``n`` tasks a0, a1... held."""
    subgroups(store)
    for k in range(n):
        hold(store, f"a{k}", "alice")


def picked(store: Store, n: int, now: int = NOW) -> list[str]:
    got: list[str] = []
    while len(got) < n:
        batch = pick(store, min(5, n - len(got)), now=now)
        assert batch, f"nothing picked after {got}"
        got.extend(p.hold_id for p in batch)
    return got


@each_policy
def test_a_subgroup_behind_a_flood_is_served_interleaved(store: Store, policy: str) -> None:
    subgroups(store, policy)
    for k in range(30):
        hold(store, f"a{k:02}", "alice")
    first = picked(store, 4)  # alice's flood runs alone meanwhile
    for k in range(5):
        hold(store, f"b{k}", "bob")
    order = first + picked(store, 31)
    assert first == ["a00", "a01", "a02", "a03"]
    # bob's 5 alternate with alice's next ones: all picked within the next 10
    assert {h for h in order[4:14] if h.startswith("b")} == {f"b{k}" for k in range(5)}
    assert [h for h in order if h.startswith("a")] == [f"a{k:02}" for k in range(30)]
    assert [h for h in order if h.startswith("b")] == [f"b{k}" for k in range(5)]


@with_subgroups
def test_without_the_setting_a_group_is_first_come_first_served(store: Store) -> None:
    subgroups(store, subgroup="none")
    for k in range(6):
        hold(store, f"a{k}", "alice")
    hold(store, "b0", "bob")
    assert picked(store, 7) == [f"a{k}" for k in range(6)] + ["b0"]


@with_subgroups
@pytest.mark.parametrize("how", ["settings", "limit"])
def test_subgroup_weights_are_keyed_by_the_path(store: Store, how: str) -> None:
    """fair_group_weights {"acme/alice": 3}, or ``fair limit acme/alice --weight 3``."""
    subgroups(store, weights={"acme/alice": 3} if how == "settings" else {})
    if how == "limit":
        store.limit(Q, "acme/alice", weight=3.0)
    for k in range(12):
        hold(store, f"a{k:02}", "alice")
        hold(store, f"b{k:02}", "bob")
    first = picked(store, 8)
    shares = Counter(h[0] for h in first)
    assert shares == {"a": 6, "b": 2}, first  # 3 : 1


@with_subgroups
def test_groups_still_share_first_then_subgroups(store: Store) -> None:
    subgroups(store)
    for k in range(10):
        hold(store, f"a{k}", "alice")
    for k in range(5):
        hold(store, f"b{k}", "bob")
    for k in range(6):
        hold(store, f"o{k}", None, group="other")
    got = pick(store, 12)
    groups = Counter(group_of(p) for p in got)
    assert groups == {"acme": 6, "other": 6}  # the group level: equal shares
    inside = [p.hold_id for p in got if group_of(p) == "acme"]
    assert inside == ["a0", "b0", "a1", "b1", "a2", "b2"]


@with_subgroups
def test_a_hold_under_backpressure_keeps_its_subgroup(store: Store) -> None:
    """fair_group_max_held set: the SQL store's hold under it once dropped the subgroup
    (bob's weight 0.5 then went unused: b0, b1 got keys 1, 2 instead of 2, 4)."""
    subgroups(store, weights={"acme/bob": 0.5})
    for k in range(3):
        hold(store, f"a{k}", "alice", max_held=10)
    hold(store, "b0", "bob", max_held=10)
    hold(store, "b1", "bob", max_held=10)
    assert picked(store, 5) == ["a0", "a1", "b0", "a2", "b1"]


@with_subgroups
def test_a_message_without_a_subgroup_is_a_subgroup_of_its_own(store: Store) -> None:
    flood(store, 4)
    hold(store, "n0", None)
    hold(store, "n1", None)
    assert picked(store, 6) == ["a0", "n0", "a1", "n1", "a2", "a3"]


@with_subgroups
def test_front_holds_go_first_and_delayed_ones_take_their_key_when_due(store: Store) -> None:
    flood(store, 4)
    hold(store, "late", "bob", due=NOW + 5_000)
    hold(store, "retry", "alice", front=True)
    assert picked(store, 2) == ["retry", "a0"]
    assert store.promote(Q, NOW + 6_000, 10)[0] == 1
    # late's key: the virtual time (a0's, 1) + 1, as a1's: a tie, by hold id
    assert picked(store, 4, now=NOW + 6_000) == ["a1", "late", "a2", "a3"]


@with_subgroups
def test_a_list_that_empties_starts_afresh(store: Store) -> None:
    """Alice's flood, cancelled before it ran, is not held against her later: with the
    keys kept, her next task would go after bob's two (key 6 against 3 and 4)."""
    flood(store, 5)
    assert picked(store, 2) == ["a0", "a1"]
    assert len(store.cancel(Q, ["a2", "a3", "a4"])) == 3
    hold(store, "b0", "bob")
    hold(store, "a5", "alice")
    hold(store, "b1", "bob")
    assert picked(store, 3) == ["a5", "b0", "b1"]


@with_subgroups
def test_a_change_of_the_setting_keeps_what_is_held(store: Store) -> None:
    flood(store, 3)
    hold(store, "b0", "bob")
    subgroups(store, subgroup="none")
    hold(store, "b1", "bob")
    subgroups(store)
    hold(store, "b2", "bob")
    assert picked(store, 6) == ["a0", "b0", "a1", "a2", "b1", "b2"]


@with_subgroups
def test_cancel_of_a_subgroup_task_keeps_the_order(store: Store) -> None:
    flood(store, 3)
    hold(store, "b0", "bob")
    hold(store, "b1", "bob")
    assert [h for h, _ in store.cancel(Q, ["b0"])] == ["b0"]
    assert picked(store, 4) == ["a0", "a1", "b1", "a2"]


@with_subgroups
def test_a_bad_setting_or_subgroup_is_refused_before_anything_is_written(store: Store) -> None:
    with pytest.raises(InvalidLimit, match="subgroup must be one of 'none', 'path'"):
        subgroups(store, subgroup="tree")
    with pytest.raises(InvalidLimit, match="smallest"):
        subgroups(store, name=SMALLEST)
    data = value("acme", None, "x", 1, False)
    with pytest.raises(InvalidGroup, match="hold x: subgroup"):
        store.hold(Q, "x", data, Placement("acme", BACKGROUND, 1, False, None, subgroup=""), 0, NOW)
    assert pick(store, 5) == []
