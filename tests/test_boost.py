"""Boost (``controls.boost``/``unboost``/``boost_task``, ``fair boost``): what they
write and refuse (real Redis, no dispatcher), the CLI and its marker in ``fair status``
and ``fair groups``, and end to end with a real worker and dispatcher: a group boosted to
weight 3 gets about 3 dispatches to the other's 1, about 1:1 again after the boost
expired by itself, with both events in the audit log. The store's part on every backend:
tests/test_store_contract_boost.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from celery_fair import audit, controls
from celery_fair.errors import InvalidControl, InvalidLimit, UnknownQueue
from celery_fair.task import store_for

from .conftest import wait_for
from .control_helpers import cli, held_fixture  # noqa: F401  (the fixture ``held``)
from .helpers import queue_of, settled, wait_capacity


def test_boost_and_unboost_a_group_with_the_audit_log(held: Any) -> None:
    queue, store = queue_of(held), store_for(held)
    controls.limit(held, "acme", weight=2)
    [done] = controls.boost(held, "acme", weight=10, for_seconds=3600, reason="launch",
                            actor="alice")
    assert (done.queue, done.group, done.weight) == (queue, "acme", 10.0)
    assert store.boosts(queue) == {"acme": (10.0, done.until_ms)}
    [figures] = store.group_figures(queue, ["acme"])
    assert figures.weight == 2.0  # the configured weight is untouched
    assert controls.unboost(held, "acme") == [controls.Boost(queue, "acme")]
    assert controls.unboost(held, "acme") == []  # not boosted: nothing recorded
    assert store.boosts(queue) == {}
    entries = audit.read(held)
    assert [e.action for e in entries] == ["unboost", "boost", "limit"]
    assert (entries[1].actor, entries[1].reason, entries[1].until_ms,
            entries[1].args["weight"]) == ("alice", "launch", done.until_ms, 10.0)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"weight": 0}, InvalidLimit, r"boost weight for group 'acme' must be"),
    ({"weight": "3"}, InvalidLimit, r"got '3'"),
    ({"weight": 3, "queue": "nosuch"}, UnknownQueue, r"no fair queue named nosuch"),
    ({"weight": 3, "for_seconds": 0}, InvalidControl, r"for_seconds must be .* got 0"),
    ({"weight": 3, "reason": "x" * 501}, InvalidControl, r"at most 500"),
])
def test_bad_boosts_are_refused_before_anything_is_written(held: Any, kwargs: dict,
                                                           error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        controls.boost(held, "acme", **kwargs)
    assert store_for(held).boosts(queue_of(held)) == {}
    assert audit.read(held) == []


def test_boost_task_moves_a_held_task_to_the_front_and_refuses_one_not_held(
        held: Any) -> None:
    work = held.tasks["proj.work"]
    last = [work.delay("acme", f"w{i}").id for i in range(3)][-1]
    done = controls.boost_task(held, last, reason="vip")
    assert (done.task_id, done.group) == (last, "acme")
    assert store_for(held).locate(last).place.position == 1
    assert [(e.action, e.args.get("task")) for e in audit.read(held)] == [("boost", last)]
    with pytest.raises(InvalidControl, match=r"task 'nope' is not held \(unknown"):
        controls.boost_task(held, "nope")
    later = work.apply_async(("acme", "later"), countdown=60).id
    with pytest.raises(InvalidControl, match=r"is not held \(delayed\)"):
        controls.boost_task(held, later)


def test_cli_boost_reset_task_and_the_status_marker(held: Any) -> None:
    queue = queue_of(held)
    result = cli(held, "boost", "acme", "--weight", "10", "--for", "1h", "--reason", "vip")
    assert result.exit_code == 0 and result.output.startswith(
        f"boosted group acme in queue {queue}: weight 10 until "), result.output
    assert "boost 10 until " in cli(held, "status").output
    assert "boost 10 until " in cli(held, "groups").output
    [doc] = json.loads(cli(held, "groups", "--json").output)["queues"]
    assert doc["groups"][0]["boosted"]["weight"] == 10.0
    assert cli(held, "boost", "acme", "--reset").output == \
        f"boost ended: group acme in queue {queue}\n"
    assert cli(held, "boost", "acme", "--reset").output == "nothing to end: not boosted\n"
    assert "boost" not in cli(held, "groups").output
    task_id = held.tasks["proj.work"].delay("acme", "y").id
    assert cli(held, "boost", "--task", task_id).output == \
        f"boosted task {task_id}: front of group acme in queue {queue}\n"
    for args, named in ((["boost", "acme"], "--weight is required"),
                        (["boost", "acme", "--weight", "0"], "--weight"),
                        (["boost", "acme", "--weight", "2", "-Q", "nosuch"], "'-Q'"),
                        (["boost", "--task", task_id, "--weight", "2"], "--task takes no"),
                        (["boost", "acme", "--reset", "--weight", "2"], "--reset takes no"),
                        (["boost", "bad\x00g", "--weight", "2"], "'GROUP'")):
        result = cli(held, *args)
        assert result.exit_code in (1, 2) and named in result.output, (args, result.output)
    result = cli(held, "boost", "--task", "nope")
    assert result.exit_code == 1 and "is not held" in result.output


def test_a_boosted_group_gets_about_three_dispatches_to_one_until_it_expires(
        app: Any, worker: Any, dispatcher: Any) -> None:
    work, ledger = app.tasks["proj.work"], app.ledger
    with worker(concurrency=2):
        wait_capacity(app)
        for i in range(70):  # acme is still backlogged after the boost, however late
            work.delay("acme", f"a{i}", 0.05)
            if i < 50:
                work.delay("globex", f"g{i}", 0.05)
        [boosted] = controls.boost(app, "acme", weight=3, for_seconds=1.0)
        with dispatcher(app):
            wait_for(lambda: settled(app), what="both backlogs done")
    entries = audit.read(app)
    actions = [(e.action, e.args["group"], e.args.get("of")) for e in entries]
    assert actions == [("expire", "acme", "boost"), ("boost", "acme", None)]
    ended_ms = entries[0].at_ms  # at the first dispatcher step past its end
    assert boosted.until_ms <= ended_ms <= boosted.until_ms + 1500
    starts = sorted(ledger.starts(), key=lambda s: s["t"])
    during = [s["group"] for s in starts if s["t"] * 1000 < boosted.until_ms - 100]
    after = [s["group"] for s in starts if s["t"] * 1000 > ended_ms + 100]
    after = after[:max(i for i, g in enumerate(after) if g == "acme")]  # both backlogged
    assert len(during) >= 12 and 2.0 <= during.count("acme") / during.count("globex") <= 4.5, \
        during
    assert len(after) >= 12 and 0.6 <= after.count("acme") / after.count("globex") <= 1.7, \
        after
