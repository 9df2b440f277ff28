"""Flower integration (celery_fair/contrib/flower.py), end to end.

A real Flower (``celery -A tests.proj flower``, enabled from a flowerconfig.py, basic auth
on) runs against real Redis while a real dispatcher keeps the summary; the tests read its
page, JSON, Broker page and /metrics, and one drives the page in headless Chromium (the
system's ``chromium``, through Playwright) and saves a screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_fair import cancel, controls, position
from celery_fair.config import reset_config
from celery_fair.contrib.flower import format_wait
from celery_fair.limits import Rate
from celery_fair.metrics import OTHER, store_families
from celery_fair.summary import read_summaries
from celery_fair.task import store_for
from celery_fair.testing import RedisServer, free_port

from .browser import artifacts, chromium
from .conftest import DispatcherThread, wait_for
from .helpers import groups, snapshot
from .procs import CeleryProcess
from .proj import create_app

USER, PASSWORD = "fair", "s3cret"
CONF = {"fair_max_inflight": 2, "fair_group_concurrency": {"acme": 1},
        "fair_group_weights": {"big": 2}, "fair_lease_seconds": 600}


class FlowerSite:
    """A running Flower and the app whose fair queue it shows."""

    def __init__(self, app: Any, url: str, held_at: dict[str, tuple[float, float]]) -> None:
        self.app = app
        self.url = url
        self.queue = str(app.conf.task_default_queue)
        self.held_at = held_at  # group -> time range of its first hold

    def get(self, path: str, auth: bool = True) -> tuple[int, str]:
        return self._open(urllib.request.Request(self.url + path), auth)

    def post(self, path: str, fields: dict[str, str], headers: dict[str, str] | None = None,
             auth: bool = True) -> tuple[int, str]:
        request = urllib.request.Request(self.url + path, method="POST",
                                         data=urllib.parse.urlencode(fields).encode(),
                                         headers=headers or {})
        return self._open(request, auth)

    def _open(self, request: urllib.request.Request, auth: bool) -> tuple[int, str]:
        if auth:
            token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def summary(self) -> dict[str, Any]:
        summary = read_summaries(store_for(self.app))[self.queue]
        assert summary is not None, "no summary in Redis"
        return summary


def _hold(app: Any) -> dict[str, tuple[float, float]]:
    """big 10 background; acme 3 background + 1 interactive; small 2 background."""
    work, preview = app.tasks["proj.work"], app.tasks["proj.preview"]
    held_at: dict[str, tuple[float, float]] = {}
    for group, count in (("acme", 3), ("big", 10), ("small", 2)):
        # A group's head is its first task, or its second when the first was dispatched.
        before = time.time()
        work.delay(group, f"{group}-0")
        work.delay(group, f"{group}-1")
        held_at[group] = (before, time.time())
        for i in range(2, count):
            work.delay(group, f"{group}-{i}")
    preview.delay("acme", "preview")
    return held_at


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlowerSite]:
    server = RedisServer()
    namespace = "fl" + uuid.uuid4().hex[:8]
    url = server.url + "/0"
    app = create_app(url, namespace, "q-" + namespace, **CONF)
    reset_config(app)
    held_at = _hold(app)
    # a second fair queue no dispatcher serves: the page warns about its held task
    app.tasks["proj.work"].apply_async(("acme", "unserved"), queue=_unserved(app))
    tmp = tmp_path_factory.mktemp("flower")
    config = tmp / "flowerconfig.py"
    config.write_text("from celery_fair.contrib.flower import enable\n\nenable()\n")
    port = free_port()
    flower = CeleryProcess(["flower", f"--port={port}", "--address=127.0.0.1",
                            f"--conf={config}", f"--basic-auth={USER}:{PASSWORD}"],
                           CONF, url, namespace, tmp / "flower.log")
    try:
        with DispatcherThread(app, queues=[app.conf.task_default_queue]):
            # No worker consumes the queue: the dispatcher fills its 2 slots and stops.
            wait_for(lambda: (read_summaries(store_for(app)).get(app.conf.task_default_queue)
                              or {}).get("inflight") == 2, what="the summary (2 in flight)")
            running = FlowerSite(app, f"http://127.0.0.1:{port}", held_at)
            wait_for(lambda: _up(running, flower), timeout=60, interval=0.2,
                     what="Flower to answer")
            yield running
    finally:
        code = flower.stop()
        print(flower.output())
        server.stop()
        assert code in (0, -15, None), flower.output()


def _unserved(app: Any) -> str:
    return f"{app.conf.task_default_queue}-unserved"


def _up(site: FlowerSite, flower: CeleryProcess) -> bool:
    if not flower.alive():
        raise AssertionError("Flower exited:\n" + flower.output())
    try:
        return site.get("/healthcheck", auth=False)[0] == 200
    except OSError:
        return False


def test_pages_and_api_need_flowers_auth(site: FlowerSite) -> None:
    for path in ("/fair-queues", "/api/fair/queues", "/api/queues/length", "/broker"):
        assert site.get(path, auth=False)[0] == 401, path
        assert site.get(path)[0] == 200, path


def test_json_api_serves_the_dispatchers_summary(site: FlowerSite) -> None:
    status, text = site.get("/api/fair/queues")
    assert status == 200
    served = json.loads(text)["queues"][site.queue]
    stored = site.summary()
    served_groups = {g["group"]: g for g in served["groups"]}
    for name, g in groups(site.app).items():
        for field in ("held_interactive", "held_background", "inflight", "cap", "weight"):
            assert served_groups[name][field] == g[field], (name, field)
    assert served["inflight"] == snapshot(site.app)["inflight"] == 2
    assert (served["held_interactive"], served["held_background"]) == \
        (stored["held_interactive"], stored["held_background"]) == (0, 14)
    assert served["capacity"] == 2


#: What every surface says about a queue with held work and no live dispatcher; the app
#: as Flower was started (``celery -A tests.proj flower``).
UNSERVED_WARNING = ("no live dispatcher for queue {} with 1 held: those tasks do not run "
                    "until one starts; start one with `celery -A tests.proj fair dispatch`")


def test_page_and_api_show_live_dispatchers_and_warn_about_an_unserved_queue(
        site: FlowerSite) -> None:
    warning = UNSERVED_WARNING.format(_unserved(site.app))
    status, text = site.get("/api/fair/queues")
    assert status == 200
    served = json.loads(text)
    [beat] = served["dispatchers"]  # the DispatcherThread of this process
    assert (beat["pid"], beat["queues"], beat["every_queue"]) == \
        (os.getpid(), [site.queue], False)
    assert served["warning"] == warning
    status, html = site.get("/fair-queues")
    assert status == 200
    assert "Live dispatchers: 1" in html
    row = re.search(rf'<tr class="fair-dispatcher" data-dispatcher="{re.escape(beat["id"])}">'
                    r'(.*?)</tr>', html, re.S)
    assert row is not None and f'<td data-field="pid">{os.getpid()}</td>' in row.group(1)
    assert f'fair-liveness-warning" role="alert">{warning}</div>' in html, html


def test_queue_lengths_and_broker_page_show_holding_depth(site: FlowerSite) -> None:
    status, text = site.get("/api/queues/length")
    assert status == 200
    queues = {q["name"]: q for q in json.loads(text)["active_queues"]}
    ours = queues[site.queue]
    assert ours["fair_held"] == 14 and ours["fair_inflight"] == 2 and ours["fair_delayed"] == 0
    assert ours["messages"] == 2  # the two dispatched messages wait in the real queue
    status, html = site.get("/broker")
    assert status == 200
    assert "Held (fair)" in html
    row = re.search(rf'<tr id="{re.escape(site.queue)}">(.*?)</tr>', html, re.S)
    assert row is not None and "<td>14</td>" in row.group(1), html


def test_metrics_carry_the_summary(site: FlowerSite) -> None:
    """Flower's /metrics has the dispatcher's store-wide families (same names, labels and
    help: one definition), filled from the summary, plus the summary's own gauges."""
    status, text = site.get("/metrics", auth=False)  # Flower serves /metrics unauthenticated
    assert status == 200
    q = site.queue
    shown = groups(site.app)
    expected = {
        f'celery_fair_held_tasks{{class="background",group="big",queue="{q}"}}':
            float(shown["big"]["held_background"]),
        f'celery_fair_held_tasks{{class="interactive",group="acme",queue="{q}"}}':
            float(shown["acme"]["held_interactive"]),
        f'celery_fair_held_tasks{{class="background",group="{OTHER}",queue="{q}"}}': 0.0,
        f'celery_fair_inflight_tasks{{group="{OTHER}",queue="{q}"}}': 0.0,
        f'celery_fair_group_cap{{group="acme",queue="{q}"}}': 1.0,
        f'celery_fair_group_weight{{group="big",queue="{q}"}}': 2.0,
        f'celery_fair_delayed_tasks{{queue="{q}"}}': 0.0,
        f'celery_fair_capacity{{queue="{q}"}}': 2.0,
        f'celery_fair_active_groups{{queue="{q}"}}': 3.0,
        f'celery_fair_released_total{{queue="{q}"}}': 0.0,
        f'celery_fair_skipped_total{{queue="{q}"}}': 0.0,
        f'celery_fair_summary_up{{queue="{q}"}}': 1.0,
        f'celery_fair_dispatchers{{queue="{q}"}}': 1.0,
        f'celery_fair_dispatchers{{queue="{_unserved(site.app)}"}}': 0.0,
    }
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines()
                   if line.startswith("celery_fair_"))
    for name, value in expected.items():
        assert float(samples[name]) == value, name
    held = [float(v) for k, v in samples.items() if k.startswith("celery_fair_held_tasks{")]
    inflight = [float(v) for k, v in samples.items()
                if k.startswith("celery_fair_inflight_tasks{")]
    assert (sum(held), sum(inflight)) == (14.0, 2.0)
    assert f'celery_fair_ready_groups{{class="background",queue="{q}"}}' in samples
    assert "celery_fair_group_cap{" + f'group="big",queue="{q}"}}' not in samples  # no cap
    for family in store_families().values():  # the dispatcher's definitions
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"# HELP {name} {family.documentation}\n" in text, name
        assert f"# TYPE {name} {family.type}\n" in text, name
    wait = float(samples[f'celery_fair_oldest_wait_seconds{{queue="{q}"}}'])
    assert 0 < wait <= time.time() - site.held_at["acme"][0]
    for old in ("celery_fair_held{", "celery_fair_groups{", "celery_fair_group_held{"):
        assert old not in text  # the names Flower used before the dispatcher's
    assert "flower_" in text  # Flower's own metrics are still there


