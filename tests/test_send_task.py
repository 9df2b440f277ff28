"""Tasks published by name (``send_task``, beat) are held when ``fair_tasks`` names them.

The publisher is a client app that registers no task (code that cannot import them) with
``celery_fair.install``; the worker runs the test project's tasks as *plain* Celery tasks.
Each run is compared with the same calls through plain Celery (no install): same return
values, same states.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import pytest
from celery import Celery, chain
from celery.beat import ScheduleEntry, Scheduler

from celery_fair import ConfigurationError, fair_context, install
from celery_fair.config import get_config, reset_config
from celery_fair.dispatcher import Dispatcher
from celery_fair.installer import FairAMQP
from celery_fair.revoke import FairControlMixin
from celery_fair.rules import TaskRules, parse_rules
from celery_fair.task import request_headers, store_for

from .conftest import wait_for
from .helpers import (
    client_app,
    held,
    held_envelope,
    held_ids,
    queue_of,
    settled,
    wait_capacity,
    wait_settled,
)

RULES: dict[str, Any] = {
    "proj.work": {"group": ["kwarg:tenant", "arg:0"]},
    "proj.add": {"group": "header:x_tenant", "interactive": True, "cost": 2},
    "proj.tsum": {},
    "proj.flaky": {"group": "arg:0"},
    "proj.group_of": {},
    "proj.block": {"group": "value:blockers"},
}

CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], dict[str, Any]]] = [
    ("proj.work", (), {"tenant": "acme", "label": "kw"}, {}),
    ("proj.work", ("globex", "pos"), {}, {}),
    ("proj.add", (2, 3), {}, {"headers": {"x_tenant": "initech"}}),
    ("proj.tsum", ([1, 2, 3],), {}, {}),
    ("proj.add", (2, "x"), {}, {"headers": {"x_tenant": "initech"}}),  # fails: TypeError
]


@pytest.fixture
def apps(make_app: Any) -> Any:
    """(worker app with plain tasks, installed client) for the fair run, and the same
    pair without celery_fair for the plain Celery run."""

    def make(fair: bool) -> tuple[Any, Any]:
        worker_app = make_app(fair=False, fair_tasks=RULES)
        client = client_app(worker_app)
        if fair:
            install(worker_app)
            install(client)
        return worker_app, client

    return make


def _run(worker_app: Any, client: Any, worker: Any, dispatcher: Any, fair: bool) -> Any:
    with worker(the_app=worker_app, concurrency=2):
        results = [client.send_task(n, a, k, **o) for n, a, k, o in CALLS]
        if fair:
            # Held in their groups (nothing reached the broker), classes and costs set.
            assert held(client) == {"acme": 1, "globex": 1, "initech": 2, "default": 1}
            adder = held_envelope(client, results[2].id).headers
            assert (adder["fair_class"], adder["fair_cost"]) == ("i", 2.0)
            assert held_envelope(client, results[0].id).headers["fair_class"] == "b"
            with dispatcher(worker_app):
                _wait_ready(results)
            wait_settled(client)  # plain tasks released their slots
        else:
            _wait_ready(results)
            assert store_for(worker_app).queues() == []
        return [(r.state, repr(r.result)) for r in results]


def _wait_ready(results: list[Any]) -> None:
    wait_for(lambda: all(r.ready() for r in results), what="every task done")


def test_send_task_results_match_plain_celery(apps, worker, dispatcher, broker):
    plain = _run(*apps(fair=False), worker, dispatcher, fair=False)
    fair = _run(*apps(fair=True), worker, dispatcher, fair=True)
    assert fair == plain
    assert [state for state, _ in fair] == ["SUCCESS"] * 4 + ["FAILURE"]


def test_held_by_name_exactly_like_a_fair_task(make_app):
    fair_app = make_app()  # FairTask proj.work
    client = install(client_app(fair_app, fair_tasks=RULES))
    by_task = fair_app.tasks["proj.work"].apply_async(("acme", "x"), task_id="by-task")
    by_name = client.send_task("proj.work", ("acme", "x"), task_id="by-name")
    a, b = held_envelope(fair_app, by_task.id), held_envelope(fair_app, by_name.id)
    assert (a.body, a.content_type, a.content_encoding, a.exchange, a.routing_key,
            a.queue, a.delivery_mode, a.priority) == \
        (b.body, b.content_type, b.content_encoding, b.exchange, b.routing_key, b.queue,
         b.delivery_mode, b.priority)
    # The ids we chose; and Celery's apply_async states ignore_result where send_task
    # leaves it None (plain Celery does the same).
    differ = {"id", "root_id", "ignore_result"}
    assert {k: v for k, v in a.headers.items() if k not in differ} == \
        {k: v for k, v in b.headers.items() if k not in differ}
    assert a.headers["fair_group"] == "acme"
    assert set(a.properties) == set(b.properties)


def test_group_class_and_cost_from_rules_and_call(make_app):
    app = make_app(fair=False)
    rules = {
        "proj.exact": {"group": "value:fixed"},
        "proj.*": {"group": ["kwarg:tenant", "arg:1"]},
        "other.call": {"group": lambda args, kwargs: f"cb-{args[0]}", "cost": 3},
        "other.*": {"interactive": True},
    }
    client = install(client_app(app, fair_tasks=rules))
    store = store_for(client)

    def placed(name: str, *args: Any, **options: Any) -> tuple[str, str, float]:
        before = held_ids(client)
        client.send_task(name, *args, **options)
        (new,) = held_ids(client) - before
        h = held_envelope(client, new).headers
        return h["fair_group"], h["fair_class"], h["fair_cost"]

    assert placed("proj.exact", ("x", "y")) == ("fixed", "b", 1.0)      # exact beats glob
    assert placed("proj.any", (), {"tenant": "kw"}) == ("kw", "b", 1.0)
    assert placed("proj.any", ("a0", "a1")) == ("a1", "b", 1.0)         # list fallback
    assert placed("other.call", (7,)) == ("cb-7", "b", 3.0)               # callable
    assert placed("other.x", ()) == ("default", "i", 1.0)                 # nothing: default
    assert placed("proj.any", ("a0", "a1"), fair_group="call", fair_cost=5,
                  fair_interactive=True) == ("call", "i", 5.0)           # call time wins
    assert placed("proj.any", ("a0", "a1"),
                  headers={"fair_group": "hdr"}) == ("hdr", "b", 1.0)
    with fair_context(group="ctx", interactive=True):
        assert placed("other.x", ()) == ("ctx", "i", 1.0)
        assert placed("proj.any", ("a0", "a1")) == ("a1", "i", 1.0)     # rule beats ctx
    # Names no rule matches are published untouched: straight to the broker.
    before = held_ids(client)
    client.send_task("unmatched.task", (1,))
    client.send_task("celery.backend_cleanup")   # patterns never match celery.*
    assert held_ids(client) == before
    assert set(store.queues()) == {queue_of(client)}


def test_unmatched_name_goes_straight_to_the_broker(apps, worker, broker):
    worker_app, client = apps(fair=True)
    with worker(the_app=worker_app, concurrency=1):
        # proj.preview has no rule: it runs without any dispatcher.
        result = client.send_task("proj.preview", ("acme", "direct"))
        assert result.get(timeout=30) == "direct"
    assert store_for(client).queues() == []


def _beat(worker_app: Any, client: Any, worker: Any, dispatcher: Any, fair: bool) -> Any:
    scheduler = Scheduler(client, lazy=True)
    entry = ScheduleEntry(name="nightly", task="proj.work", schedule=60,
                          args=("acme", "from-beat"), kwargs={}, options={}, app=client)
    ledger = worker_app.ledger
    with worker(the_app=worker_app, concurrency=1):
        scheduler.apply_entry(entry, producer=scheduler.producer)  # what beat does
        if fair:
            wait_for(lambda: held(client) == {"acme": 1}, what="beat's message held")
            with dispatcher(worker_app):
                wait_for(lambda: ledger.runs() == {"from-beat": 1}, what="beat's task ran")
            wait_settled(client)
        else:
            wait_for(lambda: ledger.runs() == {"from-beat": 1}, what="beat's task ran")
    runs = ledger.runs()
    ledger.r.delete(ledger.key("runs"))
    return runs


def test_beat_entry_is_held(apps, worker, dispatcher, broker):
    plain = _beat(*apps(fair=False), worker, dispatcher, fair=False)
    assert _beat(*apps(fair=True), worker, dispatcher, fair=True) == plain


def test_retry_of_a_task_held_by_name(apps, worker, dispatcher, broker):
    worker_app, client = apps(fair=False)
    with worker(the_app=worker_app, concurrency=2):
        plain = client.send_task("proj.flaky", ("acme", 2, 0.2)).get(timeout=30)

    worker_app, client = apps(fair=True)
    store, queue = store_for(client), queue_of(client)
    with worker(the_app=worker_app, concurrency=2):
        wait_capacity(worker_app)
        stepper = Dispatcher(worker_app)
        result = client.send_task("proj.flaky", ("acme", 2, 0.2))
        assert held(client) == {"acme": 1}
        assert stepper.step().dispatched == 1
        # The plain task retried: its retry is held again in its group, not run.
        wait_for(lambda: (store.snapshot(queue)["delayed"], store.snapshot(queue)["inflight"])
                 == (1, 0), what="retry held in the delayed set, first slot released")
        retry = held_envelope(client, result.id)
        assert (retry.headers["fair_group"], retry.headers["retries"]) == ("acme", 1)
        assert "fair_dispatch_id" not in retry.headers
        with dispatcher(worker_app):
            assert result.get(timeout=30) == plain == 2
        wait_settled(client)


def _continuations(worker_app: Any, client: Any, worker: Any, dispatcher: Any,
                   fair: bool) -> Any:
    steps = chain(client.signature("proj.add", (1, 2)).set(fair_group="acme"),
                  client.signature("proj.add", (10,)),
                  client.signature("proj.group_of", immutable=True))
    with worker(the_app=worker_app, concurrency=2):
        result = steps.apply_async()
        if fair:
            wait_capacity(worker_app)
            stepper = Dispatcher(worker_app)
            assert held(client) == {"acme": 1}
            for _ in range(2):  # each step is published by the worker, held in 'acme'
                assert stepper.step().dispatched == 1
                wait_for(lambda: held(client) == {"acme": 1}, what="next step held")
            with dispatcher(worker_app):
                result.get(timeout=30)
            wait_settled(client)
        else:
            result.get(timeout=30)
    return result.result, result.parent.result, result.parent.parent.result


def test_continuations_by_name_inherit_the_parent_group(apps, worker, dispatcher, broker):
    assert _continuations(*apps(fair=False), worker, dispatcher, fair=False) == (None, 13, 3)
    # Same values; the last step saw the group it inherited.
    assert _continuations(*apps(fair=True), worker, dispatcher, fair=True) == ("acme", 13, 3)


def test_plain_task_marks_its_dispatch_running_and_releases_it(apps, worker, dispatcher,
                                                               broker):
    worker_app, client = apps(fair=True)
    go = threading.Event()
    seen: list[Any] = []

    @worker_app.task(name="proj.block", shared=False, bind=True)
    def block(self: Any) -> str:
        seen.append(request_headers(self.request).get("fair_dispatch_id"))
        go.wait(30)
        return "done"

    store = store_for(client)
    with worker(the_app=worker_app, concurrency=1), dispatcher(worker_app):
        result = client.send_task("proj.block")
        wait_for(lambda: seen, what="the task started")
        record = store.keys(queue_of(client)).dispatch(seen[0])
        # task_prerun marked the dispatch running; it holds its group's slot.
        wait_for(lambda: store.client.hget(record, "s") == b"running", what="running")
        assert store.snapshot(queue_of(client))["inflight"] == 1
        go.set()
        assert result.get(timeout=30) == "done"
        wait_for(lambda: settled(client), what="task_postrun released the slot")


def test_fair_task_matching_a_rule_is_held_once(make_app):
    app = make_app(fair_tasks={"proj.*": {"group": "value:ruled"}})
    app.tasks["proj.work"].delay("acme", "x")      # the FairTask's own rule
    app.send_task("proj.work", ("beta", "y"))       # by name: the fair_tasks rule
    assert held(app) == {"acme": 1, "ruled": 1}


def test_starmap_and_chunks_held_without_rules(make_app):
    app = make_app()
    work = app.tasks["proj.work"]
    work.starmap([("acme", "s1"), ("acme", "s2")]).apply_async()
    work.chunks([("beta", f"c{i}") for i in range(4)], 2).apply_async()
    assert held(app) == {"acme": 1, "beta": 2}
    cost = {g["group"]: g for g in store_for(app).snapshot(queue_of(app))["groups"]}
    assert set(cost) == {"acme", "beta"}


# -- the fair_tasks setting ---------------------------------------------------------------


@pytest.mark.parametrize(("value", "message"), [
    (["proj.work"], "expected a dict"),
    ({"proj.work": "kwarg:tenant"}, "expected a dict with keys"),
    ({"proj.work": {"grop": "kwarg:x"}}, "unknown key(s) grop"),
    ({"proj.work": {"group": "tenant"}}, "'kwarg:NAME'"),
    ({"proj.work": {"group": "kwargs:tenant"}}, "'kwarg:NAME'"),
    ({"proj.work": {"group": "arg:first"}}, "takes a position"),
    ({"proj.work": {"group": "value:"}}, "'kwarg:NAME'"),
    ({"proj.work": {"group": "value:" + "x" * 300}}, "at most 200"),
    ({"proj.work": {"group": []}}, "empty list"),
    ({"proj.work": {"interactive": "yes"}}, "expected True, False or None"),
    ({"proj.work": {"cost": 0}}, "fair cost must be a finite number in (0, 1e+09], got 0"),
    ({"": {}}, "task name or glob"),
])
def test_bad_fair_tasks_are_rejected_clearly(make_app, value, message):
    with pytest.raises(ConfigurationError) as info:
        parse_rules(value)
    assert message in str(info.value)
    assert "fair_tasks" in str(info.value)
    app = make_app(fair_tasks=value)
    reset_config(app)
    with pytest.raises(ConfigurationError):
        get_config(app)


def test_rule_matching_order():
    rules = parse_rules({"a.*": {"group": "value:first"}, "a.b*": {"group": "value:second"},
                         "a.bc": {"group": "value:exact"}, "*": {}})
    assert rules.match("a.bc").group == (("value", "exact"),)    # exact beats patterns
    assert rules.match("a.bd").group == (("value", "first"),)    # then the first pattern
    assert rules.match("zzz").pattern == "*"
    assert rules.match("celery.chord_unlock") is None             # patterns skip celery.*
    exact = parse_rules({"celery.chord_unlock": {}, "celery.ping": {}})
    assert exact.match("celery.chord_unlock") is not None
    assert exact.match("celery.ping") is None                      # never held
    assert not TaskRules() and rules


def test_install_after_the_app_made_its_sender_and_control(make_app):
    app = make_app(fair=False, fair_tasks={"proj.work": {"group": "arg:0"}})
    original = app.amqp.send_task_message  # built and cached before install
    control = app.control
    assert install(app) is install(app)  # idempotent
    assert app.amqp.send_task_message is not original
    assert app.control is control and isinstance(control, FairControlMixin)
    result = app.send_task("proj.work", ("acme", "late-install"))
    assert held(app) == {"acme": 1}
    result.revoke()
    assert result.state == "REVOKED" and settled(app)
    # Still picklable (Celery pickles apps for spawned processes): the classes import.
    assert pickle.loads(pickle.dumps(app)).amqp_cls is FairAMQP
    fresh = install(Celery("fresh", set_as_current=False))
    assert fresh.amqp_cls is FairAMQP and pickle.loads(pickle.dumps(fresh)).amqp_cls is FairAMQP
