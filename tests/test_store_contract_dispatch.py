"""The store contract on every backend (``any_store``; see tests/store_helpers.py):
release, confirm, begin, renew and reclaim: the dispatch state machine."""

from __future__ import annotations

import threading

import pytest

from celery_fair.envelope import Envelope
from celery_fair.store.base import BeginAnswer, BeginResult, Store

from .store_helpers import (
    NOW,
    Q,
    _running,
    configure,
    hold,
    pick,
    snapshot_groups,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
)


def test_release_is_idempotent_and_frees_the_slot(store: Store) -> None:
    configure(store, cap=1)
    for _ in range(3):
        hold(store, "a")
    [first] = pick(store, 10)
    assert pick(store, 10) == []
    assert store.release(Q, first.dispatch_id) is True
    assert store.release(Q, first.dispatch_id) is False
    assert store.release(Q, first.dispatch_id) is False
    assert store.release(Q, "never-dispatched") is False
    assert store.snapshot(Q)["inflight"] == 0
    assert snapshot_groups(store)["a"]["inflight"] == 0
    [second] = pick(store, 10)  # capped group is pickable again: exactly one slot
    assert pick(store, 10) == []
    assert store.release(Q, second.dispatch_id) is True
    assert store.snapshot(Q)["inflight"] == 0

def test_confirm_returns_stale_ids_for_superseded_dispatches(store: Store) -> None:
    for _ in range(3):
        hold(store, "a")
    picked = pick(store, 3, lease=1_000)
    # the dispatcher stalls past the picked lease; another dispatcher reclaims
    assert store.reclaim(Q, NOW + 1_001, 100) == (3, 0)
    stale = store.confirm(Q, [p.dispatch_id for p in picked], NOW + 30_000)
    assert sorted(stale) == sorted(p.dispatch_id for p in picked)
    for p in picked:
        assert store.begin(Q, p.dispatch_id, NOW + 30_000) is BeginResult.SKIP

def test_confirm_mixed_current_and_stale(store: Store) -> None:
    hold(store, "a")
    [old] = pick(store, 1, lease=1_000)
    hold(store, "b")
    [cur] = pick(store, 1, now=NOW + 900, lease=1_000)
    assert store.reclaim(Q, NOW + 1_000, 100) == (1, 0)  # only old's lease ran out
    assert store.confirm(Q, [old.dispatch_id, cur.dispatch_id], NOW + 30_000) \
        == [old.dispatch_id]
    assert store.begin(Q, cur.dispatch_id, NOW + 30_000) is BeginResult.RUN

def test_begin_before_confirm(store: Store) -> None:
    """The worker may see the message before the dispatcher confirms it."""
    hold(store, "a")
    [p] = pick(store, 1, lease=1_000)
    assert store.begin(Q, p.dispatch_id, NOW + 30_000) is BeginResult.RUN
    assert store.confirm(Q, [p.dispatch_id], NOW + 30_000) == []
    # begin's long lease stands: the short picked lease no longer applies
    assert store.reclaim(Q, NOW + 1_001, 100) == (0, 0)

def test_renew_extends_leases(store: Store) -> None:
    for _ in range(3):
        hold(store, "a")
    a, b, c = pick(store, 3)
    assert store.confirm(Q, [a.dispatch_id, b.dispatch_id, c.dispatch_id], NOW + 1_000) == []
    assert store.begin(Q, b.dispatch_id, NOW + 1_000) is BeginResult.RUN
    assert store.renew(Q, [a.dispatch_id, b.dispatch_id, "unknown"], NOW + 5_000) == 2
    assert store.renew(Q, [], NOW + 5_000) == 0
    # only c (not renewed) expires at the old deadline; no worker ever reported it, so
    # it is held again rather than left to the broker
    assert store.reclaim(Q, NOW + 2_000, 100) == (1, 0)
    assert store.reclaim(Q, NOW + 4_999, 100) == (0, 0)
    assert store.snapshot(Q)["inflight"] == 2
    # then the worker dies: a (received, never begun) is held again from its bytes; b
    # (begun, acks early: no bytes kept) is left to the broker
    assert store.reclaim(Q, NOW + 5_000, 100) == (1, 1)
    assert store.snapshot(Q)["inflight"] == 0

def test_renew_of_superseded_dispatch_does_not_count(store: Store) -> None:
    hold(store, "a")
    [p] = pick(store, 1, lease=1_000)
    assert store.reclaim(Q, NOW + 1_000, 10) == (1, 0)
    assert store.renew(Q, [p.dispatch_id], NOW + 50_000) == 0
    assert store.begin(Q, p.dispatch_id, NOW + 50_000) is BeginResult.SKIP

