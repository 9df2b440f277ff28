"""The store contract for ``fair_scope`` 'app' (issue 12 item 6): a group's cap binds its
dispatches in flight over every fair queue whose scope is 'app', once, not once per
queue; a slot coming back in one queue makes the group eligible again in another (woken,
refreshed at its promote); reclaims keep the app's count exact; scope 'queue' is
unchanged. Every store (memory, Redis, SQLite, PostgreSQL, MariaDB); Redis Cluster
refuses the scope (``limits.scope_unsupported``, ``tests/test_cluster.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import insert, select, update

from celery_fair.check import check
from celery_fair.envelope import BACKGROUND
from celery_fair.errors import InvalidLimit
from celery_fair.limits import APP_SCOPE, HARMONY, QUEUE_SCOPE, WFQ
from celery_fair.store.base import Placement, Policy, Store

from .backends import BACKENDS
from .store_helpers import (
    LEASE,
    NOW,
    Q,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
    value,
)

Q2 = "fairq2"
SCOPED = BACKENDS
scoped = pytest.mark.parametrize("any_store", SCOPED, indirect=True)


def configure(store: Store, scope: str = APP_SCOPE, caps: dict | None = None,
              name: str = WFQ, queues: tuple[str, ...] = (Q, Q2)) -> None:
    for q in queues:
        store.configure(q, Policy(None, 0, 1.0, caps if caps is not None else {"g": 2}, {},
                                  name=name, scope=scope))


def hold(store: Store, queue: str, group: str, n: int, due: int = 0) -> None:
    for i in range(n):
        hid = f"{queue}-{group}-{i}"
        store.hold(queue, hid, value(group, body=hid.encode(), task_id=hid),
                   Placement(group, BACKGROUND, 1, False), due, NOW)


def picked(store: Store, queue: str, n: int = 10, now: int = NOW) -> list[tuple[str, str]]:
    """(group, dispatch id) of each message picked."""
    return [(p.hold_id.split("-")[1], p.dispatch_id)
            for p in store.pick(queue, n, None, now, LEASE)]


@scoped
def test_a_cap_applies_once_across_the_app_scoped_queues(store: Store) -> None:
    configure(store)
    hold(store, Q, "g", 3)
    hold(store, Q2, "g", 3)
    first = picked(store, Q, 1)
    assert [g for g, _ in first] == ["g"]
    assert [g for g, _ in picked(store, Q2)] == ["g"]  # 2 in flight across both: the cap
    assert picked(store, Q) == [] and picked(store, Q2) == []
    figures = store.queue_figures(Q).inflight + store.queue_figures(Q2).inflight
    assert figures == 2


@scoped
def test_without_the_scope_the_cap_binds_each_queue_apart(store: Store) -> None:
    configure(store, scope=QUEUE_SCOPE)
    hold(store, Q, "g", 3)
    hold(store, Q2, "g", 3)
    assert [g for g, _ in picked(store, Q)] == ["g", "g"]
    assert [g for g, _ in picked(store, Q2)] == ["g", "g"]  # 4 at once: 2 per queue


@scoped
def test_a_release_in_one_queue_readmits_the_group_in_the_other(store: Store) -> None:
    configure(store)
    hold(store, Q, "g", 2)
    running = picked(store, Q)
    assert len(running) == 2
    hold(store, Q2, "g", 2)
    assert picked(store, Q2) == []  # at its cap app-wide
    store.wait([Q2], 0)  # what the holds woke
    assert store.release(Q, running[0][1])
    assert store.wait([Q2], 0) == {Q2}  # the release wakes Q2's dispatchers
    store.promote(Q2, NOW + 1, 100)  # which refreshes g there
    assert [g for g, _ in picked(store, Q2, now=NOW + 1)] == ["g"]
    assert picked(store, Q2, now=NOW + 1) == []  # 2 in flight again


@scoped
@pytest.mark.parametrize("cap_mode", ["hard", "soft"])
def test_a_group_freed_by_another_queue_is_not_a_finding_before_the_promote(
        store: Store, cap_mode: str) -> None:
    """A release in Q marks g for Q2's next promote (Q2's sets are Q2's to change): until
    then g is eligible in Q2 but not yet in its ready set, which check accepts."""
    for q in (Q, Q2):
        store.configure(q, Policy(None, 0, 1.0, {"g": 2}, {}, name=WFQ, scope=APP_SCOPE,
                                  cap_mode=cap_mode))
    hold(store, Q, "g", 2)
    running = picked(store, Q)
    hold(store, Q2, "g", 2)
    hold(store, Q2, "h", 1)
    # g at its cap app-wide (soft: over it, in the over set, while h waits)
    assert [g for g, _ in picked(store, Q2, 1)] == ["h"]
    assert store.release(Q, running[0][1])
    report = check(store, queues=[Q, Q2])
    assert report.ok, report.findings
    store.promote(Q2, NOW + 1, 100)
    assert check(store, queues=[Q, Q2]).ok


@scoped
def test_a_stale_ready_group_is_passed_over_not_picked(store: Store) -> None:
    """g ranked ready in Q2 first, then Q's picks take the app's whole cap: Q2's pick
    sees it and takes the next group."""
    configure(store)
    hold(store, Q2, "g", 2)
    hold(store, Q2, "h", 1)
    hold(store, Q, "g", 2)
    assert [g for g, _ in picked(store, Q)] == ["g", "g"]
    report = check(store, queues=[Q, Q2])  # g stale in Q2's ready set: not a finding
    assert report.ok, report.findings
    assert [g for g, _ in picked(store, Q2)] == ["h"]
    assert check(store, queues=[Q, Q2]).ok


@scoped
def test_a_pick_of_one_reaches_past_a_stale_head(store: Store) -> None:
    """A pick of one reads the ready set's first row, g, at its cap across the queues:
    the pick reads further and takes h (the SQL store read only `want` rows: a head
    passed over without a pick left the pick with none)."""
    configure(store)
    hold(store, Q2, "g", 1)
    hold(store, Q2, "h", 1)
    hold(store, Q, "g", 2)
    assert [g for g, _ in picked(store, Q)] == ["g", "g"]
    assert [g for g, _ in picked(store, Q2, 1)] == ["h"]


@scoped
def test_a_stale_ready_group_under_soft_caps_is_not_a_finding(store: Store) -> None:
    """Soft caps: g ranked ready in Q2, then Q's pick takes the app's cap. g stands over
    in Q2 now, while it is still in Q2's ready set, not its over set: the stale state,
    which Q2's next pick or refresh moves."""
    for q in (Q, Q2):
        store.configure(q, Policy(None, 0, 1.0, {"g": 1}, {}, name=WFQ, scope=APP_SCOPE,
                                  cap_mode="soft"))
    hold(store, Q2, "g", 1)
    hold(store, Q, "g", 1)
    assert [g for g, _ in picked(store, Q)] == ["g"]
    report = check(store, queues=[Q, Q2])
    assert report.ok, report.findings


