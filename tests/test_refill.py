"""Refill in release: with the direct push, a release picks into the slot it frees itself
(``release.lua`` with the pick of ``include/picking.lua``), from the parameters the
dispatcher's last pick left (``refill.py``). Real Redis as store and broker, a real
dispatcher and, end to end, a real worker.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from celery_fair import controls
from celery_fair.dispatcher import Dispatcher
from celery_fair.task import store_for

from . import twins
from .conftest import wait_for
from .helpers import wait_settled

pytestmark = pytest.mark.timeout(120)


class Reports:
    """A dispatcher observer: the groups of the dispatches it was told of, in order."""

    def __init__(self) -> None:
        self.groups: list[str] = []

    def on_dispatch(self, queue: str, group: str, klass: str, due_at: float | None) -> None:
        self.groups.append(group)

    def on_reclaim(self, queue: str, requeued: int, lost: int) -> None: ...

    def on_step(self, seconds: float) -> None: ...


def _setup(make_app: Any, **conf: Any) -> tuple[Any, Any, Any, str, Dispatcher]:
    app = make_app(**{"fair_max_inflight": 1, **conf})
    fair, _ = twins.register(app)
    queue = twins.queue_of(app)
    dispatcher = Dispatcher(app)
    dispatcher.refill.live = True  # as run() does: these tests step it by hand
    dispatcher.observer = Reports()  # type: ignore[assignment]
    return app, fair, store_for(app), queue, dispatcher


def _delivered(store: Any, queue: str) -> list[dict[str, Any]]:
    """The messages in kombu's list of ``queue``, oldest first, taken out."""
    raw = store.client.lrange(queue, 0, -1)
    store.client.delete(queue)
    return [json.loads(m) for m in reversed(raw)]


def _dispatch_id(message: dict[str, Any]) -> str:
    return str(message["headers"]["fair_dispatch_id"])


def test_a_release_pushes_the_next_message_in_fair_order_without_waking_the_dispatcher(
        make_app: Any) -> None:
    app, fair, store, queue, dispatcher = _setup(make_app)
    ids = [fair.apply_async((g,), fair_group=g).id for g in ("a", "a", "b")]
    assert dispatcher.step().dispatched == 1  # capacity 1: a's first
    first, = _delivered(store, queue)
    assert first["headers"]["id"] == ids[0]
    store.client.delete(store.keys(queue).wake)  # the holds' wake-ups, taken
    assert store.release(queue, _dispatch_id(first))
    refilled, = _delivered(store, queue)
    assert refilled["headers"]["id"] == ids[2]  # b before a's second: fair, not FIFO
    record = store.client.hgetall(f"{store.keys(queue).prefix}:d:{_dispatch_id(refilled)}")
    assert record[b"s"] == b"queued"  # as pick's own direct push: no window to lose it
    assert not store.client.exists(store.keys(queue).wake)  # no dispatcher step for it
    # the dispatcher's next step reports it (metrics, log line) and takes nothing more
    assert dispatcher.step().dispatched == 1
    assert dispatcher.observer.groups == ["a", "b"]  # type: ignore[union-attr]
    assert _delivered(store, queue) == []
    dispatcher.close()


def test_a_release_after_the_dispatcher_stopped_wakes_it_and_pushes_nothing(
        make_app: Any) -> None:
    app, fair, store, queue, dispatcher = _setup(make_app)
    for g in ("a", "b"):
        fair.apply_async((g,), fair_group=g)
    dispatcher.step()
    first, = _delivered(store, queue)
    dispatcher.close()
    assert not store.client.exists(store.keys(queue).refill)
    store.client.delete(store.keys(queue).wake)
    assert store.release(queue, _dispatch_id(first))
    assert _delivered(store, queue) == []
    assert store.client.llen(store.keys(queue).wake) == 1  # as before refill


def test_a_message_that_cannot_be_pushed_is_handed_to_the_dispatcher_to_publish(
        make_app: Any) -> None:
    app, fair, store, queue, dispatcher = _setup(make_app)
    fair.apply_async(("a",), fair_group="a")
    expiring = fair.apply_async(("b",), fair_group="b", expires=600)  # kombu publishes it
    dispatcher.step()
    first, = _delivered(store, queue)
    store.client.delete(store.keys(queue).wake)
    assert store.release(queue, _dispatch_id(first))
    assert _delivered(store, queue) == []  # taken, not pushed
    assert store.client.llen(store.keys(queue).handoff) == 1
    assert store.client.llen(store.keys(queue).wake) == 1  # the dispatcher is woken
    assert dispatcher.step().dispatched == 1  # and publishes it with kombu
    published, = _delivered(store, queue)
    assert published["headers"]["id"] == expiring.id
    assert published["headers"]["expires"] is not None
    assert dispatcher.observer.groups == ["a", "b"]  # type: ignore[union-attr]
    dispatcher.close()


def test_a_handed_off_dispatch_reclaimed_meanwhile_is_not_published(make_app: Any) -> None:
    app, fair, store, queue, dispatcher = _setup(make_app)
    fair.apply_async(("a",), fair_group="a")
    expiring = fair.apply_async(("b",), fair_group="b", expires=600)
    dispatcher.step()
    first, = _delivered(store, queue)
    assert store.release(queue, _dispatch_id(first))
    did = store.client.lrange(store.keys(queue).handoff, 0, -1)[0].decode()
    # its pick lease runs out before any dispatcher publishes it: held again
    far = int(store.client.zscore(store.keys(queue).leases, did)) + 1
    assert store.reclaim(queue, far, 100) == (1, 0)
    assert dispatcher.step(far).dispatched == 1  # picked again, under a new dispatch id
    published, = _delivered(store, queue)
    assert published["headers"]["id"] == expiring.id
    assert _dispatch_id(published) != did
    dispatcher.close()


