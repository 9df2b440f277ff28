"""The store contract for caps per subgroup (``fair_subgroup = "path"``, a cap keyed
"<group>/<subgroup>"): a capped subgroup never has more of its tasks in flight than its
cap while the group's other subgroups go on; a group whose held work is all in
capped-out subgroups is passed over until a release (or a reclaim, a raised cap, a
change of settings) gives one room; the group's own cap still binds its total. Every
backend (``CAPPED``: SQL since revision 0017)."""

from __future__ import annotations

import pytest

from celery_fair.errors import GroupFull
from celery_fair.store.base import Policy, Store
from celery_fair.store.models import HARMONY, WFQ

from .store_helpers import (  # noqa: F401  (the fixture ``store``: any_store)
    LEASE,
    NOW,
    Q,
    pick,
    store_fixture,
)
from .subgroup_caps import CAPPED
from .test_store_contract_subgroup import hold

with_caps = pytest.mark.parametrize("any_store", CAPPED, indirect=True)
each_policy = pytest.mark.parametrize(
    "any_store, policy", [(b, p) for p in (WFQ, HARMONY) for b in CAPPED],
    indirect=["any_store"])


def capped(store: Store, caps: dict[str, int], policy: str = WFQ,
           cap_mode: str = "hard") -> None:
    store.configure(Q, Policy(None, 0, 1.0, caps, {}, name=policy, subgroup="path",
                              cap_mode=cap_mode))


def picked_ids(store: Store, n: int = 50, now: int = NOW) -> list[str]:
    return [p.hold_id for p in pick(store, n, now=now)]


def dispatches(store: Store, n: int = 50, now: int = NOW) -> dict[str, str]:
    """hold id -> dispatch id of what one pick of ``n`` takes."""
    return {p.hold_id: p.dispatch_id for p in pick(store, n, now=now)}


def no_problems(store: Store, now: int = NOW) -> None:
    assert store.check(Q, False, now, LEASE) == []


def alice_at_her_cap(store: Store, n: int) -> dict[str, str]:
    """alice capped at 1 and her ``n`` tasks held: a0 dispatched (its dispatch id)."""
    capped(store, {"acme/alice": 1})
    for k in range(n):
        hold(store, f"a{k}", "alice")
    got = dispatches(store)
    assert list(got) == ["a0"]
    return got


@each_policy
def test_a_capped_subgroup_never_exceeds_its_cap_while_others_proceed(
        store: Store, policy: str) -> None:
    capped(store, {"acme/alice": 1}, policy)
    for k in range(4):
        hold(store, f"a{k}", "alice")
    for k in range(3):
        hold(store, f"b{k}", "bob")
    first = dispatches(store)
    assert sorted(first) == ["a0", "b0", "b1", "b2"]  # one of alice's, all of bob's
    assert picked_ids(store) == []
    no_problems(store)
    for k in range(1, 4):  # each release of alice's lets exactly her next one go
        assert store.release(Q, first.pop(f"a{k - 1}"), now_ms=NOW)
        first.update(dispatches(store))
        assert [h for h in first if h.startswith("a")] == [f"a{k}"]
    no_problems(store)


@with_caps
def test_a_runtime_limit_caps_a_subgroup_and_raising_it_lets_its_work_go(
        store: Store) -> None:
    capped(store, {})
    assert store.limit(Q, "acme/alice", cap=2)[0] == 2
    for k in range(5):
        hold(store, f"a{k}", "alice")
    assert picked_ids(store) == ["a0", "a1"]
    assert store.limit(Q, "acme/alice", cap=3)[0] == 3
    assert picked_ids(store) == ["a2"]
    store.limit(Q, "acme/alice", cap="reset")  # no cap: the rest goes
    assert picked_ids(store) == ["a3", "a4"]
    no_problems(store)