def test_page_in_a_real_browser(site: FlowerSite, tmp_path: Path) -> None:
    from playwright.sync_api import Error as PlaywrightError

    with chromium() as browser:
        # Without credentials Flower answers 401 and Chromium gives up on the page.
        anonymous = browser.new_page()
        with pytest.raises(PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS"):
            anonymous.goto(site.url + "/fair-queues")
        context = browser.new_context(
            http_credentials={"username": USER, "password": PASSWORD},
            viewport={"width": 1400, "height": 900})
        page = context.new_page()
        loaded_at = time.time()
        assert page.goto(site.url + "/fair-queues").status == 200
        shown = _read_page(page, site.queue)
        warning = page.locator(".fair-liveness-warning")
        assert warning.inner_text() == UNSERVED_WARNING.format(_unserved(site.app))
        assert warning.is_visible()
        assert page.locator("tr.fair-dispatcher").count() == 1
        shot = artifacts(tmp_path) / "flower-fair-queues.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")
        liveness_shot = shot.with_name("flower-liveness.png")
        page.locator(".fair-queues-page").screenshot(path=str(liveness_shot))
        print(f"screenshot (liveness): {liveness_shot}")
        nav = page.locator("a.nav-link", has_text="Fair queues")
        assert nav.get_attribute("aria-current") == "page"
        page.locator("a.nav-link", has_text="Broker").click()
        page.wait_for_url("**/broker")
        assert page.locator("th", has_text="Held (fair)").count() == 1
        broker_shot = shot.with_name("flower-broker.png")
        page.screenshot(path=str(broker_shot), full_page=True)
        print(f"screenshot: {broker_shot}")
    # the page showed a live summary: written by the running dispatcher, within its TTL
    assert loaded_at - 10 <= shown["written_at"] <= time.time()
    _check_against_store(site, shown)
    assert shot.stat().st_size > 10_000


