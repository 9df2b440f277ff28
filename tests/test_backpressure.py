"""Backpressure end to end (fair_group_max_held): with the real app, a publish past a
group's limit raises GroupFull from ``delay()`` naming the group, its count and the limit;
nothing of that task is written anywhere (store, result backend), its group's held tasks
stay, and other groups (one with an override) hold as before. A dispatched task no longer
counts, so the group takes work again as its backlog drains."""

from __future__ import annotations

import pytest

from celery_fair import GroupFull
from celery_fair.task import store_for

from .helpers import held, queue_of, wait_settled


def test_delay_past_the_limit_raises_group_full_and_writes_nothing(make_app, worker,
                                                                   dispatcher):
    app = make_app(fair_group_max_held=2, fair_group_max_held_overrides={"globex": 3})
    work = app.tasks["proj.work"]
    kept = [work.delay("acme", f"a{i}") for i in range(2)]
    with pytest.raises(GroupFull, match=f"group 'acme' is full in fair queue "
                                        f"'{queue_of(app)}': it holds 2 tasks, its limit "
                                        "is 2 .*not held"):
        work.apply_async(("acme", "refused"), task_id="refused-1")
    store = store_for(app)
    assert store.locate("refused-1") is None
    # no PENDING orphan: the result backend never heard of the refused task
    assert app.backend.get(app.backend.get_key_for_task("refused-1")) is None
    assert held(app) == {"acme": 2}
    for i in range(3):  # globex's override is 3; acme's state does not matter to it
        work.delay("globex", f"g{i}")
    with pytest.raises(GroupFull, match="group 'globex' .* limit is 3"):
        work.delay("globex", "refused")
    assert held(app) == {"acme": 2, "globex": 3}
    with worker(concurrency=2), dispatcher():
        assert [r.get(timeout=30) for r in kept] == ["a0", "a1"]
        wait_settled(app)
    assert work.delay("acme", "again").id  # room again
    assert app.ledger.runs().get("refused") is None


def test_group_full_keeps_its_fields_through_pickle():
    import pickle

    full = GroupFull(queue="celery", group="acme", count=5, limit=5)
    again = pickle.loads(pickle.dumps(full))
    assert (again.queue, again.group, again.count, again.limit, str(again)) == \
        ("celery", "acme", 5, 5, str(full))


def test_the_settings_page_shows_the_real_group_full_message():
    from pathlib import Path

    page = (Path(__file__).parent.parent / "docs" / "settings.md").read_text()
    shown = page.split("celery_fair.errors.GroupFull: ", 1)[1].split("```", 1)[0]
    full = GroupFull(queue="celery", group="acme", count=50000, limit=50000)
    assert " ".join(shown.split()) == str(full)
