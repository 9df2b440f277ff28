"""The Django admin's Fair queues page (celery_fair.contrib.django) in the example project,
driven in headless Chromium (the system's ``chromium``, through Playwright).

One docshop dev server and one redis-server of its own; customers' conversions are
published and, with no dispatcher running, stay held. A superuser finds the page in the
admin index, reads the held counts, sets a group's concurrency and another's weight
through the page's forms (the store is read to check each), resets the weight, and gets
a bad weight refused with an admin message; a user who is not staff, and staff without
the permission, are refused; staff with only the view permission see but cannot change.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django")

from celery_fair.store import store_for_url  # noqa: E402
from celery_fair.testing import RedisServer, free_port  # noqa: E402

from .browser import artifacts, chromium  # noqa: E402
from .conftest import wait_for  # noqa: E402
from .test_example_project import PROJECT, Service, _answers  # noqa: E402

PAGE = "/admin/celery_fair/fairqueue/"
QUEUE = "docshop"
HELD = {"acme": 3, "globex": 2}
PASSWORD = "pw-" + uuid.uuid4().hex[:8]
#: Run in the project's Django: the users, and the held conversions (no dispatcher runs).
SETUP = f"""
from django.contrib.auth.models import Permission, User
from documents.tasks import convert_document
User.objects.create_superuser("boss", "boss@example.com", {PASSWORD!r})
User.objects.create_user("clerk", password={PASSWORD!r}, is_staff=True)  # no permission
User.objects.create_user("customer", password={PASSWORD!r})                # not staff
User.objects.create_user("viewer", password={PASSWORD!r}, is_staff=True).user_permissions.add(
    Permission.objects.get(codename="view_fairqueue"))
for customer, count in {HELD!r}.items():
    for number in range(count):
        convert_document.delay(customer, number)
"""


class Site:
    def __init__(self, url: str, store: Any, env: dict[str, str]) -> None:
        self.url = url
        self.store = store
        self.env = env  # the project's environment (its database, its Redis)

    def group(self, group: str) -> Any:
        return self.store.group_figures(QUEUE, [group])[0]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("admin")
    redis = RedisServer()
    prefix = "adm" + uuid.uuid4().hex[:8]
    env = dict(os.environ, DOCSHOP_DB=str(tmp / "db.sqlite3"), DOCSHOP_DEBUG="0",
               DOCSHOP_REDIS_URL=redis.url + "/0", DOCSHOP_FAIR_PREFIX=prefix,
               DOCSHOP_QUEUE=QUEUE)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    port = free_port()
    web = None
    try:
        for args in (["migrate", "-v", "0"], ["shell", "-c", SETUP]):
            subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env,
                           check=True, timeout=60)
        web = Service("web", [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}",
                              "--noreload", "--insecure"], env, tmp)  # static files too
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(url), timeout=60, interval=0.2, what="the web app")
        yield Site(url, store_for_url(redis.url + "/0", prefix), env)
    except BaseException:
        if web is not None:
            print(web.tail())
        raise
    finally:
        if web is not None:
            web.stop()
        redis.stop()


def _log_in(browser: Any, site: Site, user: str) -> Any:
    page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    page.goto(f"{site.url}/admin/login/?next=/admin/")
    page.fill("#id_username", user)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_load_state()
    return page


def _row(page: Any, group: str) -> Any:
    return page.locator(f'section.fair-queue[data-queue="{QUEUE}"] tr[data-group="{group}"]')


def _cell(page: Any, group: str, field: str) -> str:
    return str(_row(page, group).locator(f'[data-field="{field}"]').inner_text()).strip()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module's tests."""
    with chromium() as launched:
        yield launched


def test_admin_page_shows_groups_and_sets_limits(site: Site, browser: Any,
                                                 tmp_path: Path) -> None:
    assert site.group("acme").cap is None  # no limit before the form is sent
    page = _log_in(browser, site, "boss")
    link = page.get_by_role("link", name="Fair queues", exact=True)
    assert link.count() == 1  # listed in the admin index, under celery-fair
    assert page.locator(".app-celery_fair caption").text_content().strip() == \
        "celery-fair"
    link.click()
    page.wait_for_url(f"**{PAGE}")
    for group, count in HELD.items():
        assert _cell(page, group, "held_background") == str(count), group
        assert _cell(page, group, "inflight") == "0 / ∞", group
        assert _cell(page, group, "weight") == "1", group
        assert re.fullmatch(r"\d+(\.\d)? s|\d+ ms", _cell(page, group, "oldest_wait"))
    assert page.locator('[data-field="held"]').inner_text() == str(sum(HELD.values()))
    # No dispatcher runs: the page says so, naming the command that starts one.
    assert page.locator(".fair-liveness-warning").inner_text() == (
        f"no live dispatcher for queue {QUEUE} with {sum(HELD.values())} held: those tasks "
        "do not run until one starts; start one with `celery -A docshop fair dispatch`")

    row = _row(page, "acme")
    row.locator('input[name="concurrency"]').fill("2")
    row.locator('button[value="set"]').click()
    page.wait_for_url(f"**{PAGE}")
    assert f"Limits in force: group acme in queue {QUEUE}: cap 2, weight 1" in \
        page.locator("ul.messagelist li.success").text_content()
    assert _cell(page, "acme", "inflight") == "0 / 2"
    assert _cell(page, "acme", "limited") == "cap"
    shot = artifacts(tmp_path) / "django-admin.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    acme = site.group("acme")  # what the form wrote, read from the store
    assert (acme.cap, acme.weight, acme.limited) == (2, 1.0, ("cap",))
    [entry] = site.store.audit_read()  # recorded under the admin's user
    assert (entry.actor, entry.action, entry.args["concurrency"]) == ("boss", "limit", 2)

    _row(page, "globex").locator('input[name="weight"]').fill("0.5")
    _row(page, "globex").locator('button[value="set"]').click()
    page.wait_for_url(f"**{PAGE}")
    assert _cell(page, "globex", "weight") == "0.5"
    assert site.group("globex").weight == 0.5
    _row(page, "globex").locator('button[value="reset"]').click()
    page.wait_for_url(f"**{PAGE}")
    assert _cell(page, "globex", "limited") == "-"

    row = _row(page, "globex")
    row.locator('input[name="weight"]').fill("heavy")
    row.locator('button[value="set"]').click()
    page.wait_for_url(f"**{PAGE}")
    assert "Weight for group 'globex' must be a finite number" in \
        page.locator("ul.messagelist li.error").text_content()
    acme, globex = site.group("acme"), site.group("globex")
    assert (acme.cap, acme.weight, acme.limited) == (2, 1.0, ("cap",))
    assert (globex.cap, globex.weight, globex.limited) == (None, 1.0, ())
    assert (acme.held_background, globex.held_background) == (3, 2)  # still held
    assert [e.actor for e in site.store.audit_read()] == ["boss"] * 3  # the refused: none
    assert shot.stat().st_size > 10_000

    new = page.locator("form.fair-new")  # a rate limit, from the form above the tables
    new.locator('input[name="group"]').fill("globex")
    new.locator('input[name="rate"]').fill("10/s")
    new.locator('input[name="burst"]').fill("20")
    new.locator('button[value="set"]').click()
    page.wait_for_url(f"**{PAGE}")
    assert "rate 10/s (burst 20)" in page.locator("ul.messagelist li.success").text_content()
    assert str(site.store.rates(QUEUE)["globex"]) == "10/s (burst 20)"