def _read_page(page: Any, queue: str) -> dict[str, Any]:
    section = page.locator(f'section.fair-queue[data-queue="{queue}"]')
    totals = {field: section.locator(f'.fair-totals [data-field="{field}"]').inner_text()
              for field in ("held_interactive", "held_background", "inflight", "capacity",
                            "groups_total")}
    rows = {}
    for row in section.locator("tbody tr[data-group]").all():
        cells = {field: row.locator(f'[data-field="{field}"]').inner_text().strip()
                 for field in ("held_interactive", "held_background", "delayed",
                               "inflight", "weight", "oldest_wait", "head_wait")}
        cells["seconds"] = row.locator('[data-field="oldest_wait"]').get_attribute(
            "data-seconds")
        cells["head_seconds"] = row.locator('[data-field="head_wait"]').get_attribute(
            "data-seconds")
        rows[row.get_attribute("data-group")] = cells
    written_at = float(section.locator(".fair-totals").get_attribute("data-written-at"))
    return {"totals": totals, "groups": rows, "written_at": written_at}


def _check_against_store(site: FlowerSite, shown: dict[str, Any]) -> None:
    snap = snapshot(site.app)
    totals = shown["totals"]
    assert int(totals["held_interactive"]) == sum(g["held_interactive"] for g in snap["groups"])
    assert int(totals["held_background"]) == sum(g["held_background"] for g in snap["groups"])
    assert int(totals["inflight"]) == snap["inflight"] == 2
    assert totals["capacity"] == "2"
    assert int(totals["groups_total"]) == len(snap["groups"]) == 3
    assert set(shown["groups"]) == {"acme", "big", "small"}
    for name, g in groups(site.app).items():
        cells = shown["groups"][name]
        assert int(cells["held_interactive"]) == g["held_interactive"], name
        assert int(cells["held_background"]) == g["held_background"], name
        assert int(cells["delayed"]) == g["delayed"], name
        cap = "∞" if g["cap"] is None else str(g["cap"])
        assert cells["inflight"] == f"{g['inflight']} / {cap}", name
        assert float(cells["weight"]) == g["weight"], name
        # the wait is as of the summary's write, rounded to the millisecond; the hold
        # time it counts from is floored to the millisecond (so up to 1.5 ms off either way)
        seconds = float(cells["seconds"])
        before, after = site.held_at[name]
        written = shown["written_at"]
        assert written - after - 0.0015 <= seconds <= written - before + 0.0015, name
        assert cells["oldest_wait"] == format_wait(seconds), name
        # the head wait: since its head became the head, never longer than the oldest's
        head = float(cells["head_seconds"])
        assert 0 <= head <= seconds and cells["head_wait"] == format_wait(head), name


