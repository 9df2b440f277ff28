"""example_project/ end to end, as its README runs it: a redis-server of its own, the
Django dev server, a Celery worker and a dispatcher (each its own process), and load.py
playing one big customer and three small ones over HTTP.

It runs twice: on Redis (``docshop.settings``), then with no Redis anywhere
(``docshop.settings_postgres``: a RabbitMQ virtual host is the broker, the session's
PostgreSQL database keeps the held tasks and the results; no redis-server is started)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django")

from celery_fair.store import store_for_url  # noqa: E402
from celery_fair.testing import RedisServer, free_port  # noqa: E402

from .conftest import wait_for  # noqa: E402

PROJECT = Path(__file__).resolve().parent.parent / "example_project"
CELERY = str(Path(sys.executable).with_name("celery"))
SMALL = ["acme", "globex", "initech"]
BIG_DOCS = 60


class Service:
    """One long-running process of the project, in its own process group, logging to a file."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], logs: Path) -> None:
        self.name = name
        self.log = logs / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, cwd=PROJECT, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        try:  # and whatever it left behind
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def tail(self) -> str:
        return f"--- {self.name} ---\n" + self.log.read_text(errors="replace")[-3000:]


@pytest.fixture(params=["redis", "rabbitmq-postgresql"])
def stack(request: Any) -> Iterator[dict[str, str]]:
    """Where the site's broker, results and held tasks are: the environment selecting
    them, and the store's URL and key prefix."""
    if request.param == "redis":
        redis = RedisServer()
        yield {"DOCSHOP_REDIS_URL": redis.url + "/0", "store": redis.url + "/0",
               "DOCSHOP_FAIR_PREFIX": "fair"}
        redis.stop()
        return
    store = request.getfixturevalue("sql_url")("postgresql")
    yield {"DJANGO_SETTINGS_MODULE": "docshop.settings_postgres",
           "DOCSHOP_AMQP_URL": request.getfixturevalue("rabbitmq").url,
           "DOCSHOP_POSTGRES_URL": store, "store": store,
           "DOCSHOP_FAIR_PREFIX": "t" + uuid.uuid4().hex[:10]}  # the database is shared


def _celery_conf(env: dict[str, str]) -> dict[str, str]:
    """The docshop Celery app's whole configuration (CELERY_* names too), and the
    broker, results and store under their setting names, as its processes see them."""
    code = ("import json; from docshop.celery import app; c = app.conf; "
            "print(json.dumps({**{k: repr(v) for k, v in c.items()}, **{k: repr(c.get(k)) "
            "for k in ('broker_url', 'result_backend', 'fair_store_url')}}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, env=env, check=True,
                          capture_output=True, text=True, timeout=60)
    return dict(json.loads(done.stdout))


@pytest.fixture
def docshop(tmp_path: Path, stack: dict[str, str]) -> Iterator[dict[str, Any]]:
    """The whole site running; yields its URL, environment and services."""
    port = free_port()
    env = dict(os.environ, DOCSHOP_DB=str(tmp_path / "db.sqlite3"), DOCSHOP_DEBUG="0",
               DOCSHOP_CONVERT_SECONDS="0.1", DOCSHOP_PREVIEW_SECONDS="0.02",
               **{k: v for k, v in stack.items() if k.startswith(("DOCSHOP_", "DJANGO_"))})
    services: list[Service] = []
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=PROJECT,
                       env=env, check=True, timeout=60)
        subprocess.run([CELERY, "-A", "docshop", "fair", "migrate"], cwd=PROJECT, env=env,
                       check=True, timeout=60, capture_output=True)
        services += [
            Service("web", [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}",
                            "--noreload"], env, tmp_path),
            Service("worker", [CELERY, "-A", "docshop", "worker", "-P", "threads", "-c", "4",
                               "--without-mingle", "--without-gossip", "-l", "info"],
                    env, tmp_path),
            Service("dispatcher", [CELERY, "-A", "docshop", "fair", "dispatch"], env,
                    tmp_path),
        ]
        url = f"http://127.0.0.1:{port}"
        store = store_for_url(stack["store"], stack["DOCSHOP_FAIR_PREFIX"])
        wait_for(lambda: _answers(url), timeout=60, interval=0.2, what="the web app")
        wait_for(lambda: store.worker_capacity("docshop", int(time.time() * 1000)) == 4,
                 timeout=60, interval=0.2, what="the worker's 4 threads registered")
        yield {"url": url, "env": env, "services": services}
    except BaseException:
        print("\n".join(s.tail() for s in services))
        raise
    finally:
        for service in services:
            service.stop()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/", timeout=5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _documents(url: str, customer: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/customers/{customer}/documents/") as resp:
        return list(json.loads(resp.read())["documents"])