@scoped
@pytest.mark.parametrize("policy", [WFQ, HARMONY])
def test_groups_share_the_queues_under_the_cap(store: Store, policy: str) -> None:
    configure(store, caps={"g": 1, "h": 1}, name=policy)
    hold(store, Q, "g", 3)
    hold(store, Q2, "g", 3)
    hold(store, Q2, "h", 3)
    assert [g for g, _ in picked(store, Q)] == ["g"]
    assert [g for g, _ in picked(store, Q2)] == ["h"]  # g's one slot is taken in Q


@scoped
def test_reclaims_keep_the_apps_count_exact(store: Store) -> None:
    configure(store)
    hold(store, Q, "g", 3)
    hold(store, Q2, "g", 3)
    running = picked(store, Q)  # picked, never confirmed: held again at the reclaim
    assert len(running) == 2
    assert store.reclaim(Q, NOW + LEASE + 1, 100)[0] == 2
    store.promote(Q2, NOW + LEASE + 1, 100)
    assert len(picked(store, Q2, now=NOW + LEASE + 2)) == 2  # the slots came back
    for _ in range(3):  # reclaims that find nothing more change nothing
        store.reclaim(Q, NOW + LEASE + 3, 100)
    assert picked(store, Q, now=NOW + LEASE + 3) == []  # never negative: still at 2


@scoped
def test_a_lost_dispatch_that_comes_back_counts_again(store: Store) -> None:
    configure(store, caps={"g": 1})
    hold(store, Q, "g", 1)
    hold(store, Q2, "g", 2)
    [(_, did)] = picked(store, Q)
    assert store.confirm(Q, [did], NOW + 100) == []
    # running: a worker has it
    store.begin_run(Q, did, NOW + 100, now_ms=NOW, run="r1", acks_late=False)
    store.reclaim(Q, NOW + 200, 100)  # its lease ran out: lost, the slot comes back
    store.promote(Q2, NOW + 200, 100)
    [(_, other)] = picked(store, Q2, now=NOW + 200)
    store.renew(Q, [did], NOW + 10_000)  # the worker was alive: it counts again
    assert store.release(Q2, other)
    store.promote(Q2, NOW + 300, 100)
    assert picked(store, Q2, now=NOW + 300) == []  # g's one slot is the lost one's
    assert store.release(Q, did)