def test_an_unreachable_store_is_reported_not_raised(make_app) -> None:
    from tornado.ioloop import IOLoop

    from celery_fair.contrib.flower import fetch_summaries

    app = make_app(fair_store_url=f"redis://127.0.0.1:{free_port()}/0")
    summaries, error = IOLoop.current().run_sync(lambda: fetch_summaries(app))
    assert summaries == {}
    assert error is not None and "could not read its store" in error


def test_flower_reads_a_sql_store_under_its_table_prefix(make_app, tmp_path: Path) -> None:
    from tornado.ioloop import IOLoop

    from celery_fair.contrib.flower import fetch_in_force, fetch_summaries
    from celery_fair.store.sql import migrate

    url = f"sqlite:///{tmp_path}/fair.db"
    migrate(url, "ops_")  # the tables are ops_queues, ...: none named fair_*
    app = make_app(fair_store_url=url, fair_store_table_prefix="ops_")
    app.tasks["proj.work"].delay("acme", "x")
    queue = app.conf.task_default_queue
    controls.pause(app, "acme", queue=queue, actor="ann")
    summaries, error = IOLoop.current().run_sync(lambda: fetch_summaries(app))
    assert (error, list(summaries)) == (None, [queue])
    in_force = IOLoop.current().run_sync(lambda: fetch_in_force(app, [queue]))
    assert in_force[queue].pauses["acme"]["by"] == "ann"