def test_a_drain_is_fed_by_releases_and_every_dispatch_is_still_reported(
        make_app: Any, worker: Any, dispatcher: Any) -> None:
    app = make_app(fair_max_inflight=2)
    work = app.tasks["proj.work"]
    running = dispatcher(app)
    reports = Reports()
    running.dispatcher.observer = reports
    store, queue = store_for(app), twins.queue_of(app)
    steps = Counter[str]()
    original = running.dispatcher.store.promote_reclaim_pick

    def counting(*args: Any, **kw: Any) -> Any:
        steps["picks"] += 1
        return original(*args, **kw)

    running.dispatcher.store.promote_reclaim_pick = counting
    labels = [f"t{i % 3}-{i}" for i in range(60)]
    with worker(concurrency=2, the_app=app), running:
        results = [work.delay(label.split("-")[0], label, 0.01) for label in labels]
        assert sorted(r.get(timeout=60) for r in results) == sorted(labels)
        wait_settled(app)
    assert app.ledger.runs() == {label: 1 for label in labels}  # type: ignore[attr-defined]
    assert Counter(reports.groups) == {"t0": 20, "t1": 20, "t2": 20}  # each reported once
    picks = int(store.client.hget(store.keys(queue).stat, "picks"))
    refills = picks - steps["picks"]
    assert refills >= len(labels) / 2, (picks, steps)  # most slots refilled by releases
    wait_for(lambda: not store.client.exists(store.keys(queue).refill),
             what="refill ended with the dispatcher")


def test_a_hold_into_a_queue_with_room_is_pushed_in_the_same_call(make_app: Any) -> None:
    app, fair, store, queue, dispatcher = _setup(make_app, fair_max_inflight=2)
    fair.apply_async(("a",), fair_group="a")
    assert dispatcher.step().dispatched == 1  # leaves the refill parameters
    assert len(_delivered(store, queue)) == 1
    store.client.delete(store.keys(queue).wake)
    b = fair.apply_async(("b",), fair_group="b")  # room for one more: out at once
    pushed, = _delivered(store, queue)
    assert pushed["headers"]["id"] == b.id
    assert not store.client.exists(store.keys(queue).wake)  # nothing left to wake it for
    c = fair.apply_async(("c",), fair_group="c")  # no room left: held
    assert _delivered(store, queue) == []
    assert store.client.hexists(store.keys(queue).msg, c.id)
    assert store.client.llen(store.keys(queue).wake) == 1  # a group became ready, as before
    assert dispatcher.step().dispatched == 1  # b reported; c waits for a slot
    assert dispatcher.observer.groups == ["a", "b"]  # type: ignore[union-attr]
    dispatcher.close()


def test_a_bare_step_leaves_no_refill_to_releases(make_app: Any) -> None:
    """Only a running dispatcher drains what releases refill: a step by hand (a tool, a
    test moving time itself) leaves releases waking dispatchers, as before."""
    app, fair, store, queue, dispatcher = _setup(make_app)
    dispatcher.refill.live = False  # a Dispatcher that is never run()
    for g in ("a", "b"):
        fair.apply_async((g,), fair_group=g)
    dispatcher.step()
    first, = _delivered(store, queue)
    assert not store.client.exists(store.keys(queue).refill)
    store.client.delete(store.keys(queue).wake)
    assert store.release(queue, _dispatch_id(first))
    assert _delivered(store, queue) == []
    assert store.client.llen(store.keys(queue).wake) == 1


def test_a_refill_that_throttles_a_group_wakes_the_dispatcher_to_lift_it_in_time(
        make_app: Any) -> None:
    app, fair, store, queue, dispatcher = _setup(make_app)
    controls.limit(app, "a", rate="1/s", burst=2, create=True, queue=queue)
    for _ in range(3):
        fair.apply_async(("a",), fair_group="a")
    dispatcher.step()  # a's first token of two
    first, = _delivered(store, queue)
    store.client.delete(store.keys(queue).wake)
    assert store.release(queue, _dispatch_id(first))
    assert len(_delivered(store, queue)) == 1  # its second: the bucket is empty now
    assert store.client.zscore(store.keys(queue).throttled, "a") is not None
    # the dispatcher's next step promotes it when its token is due (a sweep is 1 s)
    assert store.client.llen(store.keys(queue).wake) == 1
    dispatcher.close()


def test_a_pick_that_throttles_a_group_wakes_the_dispatcher_to_lift_it_in_time(
        make_app: Any) -> None:
    """Releases that refill no longer wake the dispatcher, so its own pick that empties
    a group's bucket does: the next step's promote says when the group is lifted."""
    app, fair, store, queue, dispatcher = _setup(make_app, fair_max_inflight=4)
    dispatcher.refill.live = False  # its own pick, not a hold's refill, takes the token
    controls.limit(app, "a", rate="1/s", burst=1, create=True, queue=queue)
    fair.apply_async(("z",), fair_group="z")
    assert dispatcher.step().dispatched == 1  # serving the queue configures it: a wake-up
    for _ in range(2):
        fair.apply_async(("a",), fair_group="a")
    store.client.delete(store.keys(queue).wake)  # and a's hold made it ready
    assert dispatcher.step().dispatched == 1
    assert store.client.zscore(store.keys(queue).throttled, "a") is not None
    assert store.client.llen(store.keys(queue).wake) == 1
    result = dispatcher.step()  # woken: its promote names the lift
    assert result.dispatched == 0 and result.next_due_ms is not None
    dispatcher.close()
