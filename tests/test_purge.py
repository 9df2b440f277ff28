"""`fair held` and `fair purge` end to end with a real worker and dispatcher: a group's
held tasks are listed (ids, names, ages), then purged: each becomes REVOKED, while the
group's running task finishes and releases its slot as usual (purge frees nothing that
runs), and other groups are untouched."""

from __future__ import annotations

import json
import subprocess

from celery_fair import controls
from celery_fair.task import store_for

from .conftest import subprocess_env, wait_for
from .helpers import held, held_chord, queue_of, snapshot, wait_settled
from .procs import CELERY, ROOT


def test_fair_held_lists_and_fair_purge_revokes_after_confirmation(app, redis_server,
                                                                   namespace):
    work = app.tasks["proj.work"]
    waiting = [work.delay("acme", f"a{i}") for i in range(3)]
    waiting.insert(0, work.apply_async(("acme", "urgent"), fair_interactive=True))
    other = work.delay("globex", "g")
    env = subprocess_env({}, redis_server.url + "/0", namespace)

    def fair(*args: str, answer: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([CELERY, "-A", "tests.proj", "fair", *args], cwd=ROOT, env=env,
                              input=answer, capture_output=True, text=True, timeout=60)

    listed = fair("held", "acme", "--json", "-Q", queue_of(app))
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["task_id"] for r in rows] == [r.id for r in waiting]  # the next to run first
    assert [r["class"] for r in rows] == \
        ["interactive"] + ["background"] * 3
    assert {r["name"] for r in rows} == {"proj.work"}
    assert all(0 <= r["age"] < 60 for r in rows)
    table = fair("held", "acme", "--limit", "2")
    assert table.returncode == 0 and waiting[1].id in table.stdout
    assert waiting[2].id not in table.stdout and "proj.work" in table.stdout

    refused = fair("purge", "acme", answer="n\n")  # asked, and declined
    assert "Purge 4 held tasks of group acme" in refused.stdout
    assert refused.returncode == 1 and held(app) == {"acme": 4, "globex": 1}
    assert store_for(app).audit_read() == []  # declined: nothing done, nothing recorded
    done = fair("purge", "acme", "--reason", "runaway backlog", answer="y\n")
    assert done.returncode == 0, done.stderr
    assert "purged 4 held tasks of group acme" in done.stdout
    assert [r.state for r in waiting] == ["REVOKED"] * 4
    assert held(app) == {"globex": 1} and other.state == "PENDING"
    [entry] = store_for(app).audit_read()  # the purge, with its reason, in the audit log
    assert (entry.action, entry.reason, entry.args["group"], entry.args["removed"]) == \
        ("purge", "runaway backlog", "acme", 4)


def test_purge_leaves_a_running_task_and_its_slot_alone(make_app, worker, dispatcher):
    app = make_app(fair_max_inflight=1, task_track_started=True)
    work = app.tasks["proj.work"]
    with worker(the_app=app, concurrency=1), dispatcher(app):
        running = work.delay("acme", "running", 2.0)
        wait_for(lambda: running.state == "STARTED", what="acme's first task running")
        waiting = [work.delay("acme", f"a{i}") for i in range(3)]
        other = work.delay("globex", "g")
        purged = controls.purge(app, "acme", klass="background", batch=2)  # two batches
        assert sorted(c.task_id for c in purged) == sorted(r.id for r in waiting)
        assert [r.state for r in waiting] == ["REVOKED"] * 3
        assert snapshot(app)["inflight"] == 1  # the running task keeps its slot
        assert running.state == "STARTED"
        assert running.get(timeout=30) == "running"  # it finishes and frees its slot
        assert other.get(timeout=30) == "g"
        wait_settled(app)
    assert app.ledger.runs() == {"running": 1, "g": 1}


def test_held_and_purge_refuse_bad_input_before_anything_changes(app, redis_server,
                                                                  namespace):
    app.tasks["proj.work"].delay("acme", "x")
    env = subprocess_env({}, redis_server.url + "/0", namespace)
    done = subprocess.run([CELERY, "-A", "tests.proj", "fair", "purge", "acme", "--yes",
                           "-Q", "nowhere"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "nowhere" in done.stderr
    assert held(app) == {"acme": 1}
    for bad in ({"klass": "urgent"}, {"limit": 0}):
        try:
            controls.held(app, "acme", **bad)
        except ValueError as exc:
            assert repr(next(iter(bad.values()))) in str(exc)
        else:
            raise AssertionError(f"{bad} accepted")
    assert [t.task_id for t in controls.purge(app, "acme")] and held(app) == {}


def test_purging_a_chords_held_members_fails_the_chord_as_revoke_does(make_app, worker,
                                                                        dispatcher):
    app = make_app()
    result, errback = held_chord(app)
    assert held(app) == {"acme": 2}
    assert len(controls.purge(app, "acme")) == 2
    assert [r.state for r in result.parent.results] == ["REVOKED", "REVOKED"]
    # as on revoke(): the chord completes here, its body fails, its errback is held in
    # the group of the part that completed it (published after the purge's last batch)
    assert (result.state, type(result.result).__name__) == ("FAILURE", "ChordError")
    assert held(app) == {"acme": 1}
    with worker(the_app=app, concurrency=1), dispatcher(app):
        assert app.AsyncResult(errback.id).get(timeout=30) == "acme"
    wait_settled(app)