@with_caps
def test_a_group_with_only_capped_out_work_is_passed_over_and_comes_back_at_a_release(
        store: Store) -> None:
    capped(store, {"acme/alice": 1})
    for k in range(3):
        hold(store, f"a{k}", "alice")
    for k in range(3):
        hold(store, f"z{k}", None, group="zeta")
    got = dispatches(store, 2)
    assert sorted(got) == ["a0", "z0"]
    assert picked_ids(store, 10) == ["z1", "z2"]  # acme is passed over, not picked
    assert picked_ids(store) == []
    assert store.release(Q, got["a0"], now_ms=NOW)
    assert picked_ids(store) == ["a1"]
    no_problems(store)


@with_caps
def test_parked_work_is_held_cancellable_and_checked(store: Store) -> None:
    got = alice_at_her_cap(store, 4)
    figures = store.group_figures(Q, ["acme"])[0]
    assert figures.held_background == 3 and figures.inflight == 1
    # listed where the held work is read (fair peek), after the group's list
    assert [m.hold_id for m in store.held_messages(Q, "acme", 10)] == ["a1", "a2", "a3"]
    no_problems(store)
    assert [h for h, _ in store.cancel(Q, ["a2"])] == ["a2"]
    assert store.group_figures(Q, ["acme"])[0].held_background == 2
    no_problems(store)
    assert store.release(Q, got["a0"], now_ms=NOW)
    assert picked_ids(store) == ["a1"]
    no_problems(store)


@with_caps
def test_parked_work_counts_toward_a_groups_held_limit(store: Store) -> None:
    # fair_group_max_held counts what a group holds: work parked behind a capped-out
    # subgroup is held all the same (Redis counted only the class lists and delayed)
    alice_at_her_cap(store, 4)  # a1, a2, a3 parked by the pick
    with pytest.raises(GroupFull) as full:
        hold(store, "b0", "bob", max_held=3)
    assert (full.value.count, full.value.limit) == (3, 3)
    assert hold(store, "b0", "bob", max_held=4) == "b0"


@pytest.mark.parametrize("any_store, off", [(b, o) for o in ("cap", "path") for b in CAPPED],
                         indirect=["any_store"])
def test_a_configure_without_the_cap_lets_parked_work_go(store: Store, off: str) -> None:
    capped(store, {"acme/alice": 1})
    for k in range(3):
        hold(store, f"a{k}", "alice")
    assert picked_ids(store) == ["a0"]
    if off == "cap":
        capped(store, {})
    else:
        store.configure(Q, Policy(None, 0, 1.0, {"acme/alice": 1}, {}, name=WFQ,
                                  subgroup="none"))
    assert picked_ids(store) == ["a1", "a2"]
    no_problems(store)


@with_caps
def test_a_reclaim_of_a_subgroups_dispatch_frees_its_slot(store: Store) -> None:
    got = alice_at_her_cap(store, 3)
    # a worker runs it and dies: its lease runs out, the slot is lost with it
    store.begin_run(Q, got["a0"], NOW + LEASE, now_ms=NOW, run="r", acks_late=False)
    assert store.reclaim(Q, NOW + LEASE + 1, 10) == (0, 1)
    assert picked_ids(store, now=NOW + LEASE + 1) == ["a1"]
    # a dispatch no worker took is held again, first, and takes the slot back
    later = NOW + 3 * LEASE
    assert store.reclaim(Q, later, 10) == (1, 0)
    assert picked_ids(store, now=later) == ["a1"]
    assert picked_ids(store, now=later) == []
    no_problems(store, later)


@with_caps
def test_the_groups_cap_still_binds_its_total(store: Store) -> None:
    capped(store, {"acme": 2, "acme/alice": 1})
    for k in range(3):
        hold(store, f"a{k}", "alice")
        hold(store, f"b{k}", "bob")
    got = dispatches(store)
    assert sorted(got) == ["a0", "b0"]
    assert store.release(Q, got["b0"], now_ms=NOW)
    assert picked_ids(store) == ["b1"]  # room in acme, none in alice
    no_problems(store)


@with_caps
def test_subgroup_caps_are_hard_under_soft_caps(store: Store) -> None:
    capped(store, {"acme/alice": 1}, cap_mode="soft")
    for k in range(3):
        hold(store, f"a{k}", "alice")
    assert picked_ids(store) == ["a0"]
    no_problems(store)
