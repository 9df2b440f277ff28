"""celery_fair.controls.limit, the control API behind ``fair limit`` and the Django admin:
what it writes (read back through the store) and what it refuses before writing.
Real Redis, no dispatcher (held tasks stay held)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from celery_fair import InvalidGroup, InvalidLimit, UnknownQueue, controls
from celery_fair.task import store_for

from .helpers import queue_of


def limits_of(app: Any, group: str, queue: str | None = None) -> tuple[Any, float, tuple]:
    figures = store_for(app).group_figures(queue or queue_of(app), [group])[0]
    return figures.cap, figures.weight, figures.limited


@pytest.fixture
def held(app: Any) -> Any:
    """acme holds a task in the app's fair queue: the queue exists."""
    app.tasks["proj.work"].delay("acme", "x")
    return app


def test_limit_sets_cap_and_weight_in_every_queue(held: Any) -> None:
    done = controls.limit(held, "acme", concurrency=2, weight=0.5)
    queue = queue_of(held)
    assert done == [controls.Limit(queue, "acme", 2, 0.5)]
    assert str(done[0]) == f"group acme in queue {queue}: cap 2, weight 0.5"
    assert limits_of(held, "acme") == (2, 0.5, ("cap", "weight"))


def test_limit_leaves_what_is_not_given_and_lifts_a_cap_with_none(held: Any) -> None:
    controls.limit(held, "acme", concurrency=2, weight=3)
    controls.limit(held, "acme", weight=4)
    assert limits_of(held, "acme")[:2] == (2, 4.0)
    controls.limit(held, "acme", concurrency=None)
    assert limits_of(held, "acme")[:2] == (None, 4.0)
    assert controls.limit(held, "acme") == [controls.Limit(queue_of(held), "acme", None, 4.0)]


def test_reset_drops_the_runtime_limits(held: Any) -> None:
    controls.limit(held, "acme", concurrency=0, weight=2)
    controls.limit(held, "acme", reset=True)
    assert limits_of(held, "acme") == (None, 1.0, ())


@pytest.mark.parametrize("kwargs, error, match", [
    ({"concurrency": -1}, InvalidLimit, r"concurrency for group 'acme' must be an integer"),
    ({"concurrency": 2.5}, InvalidLimit, r"got 2\.5"),
    ({"concurrency": True}, InvalidLimit, r"got True"),
    ({"weight": 0}, InvalidLimit, r"weight for group 'acme' must be a finite number"),
    ({"weight": float("nan")}, InvalidLimit, r"got nan"),
    ({"weight": 2, "reset": True}, InvalidLimit, r"cannot be combined"),
    ({"queue": "nosuch", "concurrency": 1}, UnknownQueue,
     r"no fair queue named nosuch; known fair queues: .*q-"),
    ({"queue": [], "concurrency": 1}, UnknownQueue, r"no fair queue named"),
])
def test_bad_requests_are_refused_before_anything_is_written(held: Any, kwargs: dict,
                                                              error: type, match: str) -> None:
    controls.limit(held, "acme", weight=3)
    with pytest.raises(error, match=match):
        controls.limit(held, "acme", **kwargs)
    assert limits_of(held, "acme") == (None, 3.0, ("weight",))
    assert store_for(held).queues() == [queue_of(held)]  # no queue made up


def test_a_bad_group_is_refused(held: Any) -> None:
    with pytest.raises(InvalidGroup):
        controls.limit(held, "bad\x00group", concurrency=1)


def test_create_sets_limits_ahead_of_a_queues_first_task(app: Any) -> None:
    with pytest.raises(UnknownQueue, match="no fair queue has held a task yet"):
        controls.limit(app, "acme", concurrency=1)
    assert controls.limit(app, "acme", queue="later", concurrency=1, create=True) == \
        [controls.Limit("later", "acme", 1, 1.0)]
    assert limits_of(app, "acme", "later")[0] == 1


@pytest.mark.parametrize("text, parsed", [
    ("", controls.UNCHANGED), (" 3 ", 3), ("none", None), ("NONE", None), ("0", 0)])
def test_parse_concurrency(text: str, parsed: Any) -> None:
    assert controls.parse_concurrency(text) == parsed


@pytest.mark.parametrize("text, match", [
    ("lots", r"concurrency must be an integer from 0 to 1_000_000, got 'lots' \(or 'none'\)"),
    ("-1", r"got '-1'"), ("2.5", r"got '2.5'")])
def test_parse_concurrency_names_what_was_typed(text: str, match: str) -> None:
    with pytest.raises(InvalidLimit, match=match):
        controls.parse_concurrency(text)


def test_parse_weight() -> None:
    assert controls.parse_weight("") is controls.UNCHANGED
    assert controls.parse_weight("0.5") == 0.5
    with pytest.raises(InvalidLimit, match=r"weight of acme must be .*, got 1e7$"):
        controls.parse_weight("1e7", "weight of acme")
    with pytest.raises(InvalidLimit, match=r"got heavy$"):
        controls.parse_weight("heavy")


@pytest.mark.parametrize("text", ["²", "٣", "1.5", "-1", "two"])
def test_a_burst_or_concurrency_that_is_not_ascii_digits_is_refused_naming_it(text: str) -> None:
    """'²'.isdigit() is True but int('²') fails: checked as typed, never a ValueError."""
    with pytest.raises(InvalidLimit, match=re.escape(repr(text))):
        controls.parse_burst(text)
    if text not in ("-1", "1.5"):  # those reach the cap's own check
        with pytest.raises(InvalidLimit, match="concurrency"):
            controls.parse_concurrency(text)


def test_flowers_limit_action_refuses_a_reset_with_values_and_a_bad_burst() -> None:
    from celery_fair.contrib.flower_controls import ACTIONS

    with pytest.raises(InvalidLimit, match="reset takes no weight, burst"):
        ACTIONS["limit"](None, {"group": "a", "reset": "on", "weight": "2", "burst": "3"}, "u")
    with pytest.raises(InvalidLimit, match="burst must be an integer from 1, got '²'"):
        ACTIONS["limit"](None, {"group": "a", "rate": "5/s", "burst": "²"}, "u")