@scoped
def test_leaving_the_app_scope_takes_the_queues_count_out(store: Store) -> None:
    configure(store)
    hold(store, Q, "g", 2)
    hold(store, Q2, "g", 3)
    [(_, did)] = picked(store, Q, 1)
    configure(store, scope=QUEUE_SCOPE, queues=(Q,))
    assert [g for g, _ in picked(store, Q2)] == ["g", "g"]  # Q's no longer counts
    assert store.release(Q, did)
    store.promote(Q2, NOW, 100)
    assert picked(store, Q2) == []  # and its release takes nothing off the app's


@pytest.mark.parametrize("any_store", SCOPED, indirect=True)
def test_a_bad_scope_is_refused(store: Store) -> None:
    with pytest.raises(InvalidLimit, match="scope must be one of 'queue', 'app'"):
        configure(store, scope="world")


@scoped
def test_resuming_a_group_that_is_not_paused_leaves_its_rank_as_it_is(store: Store) -> None:
    # Under harmony a group's rank counts its dispatches across the app-scoped queues, as
    # of its last refresh here. `resume` of a group that is not paused changes nothing
    # (False), on every store: it does not re-rank it with the other queues' counts
    # either (the SQL store did, and the model test's SQL scope leg caught it).
    configure(store, caps={}, name=HARMONY)
    hold(store, Q, "g", 1)
    hold(store, Q, "h", 1)  # both ranked here with nothing in flight: g, then h
    hold(store, Q2, "g", 2)
    assert [g for g, _ in picked(store, Q2)] == ["g", "g"]
    assert store.resume(Q, "g") is False
    assert [g for g, _ in picked(store, Q)] == ["g", "h"]


#: The backends with the wfq shares across queues (WIP: the memory store only; Redis and
#: SQL to follow, then every backend, and the model test's scope legs compare tags).
SHARING = BACKENDS


@pytest.mark.parametrize("any_store", SHARING, indirect=True)
def test_a_group_served_in_another_queue_waits_its_turn_here(store: Store) -> None:
    """wfq shares across the app-scoped queues: g, served 4 times in Q2, lets h (busy in
    Q only) take 4 turns in Q first; then they alternate."""
    configure(store, caps={})
    hold(store, Q, "g", 5)
    hold(store, Q, "h", 5)
    hold(store, Q2, "g", 4)
    assert [g for g, _ in picked(store, Q2)] == ["g"] * 4
    assert [g for g, _ in picked(store, Q, 6)] == ["h", "h", "h", "h", "g", "h"]
    assert check(store, queues=[Q, Q2]).ok


@pytest.mark.parametrize("any_store", SHARING, indirect=True)
def test_picks_of_one_let_a_group_served_elsewhere_wait_its_turn(store: Store) -> None:
    """As above, one message a pick: each pick's head g is behind and moves back past
    h, which the pick must then read (not only the first row of the set)."""
    configure(store, caps={})
    hold(store, Q, "g", 5)
    hold(store, Q, "h", 5)
    hold(store, Q2, "g", 4)
    assert [g for g, _ in picked(store, Q2)] == ["g"] * 4
    assert [g for _ in range(6) for g, _ in picked(store, Q, 1)] == ["h"] * 4 + ["g", "h"]


@pytest.mark.parametrize("any_store", SHARING, indirect=True)
def test_without_the_scope_each_queue_shares_apart(store: Store) -> None:
    configure(store, scope=QUEUE_SCOPE, caps={})
    hold(store, Q, "g", 5)
    hold(store, Q, "h", 5)
    hold(store, Q2, "g", 4)
    assert [g for g, _ in picked(store, Q2)] == ["g"] * 4
    assert [g for g, _ in picked(store, Q, 6)] == ["g", "h"] * 3


@pytest.mark.parametrize("any_store", SHARING, indirect=True)
def test_a_queue_entering_the_scope_owes_nothing_from_before(store: Store) -> None:
    """g, served 4 times in Q2 while Q was at scope 'queue', is not charged for them
    when Q enters 'app': they alternate (a group entering a set likewise)."""
    configure(store, scope=QUEUE_SCOPE, caps={}, queues=(Q,))
    configure(store, caps={}, queues=(Q2,))
    hold(store, Q, "g", 5)
    hold(store, Q, "h", 5)
    hold(store, Q2, "g", 4)
    assert [g for g, _ in picked(store, Q2)] == ["g"] * 4
    configure(store, caps={}, queues=(Q,))
    assert [g for g, _ in picked(store, Q, 6)] == ["g", "h"] * 3