def test_reclaim_picked_puts_message_back_at_front(store: Store) -> None:
    ids = [hold(store, "a", hold_id=f"m{i}") for i in range(3)]
    [p] = pick(store, 1, lease=1_000)
    assert p.hold_id == "m0"
    assert store.reclaim(Q, NOW + 999, 100) == (0, 0)  # lease not yet run out
    assert store.reclaim(Q, NOW + 1_000, 100) == (1, 0)
    assert store.reclaim(Q, NOW + 1_000, 100) == (0, 0)  # done once
    assert store.snapshot(Q)["inflight"] == 0
    assert snapshot_groups(store)["a"]["held_background"] == 3
    # the dispatcher that picked it died before publishing: a copy that did reach the
    # broker after all is skipped...
    assert store.begin(Q, p.dispatch_id, NOW + 30_000) is BeginResult.SKIP
    assert store.release(Q, p.dispatch_id) is False
    # ...and the message is dispatched again, first in its group, byte for byte
    again = pick(store, 10, now=NOW + 1_000)
    assert [x.hold_id for x in again] == ids
    assert again[0].value == p.value
    assert again[0].dispatch_id != p.dispatch_id
    assert store.begin(Q, again[0].dispatch_id, NOW + 30_000) is BeginResult.RUN
    assert store.snapshot(Q)["inflight"] == 3

def test_reclaim_picked_reenters_ahead_of_other_groups_fairly(store: Store) -> None:
    configure(store, cap=1)
    hold(store, "a", hold_id="a0")
    hold(store, "a", hold_id="a1")
    [p] = pick(store, 1, lease=1_000)
    assert p.hold_id == "a0"
    assert pick(store, 10) == []  # capped
    assert store.reclaim(Q, NOW + 5_000, 100) == (1, 0)
    [q] = pick(store, 10, now=NOW + 5_000)
    assert q.hold_id == "a0"

def test_reclaim_picked_when_hold_id_taken_meanwhile(store: Store) -> None:
    hold(store, "a", hold_id="x", body=b"original")
    [p] = pick(store, 1, lease=1_000)
    hold(store, "a", hold_id="x", body=b"newer")  # same task id held again meanwhile
    assert store.reclaim(Q, NOW + 1_000, 100) == (1, 0)
    got = pick(store, 10, now=NOW + 1_000)
    bodies = [Envelope.decode(g.value)[2].body for g in got]
    assert bodies == [b"original", b"newer"]
    assert len({g.hold_id for g in got}) == 2

def test_reclaim_lost_frees_slot_and_begin_reacquires(store: Store) -> None:
    configure(store, cap=1)
    for _ in range(3):
        hold(store, "a")
    [p] = pick(store, 1)
    assert store.confirm(Q, [p.dispatch_id], NOW + 30_000) == []
    # a worker started it (acks early: the record keeps no bytes)
    assert store.begin(Q, p.dispatch_id, NOW + 30_000) is BeginResult.RUN
    assert pick(store, 10) == []  # capped
    assert store.reclaim(Q, NOW + 29_999, 100) == (0, 0)
    # the worker died: the slot comes back, the message stays with the broker
    assert store.reclaim(Q, NOW + 30_000, 100) == (0, 1)
    assert store.snapshot(Q)["inflight"] == 0
    assert snapshot_groups(store)["a"]["held_background"] == 2  # not held again
    [q] = pick(store, 10, now=NOW + 30_000)
    assert q.hold_id != p.hold_id
    assert store.snapshot(Q)["inflight"] == 1
    # the broker redelivers the lost message: it runs and takes a slot again
    assert store.begin(Q, p.dispatch_id, NOW + 60_000) is BeginResult.RUN_REACQUIRED
    assert store.snapshot(Q)["inflight"] == 2
    assert store.begin(Q, p.dispatch_id, NOW + 60_000) is BeginResult.RUN  # now current
    assert store.snapshot(Q)["inflight"] == 2
    assert store.release(Q, p.dispatch_id) is True
    assert store.release(Q, q.dispatch_id) is True
    assert store.release(Q, p.dispatch_id) is False
    assert store.snapshot(Q)["inflight"] == 0
    [r] = pick(store, 10, now=NOW + 60_000)
    assert store.release(Q, r.dispatch_id)
    assert snapshot_groups(store) == {}

def test_received_not_begun_is_held_again_when_its_worker_dies(store: Store) -> None:
    """A worker received it (its lease keeper renewed it) and died before running it: the
    record still has the bytes, so it is held again; the broker's copy is skipped."""
    hold(store, "a", hold_id="x", body=b"payload")
    [p] = pick(store, 1)
    assert store.confirm(Q, [p.dispatch_id], NOW + 1_000) == []
    assert store.renew(Q, [p.dispatch_id], NOW + 30_000) == 1
    assert store.reclaim(Q, NOW + 29_999, 100) == (0, 0)
    assert store.reclaim(Q, NOW + 30_000, 100) == (1, 0)
    assert store.begin(Q, p.dispatch_id, NOW + 60_000) is BeginResult.SKIP
    [again] = pick(store, 10, now=NOW + 30_000)
    assert (again.hold_id, again.value) == ("x", p.value)

