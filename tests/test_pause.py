"""Pause and resume (``controls.pause``/``resume``, ``fair pause``/``fair resume``): what
they write and refuse (real Redis, no dispatcher), ``fair inspect`` of a paused task, and
end to end with a real worker and dispatcher: no dispatch of a paused group while another
group runs, resume, and a pause --for that ends by itself with both events in the audit
log. The store's part on every backend: tests/test_store_contract_pause.py."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from celery_fair import audit, controls
from celery_fair.errors import InvalidControl, UnknownQueue
from celery_fair.task import store_for

from .conftest import wait_for
from .control_helpers import cli, held_fixture  # noqa: F401  (the fixture ``held``)
from .helpers import queue_of, settled


def test_pause_and_resume_a_group_and_a_queue_with_the_audit_log(held: Any) -> None:
    queue, store = queue_of(held), store_for(held)
    before = int(time.time() * 1000)
    [done] = controls.pause(held, "acme", for_seconds=3600, reason="incident 42",
                            actor="alice")
    assert (done.queue, done.group) == (queue, "acme")
    assert before + 3_600_000 <= done.until_ms <= int(time.time() * 1000) + 3_600_000
    assert store.pauses(queue) == {"acme": done.until_ms}
    assert controls.pause(held, queue=queue) == [controls.Pause(queue, None)]
    assert str(controls.Pause(queue, None)) == f"queue {queue}"
    assert controls.resume(held, "acme") == [controls.Pause(queue, "acme")]
    assert controls.resume(held, "acme") == []  # not paused: nothing recorded
    assert controls.resume(held, queue=queue) == [controls.Pause(queue, None)]
    assert store.pauses(queue) == {}
    entries = audit.read(held)
    assert [(e.action, e.args["group"]) for e in entries] == [
        ("resume", None), ("resume", "acme"), ("pause", None), ("pause", "acme")]
    assert (entries[-1].actor, entries[-1].reason, entries[-1].until_ms) == \
        ("alice", "incident 42", done.until_ms)


@pytest.mark.parametrize("kwargs, error, match", [
    ({}, UnknownQueue, r"name a group to pause, or a queue to pause whole"),
    ({"group": "acme", "queue": "nosuch"}, UnknownQueue, r"no fair queue named nosuch"),
    ({"group": "acme", "for_seconds": 0}, InvalidControl, r"for_seconds must be .* got 0"),
    ({"group": "acme", "for_seconds": float("nan")}, InvalidControl, r"got nan"),
    ({"group": "acme", "for_seconds": 400 * 86400}, InvalidControl, r"366 days"),
    ({"group": "acme", "reason": "x" * 501}, InvalidControl, r"at most 500"),
])
def test_bad_pauses_are_refused_before_anything_is_written(held: Any, kwargs: dict,
                                                           error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        controls.pause(held, **kwargs)
    assert store_for(held).pauses(queue_of(held)) == {}
    assert audit.read(held) == []


@pytest.mark.parametrize("text, seconds", [("90", 90), ("30m", 1800), ("1.5h", 5400),
                                           ("2d", 172800), (" 10s ", 10)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert controls.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "-1m", "0", "soon", "400d", "inf"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(InvalidControl, match="duration must be seconds or a number"):
        controls.parse_duration(text)


def test_cli_pause_resume_and_inspect_says_paused(held: Any) -> None:
    queue = queue_of(held)
    task_id = held.tasks["proj.work"].delay("acme", "y").id
    result = cli(held, "pause", "acme", "--for", "1h", "--reason", "incident")
    assert result.exit_code == 0 and result.output.startswith(
        f"paused group acme in queue {queue} until "), result.output
    text = cli(held, "inspect", task_id).output
    assert "paused (group): it waits until " in text and "dispatches before it" not in text
    assert cli(held, "resume", "acme").output == f"resumed group acme in queue {queue}\n"
    assert "about 1 dispatches before it" in cli(held, "inspect", task_id).output
    assert cli(held, "pause", "-Q", queue).output == f"paused queue {queue}\n"
    assert "paused (queue): it waits until fair resume" in cli(held, "inspect", task_id).output
    cli(held, "pause", "acme")
    status = cli(held, "status").output
    assert f"queue {queue}: PAUSED until fair resume" in status and "acme (paused)" in status
    groups = cli(held, "groups").output
    assert "(PAUSED)" in groups and "acme (paused)" in groups
    [doc] = json.loads(cli(held, "groups", "--json").output)["queues"]
    assert (doc["paused"], doc["groups"][0]["paused"]) == ({"until_ms": None}, True)
    assert cli(held, "resume", "-Q", queue).output == f"resumed queue {queue}\n"
    assert cli(held, "resume", "-Q", queue).output == "nothing to resume: not paused\n"
    cli(held, "resume", "acme")
    assert "paused" not in cli(held, "status").output.lower()
    for args, named in ((["pause"], "'-Q' / '--queue'"), (["pause", "acme", "-Q", "nosuch"],
                        "'-Q' / '--queue'"), (["pause", "acme", "--for", "soon"], "'--for'"),
                        (["pause", "bad\x00g"], "'GROUP'")):
        result = cli(held, *args)
        assert result.exit_code == 2 and named in result.output, (args, result.output)


def test_no_dispatch_of_a_paused_group_until_resume_and_a_pause_for_ends_itself(
        app: Any, worker: Any, dispatcher: Any) -> None:
    work, preview, ledger = app.tasks["proj.work"], app.tasks["proj.preview"], app.ledger

    def starts(group: str) -> list[str]:
        return [s["label"] for s in ledger.starts() if s["group"] == group]

    with worker(concurrency=4), dispatcher(app):
        work.delay("acme", "running", 1.0)
        wait_for(lambda: starts("acme") == ["running"], what="acme's first task running")
        controls.pause(app, "acme", reason="incident")
        for i in range(2):  # held while paused, both classes
            work.delay("acme", f"b{i}")
            preview.delay("acme", f"i{i}")
        for i in range(4):
            work.delay("globex", f"g{i}", 0.1)
        wait_for(lambda: len(starts("globex")) == 4 and ledger.ends() >= 5,
                 what="globex done and acme's running task finished while acme is paused")
        assert starts("acme") == ["running"]  # nothing of acme dispatched meanwhile
        controls.resume(app, "acme")
        wait_for(lambda: settled(app), what="acme's held tasks done after resume")
        assert sorted(starts("acme")) == ["b0", "b1", "i0", "i1", "running"]

        [paused] = controls.pause(app, "acme", for_seconds=1.0)
        work.delay("acme", "later")
        wait_for(lambda: "later" in starts("acme"), what="the pause ended by itself")
        [started] = [s["t"] for s in ledger.starts() if s["label"] == "later"]
        assert started * 1000 >= paused.until_ms
    actions = [(e.action, e.args["group"]) for e in audit.read(app)]
    assert actions[:2] == [("expire", "acme"), ("pause", "acme")]
    assert actions[2:] == [("resume", "acme"), ("pause", "acme")]