@pytest.mark.parametrize("any_store", SHARING, indirect=True)
def test_a_group_no_app_scoped_queue_knows_leaves_no_charge_behind(store: Store) -> None:
    configure(store, caps={})
    hold(store, Q, "g", 1)
    hold(store, Q2, "g", 1)
    (_, did), = picked(store, Q)
    (_, did2), = picked(store, Q2)
    assert charges(store) == {("b", "g"): 2.0}
    assert store.release(Q, did)
    assert charges(store) == {("b", "g"): 2.0}  # Q2 still knows g
    assert store.release(Q2, did2)
    assert charges(store) == {}


def charges(store: Store) -> dict[tuple[str, str], float]:
    """The app's charge totals ((class, group) -> total) as the store keeps them."""
    if hasattr(store, "engine"):
        c = store.t.scope_charge.c
        with store.engine.connect() as conn:
            return {(k, g): float(t) for k, g, t in conn.execute(select(
                c.klass, c.grp, c.total).where(c.ns == store.namespace))}
    if hasattr(store, "client"):
        return {tuple(f.decode().split(":", 1)): float(t) for f, t in  # type: ignore[misc]
                store.client.hgetall(f"{store.namespace}:scope:charge").items()}
    return dict(store._scope_charge)  # type: ignore[attr-defined]


@pytest.mark.parametrize("any_store", SHARING, indirect=True)
def test_a_queue_leaving_the_scope_leaves_no_charge_behind(store: Store) -> None:
    configure(store, caps={})
    hold(store, Q, "g", 2)
    assert len(picked(store, Q, 1)) == 1
    assert charges(store) == {("b", "g"): 1.0}
    configure(store, scope=QUEUE_SCOPE, caps={}, queues=(Q,))
    assert charges(store) == {}  # Q2, still app-scoped, does not know g
    assert check(store, queues=[Q, Q2]).ok


REPAIRS = [b for b in BACKENDS if b != "memory"]  # the memory store's never drift


@pytest.mark.parametrize("any_store", REPAIRS, indirect=True)
def test_the_check_sets_a_drifted_app_count_to_the_queues_sum(store: Store) -> None:
    configure(store)
    hold(store, Q, "g", 2)
    hold(store, Q2, "g", 1)
    assert len(picked(store, Q, 1)) == 1 and len(picked(store, Q2, 1)) == 1
    set_app_count(store, "g", 5)  # a hand edit, a bug: g would stay capped for ever
    report = check(store, queues=[Q, Q2])
    (found,) = report.findings
    assert (found.queue, found.kind, found.subject) == ("", "scope_count", "g")
    assert "counts 5" in found.detail and "hold 2" in found.detail, found.detail
    assert str(found).startswith("app scope: scope_count g:")
    repaired = check(store, queues=[Q, Q2], repair=True)
    assert [f.action for f in repaired.findings if f.kind == "scope_count"] == ["set to 2"]
    assert check(store, queues=[Q, Q2]).ok
    assert [g for g, _ in picked(store, Q)] == []  # at its cap of 2 again, across both


@pytest.mark.parametrize("any_store", REPAIRS, indirect=True)
def test_the_check_deletes_a_charge_no_app_scoped_queue_needs(store: Store) -> None:
    configure(store, caps={})
    set_charge(store, "zz", 3.0)
    (found,) = check(store, queues=[Q, Q2]).findings
    assert (found.kind, found.subject, found.action) == ("scope_charge", "zz", "")
    (fixed,) = check(store, queues=[Q, Q2], repair=True).findings
    assert fixed.action == "deleted" and charges(store) == {}


def test_the_memory_store_reports_a_drifted_app_count() -> None:
    from celery_fair.testing import MemoryStore

    store = MemoryStore()
    configure(store)
    hold(store, Q, "g", 1)
    assert len(picked(store, Q)) == 1
    store._scope_n["g"] = 3  # type: ignore[attr-defined]
    assert [f.kind for f in check(store, queues=[Q, Q2]).findings] == ["scope_count"]


def set_app_count(store: Store, g: str, n: int) -> None:
    s: Any = store
    if hasattr(s, "engine"):
        c = s.t.scope_n.c
        with s.engine.begin() as conn:
            conn.execute(update(s.t.scope_n).where(c.ns == s.namespace, c.grp == g)
                         .values(n=n))
    else:
        s.client.hset(f"{s.namespace}:scope:n", g, n)


def set_charge(store: Store, g: str, total: float) -> None:
    s: Any = store
    if hasattr(s, "engine"):
        with s.engine.begin() as conn:
            conn.execute(insert(s.t.scope_charge).values(ns=s.namespace, klass="b", grp=g,
                                                         total=total))
    else:
        s.client.hset(f"{s.namespace}:scope:charge", f"b:{g}", total)