def test_waits_are_written_for_people() -> None:
    assert [format_wait(s) for s in (None, 0.25, 12.34, 245, 7260)] == \
        ["-", "250 ms", "12.3 s", "4m 05s", "2h 01m"]


def test_position_api_answers_a_held_tasks_place_behind_flowers_auth(site: FlowerSite) -> None:
    result = site.app.tasks["proj.work"].delay("small", "asks-its-place")
    try:
        path = f"/api/fair/position/{result.id}"
        assert site.get(path, auth=False)[0] == 401
        status, text = site.get(path)
        assert status == 200, text
        served = json.loads(text)
        # no worker runs small's tasks: this one is last of those its group holds
        last = groups(site.app)["small"]["held_background"]
        assert (served["state"], served["in_group"], served["group"]) == ("held", last, "small")
        assert served == position(site.app, result.id).as_json()
        assert json.loads(site.get("/api/fair/position/nobody")[1])["state"] == "not held"
    finally:
        cancel(site.app, result.id)


def test_control_api_needs_auth_refuses_cross_site_posts_and_bad_input(site: FlowerSite) -> None:
    fields = {"queue": site.queue, "group": "acme", "concurrency": "many"}
    assert site.post("/api/fair/limit", fields, auth=False)[0] == 401
    status, _ = site.post("/api/fair/pause", {"queue": site.queue, "group": "acme"},
                          headers={"Sec-Fetch-Site": "cross-site"})
    assert status == 403
    status, _ = site.post("/api/fair/pause", {"queue": site.queue, "group": "acme"},
                          headers={"Origin": "http://evil.example"})
    assert status == 403
    assert site.app and not store_for(site.app).pauses(site.queue)  # neither went through
    status, text = site.post("/api/fair/limit", fields)
    assert status == 400 and "many" in json.loads(text)["error"], text
    status, text = site.post("/api/fair/pause", {"queue": "nope", "group": "acme"})
    assert status == 400 and "nope" in json.loads(text)["error"], text
    status, text = site.post("/api/fair/boost", {"queue": site.queue, "group": "acme",
                                                 "weight": "0"})
    assert status == 400 and "boost weight" in json.loads(text)["error"], text
    assert not store_for(site.app).boosts(site.queue)


@pytest.fixture
def lifted(site: FlowerSite) -> Iterator[None]:
    """Lifts what a test paused or boosted, also when it fails half-way, so that the
    module's other tests start from a queue with nothing in force."""
    yield
    app, q = site.app, site.queue
    store = store_for(app)
    for group in store.pauses(q):
        controls.resume(app, group or None, queue=q)
    for group in store.boosts(q):
        controls.unboost(app, group, queue=q)