def test_copy_of_a_live_acks_late_run_is_skipped(store: Store) -> None:
    """The broker redelivered a message whose run goes on (its ack died with a
    connection): the copy is skipped, takes no slot, changes nothing."""
    p = _running(store, acks_late=True)
    assert store.begin(Q, p.dispatch_id, NOW + 31_000, now_ms=NOW + 1_000, run="copy",
                       acks_late=True) is BeginResult.SKIP
    assert store.snapshot(Q)["inflight"] == 1
    assert store.queue_figures(Q).skipped == 1
    # the first run goes on and ends; a later copy finds the tombstone
    assert store.renew(Q, [p.dispatch_id], NOW + 40_000) == 1
    assert store.release(Q, p.dispatch_id, 3600) is True
    assert store.begin(Q, p.dispatch_id, NOW + 50_000, now_ms=NOW + 20_000, run="copy",
                       acks_late=True) is BeginResult.SKIP
    assert store.snapshot(Q)["inflight"] == 0

def test_acks_late_run_whose_worker_died_is_held_again(store: Store) -> None:
    p = _running(store, acks_late=True)
    # a copy the broker redelivered while the lease still runs is skipped...
    assert store.begin(Q, p.dispatch_id, NOW + 36_000, now_ms=NOW + 6_000, run="copy",
                       acks_late=True) is BeginResult.SKIP
    # ...and when the lease runs out unrenewed, the kept bytes are held again
    assert store.reclaim(Q, NOW + 30_000, 100) == (1, 0)
    assert store.snapshot(Q)["inflight"] == 0
    [again] = pick(store, 10, now=NOW + 30_000)
    assert (again.hold_id, again.value) == ("x", p.value)
    assert store.begin(Q, p.dispatch_id, NOW + 60_000, run="late") is BeginResult.SKIP
    assert store.begin(Q, again.dispatch_id, NOW + 60_000, acks_late=True) is BeginResult.RUN

def test_copy_after_the_lease_ran_out_takes_the_run_over(store: Store) -> None:
    """The first run's worker died and its lease ran out, but no dispatcher has reclaimed
    it yet: the copy runs in its place, in the slot it still holds."""
    p = _running(store, acks_late=True)
    assert store.begin(Q, p.dispatch_id, NOW + 60_000, now_ms=NOW + 30_000, run="copy",
                       acks_late=True) is BeginResult.RUN
    assert store.snapshot(Q)["inflight"] == 1
    assert store.reclaim(Q, NOW + 30_000, 100) == (0, 0)  # its lease is the copy's now

def test_copy_of_an_acks_early_run_still_runs(store: Store) -> None:
    """Without the bytes (acks early) a dead run could not be held again, so a copy is
    not skipped on the strength of the lease: it runs, as in Celery."""
    p = _running(store, acks_late=False)
    assert store.begin(Q, p.dispatch_id, NOW + 31_000, now_ms=NOW + 1_000, run="copy",
                       acks_late=False) is BeginResult.RUN
    assert store.snapshot(Q)["inflight"] == 1

def test_the_same_run_beginning_again_runs(store: Store) -> None:
    p = _running(store, acks_late=True, run="mine")
    assert store.begin(Q, p.dispatch_id, NOW + 31_000, now_ms=NOW + 1_000, run="mine",
                       acks_late=True) is BeginResult.RUN

@pytest.mark.parametrize("runner_gone", [True, False])
def test_copy_asks_whether_a_run_of_its_own_host_is_gone(store: Store,
                                                        runner_gone: bool) -> None:
    """A pool process killed mid-task (its message requeued by Celery): the copy, on the
    same host, sees that run's process is gone and takes over at once; while it lives,
    the copy is skipped."""
    p = _running(store, acks_late=True, run="h1:123:7:first")
    asked: list[str] = []

    def gone(run: str) -> bool:
        asked.append(run)
        return runner_gone

    got = store.begin(Q, p.dispatch_id, NOW + 31_000, now_ms=NOW + 1_000,
                      run="h1:456:7:copy", acks_late=True, host="h1:", gone=gone)
    assert asked == ["h1:123:7:first"]
    assert got is (BeginResult.RUN if runner_gone else BeginResult.SKIP)
    assert store.queue_figures(Q).skipped == (0 if runner_gone else 1)
    assert store.snapshot(Q)["inflight"] == 1

