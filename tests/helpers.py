"""Helpers shared by the send_task, canvas and revoke tests: store views, result trees,
a client app that cannot import the tasks, and runs compared with plain Celery."""

from __future__ import annotations

import time
from typing import Any, Callable

from celery import Celery
from celery.result import AsyncResult, ResultSet

from celery_fair.envelope import Envelope
from celery_fair.task import store_for

from .conftest import wait_for

#: Settings a client app copies from the test project app (same broker, queue, store).
CLIENT_SETTINGS = ("task_default_queue", "fair_key_prefix", "fair_store_url",
                   "broker_connection_retry_on_startup", "result_expires", "fair_tasks")


def queue_of(app: Celery) -> str:
    return str(app.conf.task_default_queue)


def snapshot(app: Celery) -> dict[str, Any]:
    return store_for(app).snapshot(queue_of(app))


def groups(app: Celery) -> dict[str, dict[str, Any]]:
    return {g["group"]: g for g in snapshot(app)["groups"]}


def held(app: Celery) -> dict[str, int]:
    """Held (not delayed, not in flight) messages per group."""
    return {name: g["held_background"] + g["held_interactive"]
            for name, g in groups(app).items()
            if g["held_background"] + g["held_interactive"]}


def settled(app: Celery) -> bool:
    """Nothing held, delayed or in flight."""
    snap = snapshot(app)
    return snap["inflight"] == 0 and snap["delayed"] == 0 and not snap["groups"]


def wait_settled(app: Celery) -> None:
    wait_for(lambda: settled(app), what="every slot released and nothing held")


def held_envelope(app: Celery, hold_id: str) -> Envelope:
    store = store_for(app)
    value = store.client.hget(store.keys(queue_of(app)).msg, hold_id)
    assert value is not None, f"{hold_id} is not held"
    return Envelope.decode(value)[2]


def held_ids(app: Celery) -> set[str]:
    store = store_for(app)
    return {k.decode() for k in store.client.hkeys(store.keys(queue_of(app)).msg)}


def wait_capacity(app: Celery) -> None:
    """A worker registered its pool with the store (so a hand-stepped dispatcher picks)."""
    wait_for(lambda: store_for(app).worker_capacity(queue_of(app), int(time.time() * 1000)),
             what="worker capacity registered")


def client_app(app: Celery, **conf: Any) -> Celery:
    """An app with no tasks (code that cannot import them), on the same broker, backend,
    queue and store as ``app``."""
    client = Celery("client", broker=app.conf.broker_url, backend=app.conf.result_backend,
                    set_as_current=False)
    client.conf.update({k: app.conf.get(k) for k in CLIENT_SETTINGS
                        if app.conf.get(k) is not None})
    client.conf.update(conf)
    return client


def outcome(result: Any) -> Any:
    """A result tree as comparable data: states and values (exceptions by type and text),
    following parents (chains) and members (groups); no task ids."""
    if result is None:
        return None
    if isinstance(result, ResultSet):  # a group's, or several results side by side
        return ("group", [outcome(r) for r in result.results],
                outcome(getattr(result, "parent", None)))
    assert isinstance(result, AsyncResult)
    value = result.result
    if isinstance(value, BaseException):
        value = (type(value).__name__, str(value))
    return (result.state, value, outcome(result.parent))


def finished(result: Any) -> bool:
    """Every result of the tree is ready (a chain's parents, a group's members)."""
    if result is None:
        return True
    if isinstance(result, ResultSet):
        return all(finished(r) for r in result.results) and \
            finished(getattr(result, "parent", None))
    return bool(result.ready()) and finished(result.parent)


def labels(app: Celery) -> list[str]:
    """Labels of the ledger's task starts, in start order."""
    return [s["label"] for s in app.ledger.starts()]  # type: ignore[attr-defined]


def reset_ledger(app: Celery) -> None:
    ledger = app.ledger  # type: ignore[attr-defined]
    keys = list(ledger.r.scan_iter(match=ledger.key("*")))
    if keys:
        ledger.r.delete(*keys)


def wait_outcome(result: Any, app: Celery, settle: Callable[[], bool] | None = None) -> Any:
    """Wait until the whole result tree is ready, then describe it."""
    wait_for(lambda: finished(result), timeout=60, what="every result of the canvas ready")
    if settle is not None:
        wait_for(settle, what="the run to settle")
    return outcome(result)


def held_chord(app: Celery) -> tuple[Any, Any]:
    """A chord of two ``proj.add`` members held in group acme, whose body (``proj.tsum``)
    has an errback (``proj.group_of``, answering its group): (the chord's result, the
    errback's frozen signature)."""
    from celery import chord

    add, tsum = app.tasks["proj.add"], app.tasks["proj.tsum"]
    errback = app.tasks["proj.group_of"].si()
    errback.freeze()
    result = chord([add.s(1, 1), add.s(2, 2)], tsum.s().on_error(errback)).apply_async(
        fair_group="acme")
    return result, errback


def two_groups_backlogged(make_app: Callable[..., Celery], worker: Any, dispatcher: Any,
                          entries: dict[str, Any],
                          slow: tuple[int, float], quick: tuple[int, float]) -> Celery:
    """Groups 'slow' and 'quick' ((tasks, seconds each) of ``proj.work``) held at once in
    the one fair queue, whose ``fair_queue_policies`` entry is ``entries``, and run
    to their end on 4 slots (``fair_max_inflight`` 4) by a real worker and dispatcher.
    Returns the app: its ledger has what the tasks measured."""
    queue = make_app().conf.task_default_queue
    app = make_app(fair_max_inflight=4, fair_queue_policies={queue: entries})
    work = app.tasks["proj.work"]
    results = [work.delay(group, f"{group}-{i}", seconds)
               for group, (n, seconds) in (("slow", slow), ("quick", quick))
               for i in range(n)]
    with worker(concurrency=4, the_app=app), dispatcher(the_app=app):
        for r in results:
            r.get(timeout=60)
    assert wait_for(lambda: app.ledger.ends() == len(results), timeout=60,  # type: ignore[attr-defined]
                    what="every task ended")
    return app