@pytest.mark.usefixtures("lifted")
def test_controls_in_a_real_browser(site: FlowerSite, tmp_path: Path) -> None:
    """Each action from the page, confirmed in its dialog, reaches the store and the
    audit log under the Flower user; bad input is refused on the page."""
    app, q, store = site.app, site.queue, store_for(site.app)
    with chromium() as browser:
        context = browser.new_context(
            http_credentials={"username": USER, "password": PASSWORD},
            viewport={"width": 1500, "height": 1000})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        assert page.goto(site.url + "/fair-queues?autorefresh=1").status == 200
        act = _Actions(page, q, errors)
        # the page polls: a pause made elsewhere shows up with no click
        controls.pause(app, "big", queue=q, reason="from python", actor="ops")
        page.locator(f'section[data-queue="{q}"] li.fair-pause[data-group="big"]').wait_for()
        assert act("big", "resume", {}, "resumed group big")
        assert "big" not in store.pauses(q)

        assert act("acme", "pause", {"for": "1h", "reason": "incident 42"}, "paused group acme")
        until = store.pauses(q)["acme"]
        assert until is not None and 3590 < until / 1000 - time.time() <= 3600
        _audited(store, "pause", "incident 42")
        pause_row = page.locator(f'section[data-queue="{q}"] li.fair-pause[data-group="acme"]')
        pause_row.wait_for()  # the page refreshed itself and lists the pause
        assert pause_row.locator('[data-field="reason"]').inner_text() == "incident 42"
        assert pause_row.locator('[data-field="by"]').inner_text() == USER

        assert not act("big", "boost", {"weight": "", "for": "1h"},
                       "boost refused: boost weight is required")
        assert store.boosts(q) == {}  # nothing written
        assert act("big", "boost", {"weight": "5", "for": "1h", "reason": "launch day"},
                   "boosted group big")
        weight, until = store.boosts(q)["big"]
        assert weight == 5.0 and until is not None and 3590 < until / 1000 - time.time() <= 3600
        assert _audited(store, "boost", "launch day").args["weight"] == 5.0
        boost_row = page.locator(f'section[data-queue="{q}"] li.fair-boost[data-group="big"]')
        boost_row.wait_for()
        assert boost_row.locator('[data-field="by"]').inner_text() == USER
        assert boost_row.locator('[data-field="reason"]').inner_text() == "launch day"
        assert act.cell("big", "boost").startswith("boost 5 until ")

        assert not act("big", "limit", {"rate": "fast"}, "limit refused: rate limit")
        assert not act("big", "limit", {"burst": "3"}, "limit refused: a burst")
        assert "big" not in store.rates(q)  # nothing written
        assert act("big", "limit", {"rate": "5/s", "burst": "3"}, "limits now")
        assert store.rates(q)["big"] == Rate(200.0, 3)  # one every 200 ms, 3 at once
        assert controls.limit(app, "big", queue=q)[0].rate == Rate(200.0, 3)
        assert _audited(store, "limit").args["rate"] == "5/s (burst 3)"
        controls.throttle(app, "small", 600, queue=q, actor="ops")  # as after an HTTP 429
        throttled = act.section.locator('tr[data-group="small"] [data-field="throttled"]')
        throttled.wait_for()
        assert throttled.inner_text().startswith("throttled until ")
        assert act.cell("big", "rate") == "rate 5/s (burst 3)"
        shot = artifacts(tmp_path) / "flower-controls.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")
        assert act("big", "limit", {"rate": "none"}, "limits now")
        assert store.rates(q)["big"] is None  # no rate limit, whatever the default

        assert act("big", "unboost", {}, "boost ended: group big")
        assert store.boosts(q) == {}
        _audited(store, "unboost")

        assert act("acme", "resume", {}, "resumed group acme")
        assert "acme" not in store.pauses(q)
        _audited(store, "resume")

        before = controls.limit(app, "big", queue=q)[0]
        assert act("big", "limit", {"concurrency": "1", "weight": "3"}, "limits now")
        assert _limits(app, q, "big") == (1, 3.0)
        _audited(store, "limit")
        assert not act("big", "limit", {"weight": "lots"}, "limit refused: weight")
        assert "lots" in page.locator("#fair-action-result").inner_text()
        assert _limits(app, q, "big") == (1, 3.0)  # unchanged
        assert act("big", "limit", {"reset": True}, "limits now")
        assert controls.limit(app, "big", queue=q)[0] == before
        _audited(store, "limit")

        controls.limit(app, "small", queue=q, reset=True)  # its rate in force unchanged:
        assert "small" in store.throttles(q)  # a task's throttle stays

        held = controls.held_count(app, "small", queue=q)
        assert held > 0
        assert act("small", "purge", {}, f"purged {held} held tasks of group small")
        assert controls.held_count(app, "small", queue=q) == 0
        assert _audited(store, "purge").args["removed"] == held

        assert act(None, "pause", {}, f"paused queue {q}")
        assert store.pauses(q) == {"": None}
        page.locator(f'section[data-queue="{q}"] .fair-queue-paused').wait_for()
        assert act(None, "resume", {}, f"resumed queue {q}")
        assert store.pauses(q) == {}
        _audited(store, "resume")
    assert shot.stat().st_size > 10_000


