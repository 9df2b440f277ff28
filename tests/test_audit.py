"""The audit log of controls (celery_fair.audit): what ``controls.limit`` records (who,
what, why), what it refuses before writing, and ``fair audit`` showing it. Real Redis,
no dispatcher; the log itself on every backend is tests/test_store_contract_audit.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from celery_fair import audit, controls
from celery_fair.errors import InvalidControl
from celery_fair.task import store_for

from .control_helpers import cli, held_fixture  # noqa: F401  (the fixture ``held``)
from .helpers import queue_of


def test_a_limit_change_is_recorded_with_its_actor_and_reason(held: Any) -> None:
    controls.limit(held, "acme", concurrency=2, weight=0.5)
    controls.limit(held, "acme", reset=True, actor="alice", reason="incident 42")
    controls.limit(held, "acme")  # a read: not recorded
    reset, first = audit.read(held)
    queue = queue_of(held)
    assert (first.actor, first.action, first.reason, first.until_ms) == \
        (audit.os_user(), "limit", None, None)
    assert first.args == {"queue": queue, "group": "acme", "concurrency": 2, "weight": 0.5,
                          "in_force": {"cap": 2, "weight": 0.5}}
    assert (reset.actor, reset.reason) == ("alice", "incident 42")
    assert reset.args == {"queue": queue, "group": "acme", "reset": True,
                          "in_force": {"cap": None, "weight": 1.0}}
    assert reset.at_ms >= first.at_ms


@pytest.mark.parametrize("kwargs, match", [
    ({"reason": "x" * (audit.MAX_REASON + 1)}, r"reason must be at most 500 characters"),
    ({"reason": 7}, r"reason must be a text, got int"),
    ({"actor": "  "}, r"actor must be a name of 1 to 200 characters"),
])
def test_a_bad_actor_or_reason_is_refused_before_anything_is_written(
        held: Any, kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidControl, match=match):
        controls.limit(held, "acme", concurrency=1, **kwargs)
    assert store_for(held).group_figures(queue_of(held), ["acme"])[0].cap is None
    assert audit.read(held) == []


def test_fair_audit_shows_the_log_newest_first(held: Any) -> None:
    assert cli(held, "audit").output == "no control recorded yet\n"
    assert cli(held, "limit", "acme", "--concurrency", "3", "--reason", "too busy"
               ).exit_code == 0
    controls.limit(held, "acme", weight=2, actor="bob")
    lines = cli(held, "audit").output.splitlines()
    assert len(lines) == 2
    assert f"  bob  limit queue={queue_of(held)} group=acme weight=2 " in lines[0]
    assert lines[1].endswith("in_force=cap:3,weight:1  reason: too busy")
    assert f"  {audit.os_user()}  limit " in lines[1]
    data = json.loads(cli(held, "audit", "--limit", "1", "--json").output)
    assert [(d["actor"], d["args"]["weight"]) for d in data] == [("bob", 2)]
    assert cli(held, "audit", "--limit", "0").exit_code == 2