def test_begin_run_answers_the_holding_run_of_its_host_and_take_over_takes_it(
        store: Store) -> None:
    """The two atomic calls ``begin`` is made of (a transactional backend runs each in a
    transaction; whether the holding run is gone is judged between them)."""
    p = _running(store, acks_late=True, run="h1:123:7:first")
    ask = dict(now_ms=NOW + 1_000, run="h1:456:7:copy", acks_late=True)
    answer = store.begin_run(Q, p.dispatch_id, NOW + 31_000, host="h1:", **ask)
    assert answer == BeginAnswer(None, "h1:123:7:first")
    assert store.dispatch_state(Q, p.dispatch_id) == "running"  # nothing changed
    assert store.queue_figures(Q).skipped == 0
    taken = store.take_over(Q, p.dispatch_id, NOW + 31_000, host="h1:",
                            token=answer.held_by, **ask)
    assert taken == BeginAnswer(BeginResult.RUN)
    # the first run's own copy now finds the new run holding it
    again = store.begin_run(Q, p.dispatch_id, NOW + 31_000, now_ms=NOW + 2_000,
                            run="h1:123:7:late", acks_late=True, host="h1:")
    assert again == BeginAnswer(None, "h1:456:7:copy")

def test_copy_does_not_ask_about_another_hosts_run(store: Store) -> None:
    p = _running(store, acks_late=True, run="h2:123:7:first")
    got = store.begin(Q, p.dispatch_id, NOW + 31_000, now_ms=NOW + 1_000,
                      run="h1:456:7:copy", acks_late=True, host="h1:",
                      gone=lambda run: pytest.fail(f"asked about {run}"))
    assert got is BeginResult.SKIP

def test_run_gone_knows_dead_processes_and_its_own_thread() -> None:
    import os
    import subprocess
    import sys

    from celery_fair.lifecycle import _HOST as h
    from celery_fair.lifecycle import run_gone

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    me, thread = os.getpid(), threading.get_ident()
    assert run_gone(f"{h}{child.pid}:1:x")  # exited and reaped
    assert not run_gone(f"{h}{os.getppid()}:1:x")  # alive
    assert run_gone(f"{h}{me}:{thread}:x")  # this thread runs one task at a time
    assert not run_gone(f"{h}{me}:{thread + 1}:x")  # another thread of this process
    assert not run_gone(f"other{h}{child.pid}:1:x")  # not of this PID namespace and boot
    assert not run_gone("not a run token")

def test_release_by_a_run_that_was_taken_over_does_nothing(store: Store) -> None:
    p = _running(store, acks_late=True, run="h1:1:1:first")
    assert store.begin(Q, p.dispatch_id, NOW + 60_000, now_ms=NOW + 30_000, run="h1:2:1:copy",
                       acks_late=True) is BeginResult.RUN  # the first one's lease ran out
    assert store.release(Q, p.dispatch_id, 3600, run="h1:1:1:first") is False
    assert store.snapshot(Q)["inflight"] == 1
    assert store.release(Q, p.dispatch_id, 3600, run="h1:2:1:copy") is True
    assert store.snapshot(Q)["inflight"] == 0

def test_reclaim_queued_no_worker_reported_holds_again(store: Store) -> None:
    """The broker accepted it but no worker ever reported it (a Redis broker restarting
    while a worker popped it loses it): held again, and a copy that does turn up is
    skipped."""
    configure(store, cap=1)
    hold(store, "a", hold_id="x", body=b"payload")
    hold(store, "a", hold_id="y")
    [p] = pick(store, 1)
    assert store.confirm(Q, [p.dispatch_id], NOW + 30_000) == []
    assert store.reclaim(Q, NOW + 29_999, 100) == (0, 0)
    assert store.reclaim(Q, NOW + 30_000, 100) == (1, 0)
    assert store.snapshot(Q)["inflight"] == 0
    assert store.begin(Q, p.dispatch_id, NOW + 60_000) is BeginResult.SKIP
    [again] = pick(store, 10, now=NOW + 30_000)
    assert (again.hold_id, again.value) == ("x", p.value)  # first in its group, verbatim
    assert Envelope.decode(again.value)[2].body == b"payload"
    assert store.begin(Q, again.dispatch_id, NOW + 60_000) is BeginResult.RUN
    assert store.release(Q, again.dispatch_id) is True

def test_reclaim_respects_limit(store: Store) -> None:
    for _ in range(5):
        hold(store, "a")
    pick(store, 5, lease=1_000)
    assert store.reclaim(Q, NOW + 1_000, 2) == (2, 0)
    assert store.reclaim(Q, NOW + 1_000, 100) == (3, 0)