def test_a_refresh_during_a_press_does_not_lose_the_click(site: FlowerSite) -> None:
    """The page polls and swaps its figures; a swap between a button's press and its
    release would put the release on a new button and lose the click, so a refresh that
    lands while a button is held down keeps the old figures."""
    q = site.queue
    with chromium() as browser:
        context = browser.new_context(
            http_credentials={"username": USER, "password": PASSWORD})
        page = context.new_page()
        assert page.goto(site.url + "/fair-queues?autorefresh=0.2").status == 200
        button = page.locator(f'section.fair-queue[data-queue="{q}"] '
                              'tr[data-group="big"] button[data-fair-action="boost"]')
        page.evaluate("document.addEventListener('pointerdown', function (e) {"
                      " window.fairHeld = e.target.closest('button'); }, true)")
        button.hover()
        page.mouse.down()
        rounds = int(page.locator("#fair-refresh-status").get_attribute("data-rounds") or 0)
        page.wait_for_function(  # two refreshes came back while the button is held
            "n => Number(document.getElementById('fair-refresh-status').dataset.rounds) >= n",
            arg=rounds + 2)
        assert page.evaluate("window.fairHeld.dataset.fairAction") == "boost"
        assert page.evaluate("document.contains(window.fairHeld)")  # not swapped away
        page.mouse.up()
        dialog = page.locator("#fair-confirm")
        dialog.wait_for()  # the click arrived
        assert "Boost group big" in page.locator("#fair-confirm-text").inner_text()
        dialog.locator("#fair-confirm-cancel").click()
        dialog.wait_for(state="hidden")


class _Actions:
    """Clicks an action's button (a group's row, or the queue's header for None), fills
    the confirmation dialog, confirms, and waits for the page's answer."""

    def __init__(self, page: Any, queue: str, errors: list[str]) -> None:
        self.page, self.errors = page, errors
        self.section = page.locator(f'section.fair-queue[data-queue="{queue}"]')

    def __call__(self, group: str | None, action: str, fields: dict[str, Any],
                 expect: str) -> bool:
        """True when the page reports success; its message starts with ``expect``."""
        result = self.page.locator("#fair-action-result")
        self.page.evaluate("document.getElementById('fair-action-result').hidden = true")
        scope = self.section.locator(f'tr[data-group="{group}"]') if group else \
            self.section.locator("h2")
        scope.locator(f'button[data-fair-action="{action}"]').click()
        assert not self.errors, self.errors  # the page's script ran without an error
        dialog = self.page.locator("#fair-confirm")
        dialog.wait_for()
        for name, value in fields.items():
            field = dialog.locator(f'[name="{name}"]:visible')  # this action's field
            field.check() if value is True else field.fill(value)
        dialog.locator("#fair-confirm-ok").click()
        result.wait_for()
        assert result.inner_text().startswith(expect), result.inner_text()
        return "alert-success" in (result.get_attribute("class") or "")

    def cell(self, group: str, field: str) -> str:
        """A cell of the group's row as the page shows it now."""
        row = self.section.locator(f'tr[data-group="{group}"]')
        return str(row.locator(f'[data-field="{field}"]').inner_text()).strip()


def _limits(app: Any, queue: str, group: str) -> tuple[int | None, float]:
    [now] = controls.limit(app, group, queue=queue)  # no number: reads only
    return now.cap, now.weight