def test_permissions_decide_who_sees_and_who_changes(site: Site, browser: Any) -> None:
    """Anonymous and non-staff users are sent to the login page; staff without the
    permission do not see the page listed and get 403 for it and its action; staff with
    the view permission see the page without forms, and get 403 for the action."""
    anonymous = browser.new_page()
    anonymous.goto(site.url + PAGE)
    assert "/admin/login/" in anonymous.url
    customer = _log_in(browser, site, "customer")
    assert "/admin/login/" in customer.url  # the admin's login refuses non-staff
    assert "staff account" in customer.locator(".errornote").inner_text()

    clerk = _log_in(browser, site, "clerk")
    assert clerk.url == site.url + "/admin/"
    assert clerk.get_by_role("link", name="Fair queues").count() == 0
    assert clerk.goto(site.url + PAGE).status == 403
    _post_refused(clerk, site)

    viewer = _log_in(browser, site, "viewer")
    viewer.get_by_role("link", name="Fair queues", exact=True).click()
    viewer.wait_for_url(f"**{PAGE}")
    assert _cell(viewer, "acme", "held_background") == str(HELD["acme"])
    assert viewer.locator("form.fair-limit").count() == 0
    _post_refused(viewer, site)


def _post_refused(page: Any, site: Site) -> None:
    """A limit POST with a valid CSRF token is refused for want of the change permission."""
    before = site.group("acme")
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    answer = page.request.post(site.url + PAGE + "limit/", headers={"X-CSRFToken": token},
                               form={"group": "acme", "queue": QUEUE, "concurrency": "0",
                                     "action": "set", "csrfmiddlewaretoken": token})
    assert answer.status == 403 and "CSRF" not in answer.text()  # the permission's 403
    assert site.group("acme") == before  # nothing written


#: Run in the project's Django with the store out of reach: the page, then a limit form.
UNREACHABLE = f"""
import json, re
from django.test import Client
client = Client(HTTP_HOST="127.0.0.1")
client.login(username="boss", password={PASSWORD!r})
pages = [client.get({PAGE!r}), client.post({PAGE + "limit/"!r}, {{"group": "acme",
         "queue": {QUEUE!r}, "concurrency": "2", "action": "set"}}, follow=True)]
print(json.dumps([[page.status_code, re.findall(r'<li class="error">(.*?)</li>',
                                                page.content.decode(), re.S)]
                  for page in pages]))
"""


def test_an_unreachable_store_is_an_admin_message(site: Site) -> None:
    """The page and the limit form answer (200) with the store's error as an admin
    message, its password masked, instead of a server error."""
    env = dict(site.env, DOCSHOP_REDIS_URL=f"redis://:s3cret@127.0.0.1:{free_port()}/0")
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", UNREACHABLE],
                          cwd=PROJECT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (page, page_errors), (form, form_errors) = json.loads(done.stdout.splitlines()[-1])
    assert page == form == 200
    assert page_errors == [form_errors[-1]]
    assert page_errors[0].startswith("Celery-fair could not read its store: celery_fair "
                                     "store unreachable (redis://127.0.0.1:"), page_errors
    assert form_errors[0].startswith("Celery_fair store unreachable"), form_errors
    assert "s3cret" not in done.stdout + done.stderr


def test_the_apps_migration_matches_its_model(site: Site) -> None:
    """The shipped migration is what makemigrations would write (a user's makemigrations
    never writes one into the installed package)."""
    done = subprocess.run([sys.executable, "manage.py", "makemigrations", "--check",
                           "--dry-run", "celery_fair"], cwd=PROJECT, env=site.env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "No changes detected" in done.stdout, \
        done.stdout + done.stderr