def _places(docshop: dict[str, Any], customer: str) -> list[str]:
    """The places the customer's page shows for its waiting documents ("#3, about 2 s").
    A page that fails fails the test with the services' logs (the web log has the
    traceback of a server error)."""
    try:
        with urllib.request.urlopen(f"{docshop['url']}/customers/{customer}/",
                                    timeout=30) as resp:
            return re.findall(r'<span class="place">([^<]+)</span>', resp.read().decode())
    except OSError as exc:
        raise AssertionError(f"{customer}'s page failed: {exc!r}\n"
                             + "\n".join(s.tail() for s in docshop["services"])) from exc


def test_the_postgresql_variant_names_no_redis(tmp_path):
    """docshop.settings_postgres: broker, results and store all elsewhere than Redis."""
    conf = _celery_conf(dict(os.environ, DJANGO_SETTINGS_MODULE="docshop.settings_postgres",
                             DOCSHOP_DB=str(tmp_path / "db.sqlite3")))
    assert {k: v for k, v in conf.items() if "redis" in v.lower()} == {}
    assert conf["broker_url"].startswith("'amqp://")
    assert conf["result_backend"].startswith("'db+postgresql+psycopg://")
    assert conf["fair_store_url"].startswith("'postgresql+psycopg://")


@pytest.mark.timeout(150)
def test_small_customers_are_served_while_the_big_backlog_runs(docshop):
    load = subprocess.Popen(
        [sys.executable, "load.py", "--url", docshop["url"], "--big", str(BIG_DOCS),
         "--small", "3", "--customers", str(len(SMALL)), "--timeout", "90", "--json"],
        cwd=PROJECT, env=docshop["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        # While big-corp's backlog converts, its page tells each waiting document's place.
        shown = wait_for(lambda: _places(docshop, "big-corp"), timeout=60,
                         interval=0.05, what="big-corp's page to show a place (#N)")
        out, err = load.communicate(timeout=120)
    finally:
        load.kill()
    assert all(re.fullmatch(r"#[1-9]\d*(, about .+)?", place) for place in shown), shown
    assert load.returncode == 0, err + "\n".join(s.tail() for s in docshop["services"])
    rows = {row["customer"]: row for row in json.loads(out)["customers"]}
    print(out)

    assert set(rows) == {"big-corp", *SMALL}
    assert rows["big-corp"]["documents"] == BIG_DOCS
    big_done = sorted(d["converted_at"] for d in _documents(docshop["url"], "big-corp"))
    for name in ["big-corp", *SMALL]:
        # Previews are published from a page view: the customer's group, interactive.
        assert rows[name]["preview_ran_as"] == [f"interactive in group {name}"], rows[name]

    for name in SMALL:
        row = rows[name]
        assert row["documents"] == 3
        small_done = max(d["converted_at"] for d in _documents(docshop["url"], name))
        # Under FIFO every small document waits behind all of big-corp's. Here each small
        # customer is done while a good part of big-corp's backlog is still to convert.
        left = sum(1 for t in big_done if t > small_done)
        assert left >= BIG_DOCS // 4, (name, left, row, rows["big-corp"])
        assert row["done"] < rows["big-corp"]["done"], (row, rows["big-corp"])

    # big-corp's own preview does not wait behind its own background conversions.
    preview = next(d for d in _documents(docshop["url"], "big-corp")
                   if d["preview_requested_at"])
    left = sum(1 for t in big_done if t > preview["preview_rendered_at"])
    assert left >= BIG_DOCS // 4, (left, preview)