def _audited(store: Any, action: str, reason: str | None = None) -> Any:
    [entry] = store.audit_read(1)
    assert (entry.action, entry.actor) == (action, USER), entry
    if reason is not None:
        assert entry.reason == reason
    return entry


def test_the_actor_is_the_flower_user() -> None:
    from types import SimpleNamespace

    from celery_fair.contrib.flower_controls import flower_user

    def handler(user: Any, authorization: str = "") -> Any:
        return SimpleNamespace(current_user=user, request=SimpleNamespace(
            headers={"Authorization": authorization} if authorization else {}))

    basic = "Basic " + base64.b64encode(b"alice:pw").decode()
    assert flower_user(handler("bob@example.com", basic)) == "bob@example.com"  # OAuth
    assert flower_user(handler(True, basic)) == "alice"  # basic auth only
    assert flower_user(handler(True, "Basic !!!")) == "flower"
    assert flower_user(handler(True)) == "flower"


class _AuditSpy:
    """A store whose ``audit_read`` calls are counted (their ``limit``)."""

    def __init__(self, store: Any) -> None:
        self.store, self.reads = store, []  # type: list[int]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def audit_read(self, limit: int = 100, since_ms: int | None = None) -> Any:
        self.reads.append(limit)
        return self.store.audit_read(limit, since_ms)


def test_who_set_a_pause_or_boost_is_read_from_the_audit_log_only_when_it_changed(
        site: FlowerSite) -> None:
    """The page's refresh reads the audit log's newest entry while a pause or boost is in
    force, and older entries only when the log changed since the last refresh."""
    from celery_fair.contrib.flower_state import (
        AUDIT_DEPTH,
        AUDIT_STEP,
        ControlNotes,
        read_in_force,
    )

    app, q = site.app, site.queue
    spy, notes = _AuditSpy(store_for(app)), ControlNotes()

    def shown() -> Any:
        spy.reads.clear()
        return read_in_force(spy, [q], notes)[q]

    try:
        assert (shown().pauses, spy.reads) == ({}, [])  # nothing in force: no audit read
        controls.pause(app, "small", queue=q, reason="first", actor="ann")
        assert shown().pauses["small"] == {"until": None, "by": "ann", "reason": "first"}
        assert spy.reads == [1, AUDIT_STEP]  # the first read: back to the step's depth
        assert shown().pauses["small"]["by"] == "ann" and spy.reads == [1]  # unchanged log
        controls.boost(app, "small", weight=4, queue=q, for_seconds=60, actor="bob")
        now = shown()
        assert (now.boosts["small"]["weight"], now.boosts["small"]["by"]) == (4.0, "bob")
        assert now.boosts["small"]["until"] is not None
        assert now.pauses["small"]["by"] == "ann" and spy.reads == [1, AUDIT_STEP]
        controls.pause(app, "small", queue=q, actor="cy")  # paused again: cy's pause now
        assert shown().pauses["small"]["by"] == "cy"
        for _ in range(AUDIT_STEP):  # more entries than one step follows
            controls.pause(app, "quiet", queue=q, actor="dee")
        now = shown()
        assert spy.reads == [1, AUDIT_STEP, AUDIT_DEPTH]
        assert (now.pauses["small"]["by"], now.boosts["small"]["by"]) == ("cy", "bob")
        assert now.pauses["quiet"]["by"] == "dee"
    finally:
        controls.resume(app, "small", queue=q)
        controls.resume(app, "quiet", queue=q)
        controls.unboost(app, "small", queue=q)
    assert (shown().pauses, spy.reads) == ({}, [])


def test_the_rate_column_shows_the_default_rate_of_a_group_without_its_own() -> None:
    from celery_fair.contrib.flower_state import InForce

    shown = InForce(rates={"a": "5/s (burst 3)", "b": "none"}, default_rate="1/s")
    assert [shown.rate_of(g) for g in "abc"] == ["5/s (burst 3)", "", "1/s (default)"]
    assert InForce().rate_of("c") == ""  # no default: no rate limit
