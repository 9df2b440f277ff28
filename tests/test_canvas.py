"""Canvas through celery-fair gives what plain Celery gives, and every step is held fairly.

Each test runs one canvas twice on the same broker: through plain Celery (the test
project's tasks as plain tasks) and through celery-fair (the same tasks as FairTasks,
with a dispatcher). Both runs must end with the same result tree (states and values),
the same tasks run (callbacks and errbacks included) and, in a chain, the same order.
Between the two, the fair run checks where each message was held.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Callable

from celery import Task, chain, chord, group
from celery.result import ResultSet

from celery_fair import FairTask
from celery_fair.dispatcher import Dispatcher

from .conftest import wait_for
from .helpers import (
    finished,
    held,
    held_envelope,
    labels,
    outcome,
    reset_ledger,
    settled,
    wait_capacity,
)

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def register(app: Any, fair: bool) -> None:
    """Tasks the canvases need besides the project's (fair or plain, like the app's)."""
    base: type[Task] = FairTask if fair else Task
    ledger, add, group_of = app.ledger, app.tasks["proj.add"], app.tasks["proj.group_of"]

    @app.task(name="proj.pwork", shared=False)  # always plain
    def pwork(tenant: str, label: str = "") -> str:
        ledger.enter(tenant, label)
        ledger.leave(tenant)
        return label

    @app.task(name="proj.padd", shared=False)  # always plain
    def padd(x: int, y: int) -> int:
        return x + y

    @app.task(base=base, name="proj.fail", shared=False)
    def fail(*_: Any) -> None:
        raise ValueError("boom")

    @app.task(base=base, name="proj.replacer", bind=True, shared=False)
    def replacer(self: Any, x: int) -> Any:
        return self.replace(add.s(x, 1))

    @app.task(base=base, name="proj.replace_by_group_of", bind=True, shared=False)
    def replace_by_group_of(self: Any) -> Any:
        return self.replace(group_of.si())


def _normal(value: Any) -> Any:
    """Task ids in error messages differ between runs; everything else must not."""
    if isinstance(value, str):
        return UUID.sub("<id>", value)
    if isinstance(value, (list, tuple)):
        return type(value)(_normal(v) for v in value)
    return value


def compare(make_app: Callable[..., Any], worker: Any, dispatcher: Any,
            build: Callable[[Any], Any], runs: int = 0, ordered: bool = False,
            check_held: Callable[[Any, Any], None] | None = None) -> Any:
    """Run ``build(app)`` through plain Celery, then celery-fair; assert same outcome.

    ``runs``: ledger entries (tasks of the project that record themselves) to wait for;
    ``check_held(app, result)`` looks at the store before the fair run's dispatcher starts.
    """
    seen = {}
    for fair in (False, True):
        app = make_app(fair=fair)
        register(app, fair)
        reset_ledger(app)
        with worker(the_app=app, concurrency=4):
            result = build(app)
            if fair and check_held is not None:
                check_held(app, result)
            with dispatcher(app) if fair else contextlib.nullcontext():
                seen[fair] = _finish(app, result, runs, ordered)
            if fair:
                wait_for(lambda app=app: settled(app), what="every slot released")
    assert seen[True] == seen[False]
    return seen[True]


def _finish(app: Any, result: Any, runs: int, ordered: bool) -> Any:
    wait_for(lambda: finished(result), timeout=60, what="the whole result tree ready")
    wait_for(lambda: len(labels(app)) >= runs, what=f"{runs} recorded task runs")
    ran = labels(app) if ordered else sorted(labels(app))
    return _normal(outcome(result)), ran


# -- group ------------------------------------------------------------------------------


def test_group_of_100_across_tenants(make_app, worker, dispatcher, broker):
    def build(app: Any) -> Any:
        work = app.tasks["proj.work"]
        return group(work.si(f"t{i % 10}", f"m{i}") for i in range(100)).apply_async()

    def check_held(app: Any, result: Any) -> None:
        # Each member is held individually, in its own tenant's group.
        assert held(app) == {f"t{k}": 10 for k in range(10)}
        for i, member in enumerate(result.results):
            assert held_envelope(app, member.id).headers["fair_group"] == f"t{i % 10}"

    (tree, ran) = compare(make_app, worker, dispatcher, build, runs=100,
                          check_held=check_held)
    assert [value for _, value, _ in tree[1]] == [f"m{i}" for i in range(100)]
    assert ran == sorted(f"m{i}" for i in range(100))


# -- chord ------------------------------------------------------------------------------


def test_chord_with_callback(make_app, worker, dispatcher, broker):
    def build(app: Any) -> Any:
        add, tsum, work = (app.tasks[n] for n in ("proj.add", "proj.tsum", "proj.work"))
        body = tsum.s().on_error(work.si("acme", "chord-errback"))
        return chord([add.s(i, i).set(fair_group=f"t{i % 2}") for i in range(6)],
                     body).apply_async()

    def check_held(app: Any, result: Any) -> None:
        assert held(app) == {"t0": 3, "t1": 3}

    (tree, ran) = compare(make_app, worker, dispatcher, build, check_held=check_held)
    assert tree[:2] == ("SUCCESS", 30)
    assert ran == []  # the errback did not fire


def test_chord_errback_fires_when_a_member_fails(make_app, worker, dispatcher, broker):
    def build(app: Any) -> Any:
        add, tsum, work, fail = (app.tasks[n] for n in
                                 ("proj.add", "proj.tsum", "proj.work", "proj.fail"))
        body = tsum.s().on_error(work.si("acme", "chord-errback"))
        return chord([add.s(1, 1), fail.s(), add.s(2, 2)], body).apply_async(
            fair_group="acme")

    (tree, ran) = compare(make_app, worker, dispatcher, build, runs=1)
    assert tree[0] == "FAILURE" and tree[1][0] == "ChordError"
    assert ran == ["chord-errback"]


# -- chain ------------------------------------------------------------------------------


def test_chain_mixing_fair_and_plain_steps(make_app, worker, dispatcher, broker):
    steps = ["p1", "f2", "p3", "f4", "f5", "p6"]

    def build(app: Any) -> Any:
        work, pwork = app.tasks["proj.work"], app.tasks["proj.pwork"]
        return chain(*((pwork if s[0] == "p" else work).si("acme", s) for s in steps)
                     ).apply_async()

    def check_held(app: Any, result: Any) -> None:
        # The plain first step went straight to the broker and ran without a dispatcher;
        # the fair step it published is held.
        wait_for(lambda: held(app) == {"acme": 1}, what="2nd step (fair) held")
        assert labels(app) == ["p1"]

    (tree, ran) = compare(make_app, worker, dispatcher, build, runs=len(steps),
                          ordered=True, check_held=check_held)
    assert ran == steps
    assert tree[:2] == ("SUCCESS", "p6")


def test_chain_values_through_fair_and_plain_steps(make_app, worker, dispatcher, broker):
    def build(app: Any) -> Any:
        add, padd = app.tasks["proj.add"], app.tasks["proj.padd"]
        return chain(add.s(1, 2), padd.s(3), add.s(4), padd.s(5), add.s(6)).apply_async()

    (tree, _) = compare(make_app, worker, dispatcher, build)
    assert tree[:2] == ("SUCCESS", 21)


# -- link / link_error ------------------------------------------------------------------


def test_link_and_link_error(make_app, worker, dispatcher, broker):
    def build(app: Any) -> Any:
        add, fail, work = app.tasks["proj.add"], app.tasks["proj.fail"], app.tasks["proj.work"]
        ok = add.apply_async((2, 3), fair_group="linker", link=work.si("acme", "linked"),
                             link_error=work.si("acme", "not-fired"))
        bad = fail.apply_async(fair_group="linker", link=work.si("acme", "not-fired"),
                               link_error=[work.si("acme", "errback")])
        return _pair(app, ok, bad)

    (tree, ran) = compare(make_app, worker, dispatcher, build, runs=2)
    assert [t[0] for t in tree[1]] == ["SUCCESS", "FAILURE"]
    assert ran == ["errback", "linked"]


def _pair(app: Any, *results: Any) -> Any:
    return ResultSet(list(results), app=app)


# -- Task.replace -----------------------------------------------------------------------


def test_replace_gives_the_same_results(make_app, worker, dispatcher, broker):
    def build(app: Any) -> Any:
        replacer, add = app.tasks["proj.replacer"], app.tasks["proj.add"]
        return chain(replacer.s(1), add.s(10)).apply_async()

    (tree, _) = compare(make_app, worker, dispatcher, build)
    assert tree[:2] == ("SUCCESS", 12)


def test_replacement_is_held_in_the_parent_group(make_app, worker, dispatcher, broker):
    app = make_app()
    register(app, fair=True)
    stepper = Dispatcher(app)
    with worker(the_app=app, concurrency=2):
        wait_capacity(app)
        result = app.tasks["proj.replace_by_group_of"].apply_async(fair_group="acme")
        assert held(app) == {"acme": 1}
        assert stepper.step().dispatched == 1
        # The replacement (same task id) is published by the worker and held in 'acme'.
        wait_for(lambda: held(app) == {"acme": 1}, what="replacement held")
        assert held_envelope(app, result.id).headers["task"] == "proj.group_of"
        with dispatcher(app):
            assert result.get(timeout=30) == "acme"
        wait_for(lambda: settled(app), what="every slot released")


# -- starmap / chunks -------------------------------------------------------------------


def test_starmap(make_app, worker, dispatcher, broker):
    def build(app: Any) -> Any:
        work = app.tasks["proj.work"]
        return work.starmap([("acme", "s1"), ("acme", "s2")]).apply_async()

    def check_held(app: Any, result: Any) -> None:
        # One message for the whole map, in its items' group, costing one per item.
        assert held(app) == {"acme": 1}
        assert held_envelope(app, result.id).headers["fair_cost"] == 2.0

    (tree, ran) = compare(make_app, worker, dispatcher, build, runs=2, ordered=True,
                          check_held=check_held)
    assert tree[:2] == ("SUCCESS", ["s1", "s2"])
    assert ran == ["s1", "s2"]


def test_chunks(make_app, worker, dispatcher, broker):
    items = [(f"t{i // 3}", f"c{i}") for i in range(6)]

    def build(app: Any) -> Any:
        return app.tasks["proj.work"].chunks(items, 3).apply_async()

    def check_held(app: Any, result: Any) -> None:
        assert held(app) == {"t0": 1, "t1": 1}  # each chunk in its items' group
        assert [held_envelope(app, r.id).headers["fair_cost"] for r in result.results] \
            == [3.0, 3.0]

    (tree, ran) = compare(make_app, worker, dispatcher, build, runs=6, check_held=check_held)
    assert [value for _, value, _ in tree[1]] == [["c0", "c1", "c2"], ["c3", "c4", "c5"]]
    assert ran == sorted(label for _, label in items)
