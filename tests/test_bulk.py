"""Bulk holding: ``FairTask.fair_bulk`` and ``bulk_holds`` (a group held in batches), on
real Redis with a real worker and dispatcher where tasks run. Each message is the one
``apply_async`` would have held; nothing is held when an item is bad or a group has no
room; a store failure part way says what is held, and its retry holds the rest once."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest
from celery import Celery, Signature, group
from celery.utils.saferepr import saferepr
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.exceptions import EncodeError

from celery_fair import BulkHoldFailed, GroupFull, InvalidGroup, InvalidOption, bulk_holds
from celery_fair.bulk_messages import Stamper, plain_repr, task_ids, templatable
from celery_fair.envelope import Envelope, placement_of
from celery_fair.store import store_for


def test_bulk_held_tasks_run_through_the_dispatcher_with_their_results(
        app: Celery, worker: Any, dispatcher: Any) -> None:
    add = app.tasks["proj.add"]
    items: list[Any] = [(i, i) for i in range(30)]
    items.append(add.s(100, y=1).set(countdown=0.2))  # options of its own
    held = add.fair_bulk(items, group="acme", batch_size=8)
    with bulk_holds(app):
        grouped = group(add.s(i, 1) for i in range(5)).apply_async()
    assert store_for(app).queue_figures(app.conf.task_default_queue).held_background == 35
    with worker(concurrency=4), dispatcher():
        assert [r.get(timeout=30) for r in held] == [2 * i for i in range(30)] + [101]
        assert grouped.get(timeout=30) == [1, 2, 3, 4, 5]


def test_a_group_of_fair_tasks_is_held_in_batches_by_itself(
        app: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_for(app)
    batches: list[int] = []
    hold_many = type(store).hold_many
    monkeypatch.setattr(type(store), "hold", lambda *_: pytest.fail("held one by one"))
    monkeypatch.setattr(type(store), "hold_many", lambda self, queue, holds, now: (
        batches.append(len(holds)), hold_many(self, queue, holds, now))[1])
    add, plain = app.tasks["proj.add"], app.tasks["proj.plain_nap"]
    result = group([*(add.s(i, 1) for i in range(12)), plain.s("x", 0)]).apply_async()
    assert batches == [12]  # the fair members, in one round trip; the plain one published
    held = store.queue_figures(app.conf.task_default_queue).held_background
    assert held == 12 and len(result.results) == 13


def test_with_on_store_error_publish_a_groups_members_keep_their_own_holds(
        make_app: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # a bulk hold never falls back to the broker: there each member is held on its own
    app = make_app(fair_on_store_error="publish")
    store = store_for(app)
    singles: list[str] = []
    hold = type(store).hold
    monkeypatch.setattr(type(store), "hold_many", lambda *_: pytest.fail("held in bulk"))
    monkeypatch.setattr(type(store), "hold", lambda self, queue, hold_id, *rest: (
        singles.append(hold_id), hold(self, queue, hold_id, *rest))[1])
    add = app.tasks["proj.add"]
    result = group(add.s(i, 1) for i in range(3)).apply_async()
    assert singles == [r.id for r in result.results]


def _held(app: Celery, task_id: str) -> tuple[Envelope, Any]:
    """The held message of ``task_id``, its id replaced by ``ID`` and its due time
    dropped (the only things two calls of the same arguments differ in)."""
    store = store_for(app)
    for group_name in ("acme", "globex", "7"):
        for message in store.held_messages(app.conf.task_default_queue, group_name, 100):
            if message.hold_id == task_id:
                envelope = Envelope.decode(message.value)[2]
                same = {k: ("ID" if v == task_id else v) for k, v in envelope.headers.items()}
                props = {k: ("ID" if v == task_id else v)
                         for k, v in envelope.properties.items()}
                envelope.headers, envelope.properties, envelope.due_at = same, props, None
                return envelope, placement_of(message.value)
    raise AssertionError(f"{task_id} is not held")


@pytest.mark.parametrize("options, quick", [
    ({"priority": 3, "headers": {"custom": "x"}}, True),  # JSON written once, filled in
    ({"compression": "zlib"}, False),  # each serialized by the producer
])
def test_a_bulk_held_message_is_the_one_apply_async_would_hold(
        app: Celery, options: dict[str, Any], quick: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    work = app.tasks["proj.work"]  # its group is its `tenant` argument
    calls: list[Any] = [("acme", "first"), ("globex", "second", 0.5),
                        ("acme", 'it\'s "q"\\'), ("globex", "naïve ☃ \x7f"),
                        work.s("acme", label="keyword"), (7, "an int group")]
    by_producer = []
    made_by_producer = Stamper._made_by_producer
    monkeypatch.setattr(Stamper, "_made_by_producer", lambda self, *args: (
        by_producer.append(args[0]), made_by_producer(self, *args))[1])
    # the first built by Celery, the others made from it (bulk_messages.py)
    assert templatable(app, work, options)
    bulk = work.fair_bulk(calls, **options)
    assert len(by_producer) == (0 if quick else len(calls) - 1)
    single = [work.apply_async(c.args, c.kwargs, **options) if isinstance(c, Signature)
              else work.apply_async(c, **options) for c in calls]
    assert len({r.id for r in bulk + single}) == 2 * len(calls)
    for made, built in zip(bulk, single):
        assert _held(app, made.id) == _held(app, built.id)


def test_a_bad_item_fails_the_call_naming_it_and_nothing_is_held(app: Celery) -> None:
    work, add = app.tasks["proj.work"], app.tasks["proj.add"]
    queue = app.conf.task_default_queue
    with pytest.raises(InvalidGroup, match=r"proj.work.fair_bulk\(\): item 2: .*control"):
        work.fair_bulk([("acme",), ("globex",), ("bad\ngroup",)])
    with pytest.raises(EncodeError, match=r"item 1: .*not JSON serializable"):
        add.fair_bulk([(1, 2), (object(), 2)], group="acme")
    with pytest.raises(TypeError, match=r"item 1: .*argument"):
        add.fair_bulk([(1, 2), (1, 2, 3)], group="acme")
    with pytest.raises(InvalidOption, match="item 1 is a dict"):
        add.fair_bulk([(1, 2), {"x": 1}], group="acme")
    with pytest.raises(InvalidOption, match="did you mean 'group'"):
        add.fair_bulk([(1, 2)], fair_group="acme")
    assert store_for(app).queue_figures(queue).held_background == 0


def test_a_group_without_room_for_the_call_holds_none_of_it(
        make_app: Any) -> None:
    app = make_app(fair_group_max_held=3)
    add = app.tasks["proj.add"]
    with pytest.raises(GroupFull, match="group 'acme' has no room for 4 tasks .* it holds "
                                        "0, its limit is 3"):
        add.fair_bulk([(i, i) for i in range(4)], group="acme")
    figures = store_for(app).queue_figures(app.conf.task_default_queue)
    assert figures.held_background == 0
    assert len(add.fair_bulk([(i, i) for i in range(3)], group="acme")) == 3


def test_a_store_failure_part_way_says_what_is_held_and_its_retry_holds_the_rest_once(
        app: Celery, redis_client: Any) -> None:
    work = app.tasks["proj.work"]
    queue = app.conf.task_default_queue
    store = store_for(app)
    broken = f"{store.keys(queue).prefix}:g:globex"  # type: ignore[attr-defined]
    redis_client.set(broken, "not a hash")  # the second batch's script fails on it
    with pytest.raises(BulkHoldFailed, match="2 tasks held, 2 not") as raised:
        work.fair_bulk([("acme",), ("acme",), ("globex",), ("globex",)], batch_size=2)
    failed = raised.value
    assert len(failed.held) == 2 and len(failed.pending) == 2
    assert sorted(m.hold_id for m in store.held_messages(queue, "acme", 10)) == \
        sorted(failed.held)
    redis_client.delete(broken)
    failed.retry()
    assert [g.held_background for g in store.group_figures(queue, ["acme", "globex"])] == \
        [2, 2]
    failed.retry()  # again (a reply lost): each message is held once
    held = store.held_messages(queue, "globex", 10) + store.held_messages(queue, "acme", 10)
    assert sorted(m.hold_id for m in held) == sorted(failed.held + failed.pending)


_texts = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=60)
_leaves = st.one_of(st.none(), st.integers(), st.booleans(), st.floats(), _texts,
                    st.binary(max_size=10))


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.tuples(*[_leaves] * 3), st.lists(_leaves, max_size=25).map(tuple),
                 st.dictionaries(_texts, _leaves, max_size=5),
                 st.tuples(st.lists(_leaves, max_size=3))),
       st.sampled_from([1024, 40]))
def test_the_quick_argsrepr_is_celerys_saferepr(value: Any, maxsize: int) -> None:
    assert plain_repr(value, maxsize) == saferepr(value, maxsize)


def test_the_made_task_ids_are_version_4_uuids_as_celerys() -> None:
    ids = list(itertools.islice(task_ids(), 3000))  # across os.urandom chunks of 1,024
    assert len(set(ids)) == len(ids)
    for made in ids:
        parsed = uuid.UUID(made)
        assert str(parsed) == made and parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
