from __future__ import annotations


def test_delay_get_through_dispatcher(app, worker, dispatcher, ledger):
    add = app.tasks["proj.add"]
    with worker(concurrency=2), dispatcher():
        assert add.delay(2, 3).get(timeout=20) == 5
