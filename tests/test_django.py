"""Django: CELERY_FAIR_* settings through the CELERY namespace, and FairGroupMiddleware.

Real Django (settings configured here, sqlite in a temporary file, the test client),
real Redis; the end-to-end test runs the task on a real worker through a dispatcher.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

django = pytest.importorskip("django")

from celery import Celery  # noqa: E402
from django.conf import settings  # noqa: E402
from django.http import HttpRequest, HttpResponse, JsonResponse  # noqa: E402
from django.test import AsyncClient, Client, override_settings  # noqa: E402
from django.urls import path  # noqa: E402

from celery_fair import ConfigurationError, FairTask, InvalidGroup  # noqa: E402
from celery_fair.config import get_config, reset_config  # noqa: E402
from celery_fair.groups import current_scope  # noqa: E402

from .helpers import held_envelope, held_ids  # noqa: E402

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "celery_fair.contrib.django.FairGroupMiddleware",
]
_current: dict[str, Celery] = {}  # the test's app, for the views


def _publish(request: HttpRequest, name: str) -> JsonResponse:
    result = _current["app"].tasks[name].delay()
    return JsonResponse({"id": result.id})


def enqueue(request: HttpRequest) -> JsonResponse:
    return _publish(request, "proj.group_of")  # no group rule, no class of its own


def enqueue_background(request: HttpRequest) -> JsonResponse:
    return _publish(request, "proj.background")  # states interactive=False


def enqueue_then_fail(request: HttpRequest) -> HttpResponse:
    _publish(request, "proj.group_of")
    raise RuntimeError("view failed after publishing")


async def enqueue_async(request: HttpRequest) -> JsonResponse:
    return _publish(request, "proj.group_of")


urlpatterns = [
    path("enqueue/", enqueue),
    path("background/", enqueue_background),
    path("fail/", enqueue_then_fail),
    path("async/", enqueue_async),
]


def tenant_from_header(request: HttpRequest) -> Any:
    return request.headers.get("X-Tenant")


def bad_tenant(request: HttpRequest) -> Any:
    return {"tenant": 1}


NOT_CALLABLE = 42


@pytest.fixture(scope="module")
def django_db(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Configure Django once per process (settings are global) and create its tables."""
    if not settings.configured:
        settings.configure(
            SECRET_KEY="test-only", ALLOWED_HOSTS=["testserver"], ROOT_URLCONF=__name__,
            INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth",
                            "django.contrib.sessions"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3",
                                   "NAME": str(tmp_path_factory.mktemp("django") / "db")}},
            MIDDLEWARE=MIDDLEWARE, USE_TZ=True)
        django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


@pytest.fixture
def web(django_db: None, app: Celery) -> Iterator[Celery]:
    """The test app, with a task that states it is background, served by the views."""

    @app.task(base=FairTask, fair_interactive=False, shared=False, name="proj.background")
    def background() -> None:
        return None

    _current["app"] = app
    yield app
    _current.clear()


@pytest.fixture
def user(django_db: None) -> Any:
    from django.contrib.auth.models import User

    return User.objects.create_user(f"u{User.objects.count()}", password="x")


def placement(app: Celery, task_id: str) -> tuple[str, str]:
    headers = held_envelope(app, task_id).headers
    return headers["fair_group"], headers["fair_class"]


# -- settings through the CELERY namespace --------------------------------------------------

def django_configured_app(**celery_settings: Any) -> Celery:
    app = Celery("djangoproj", set_as_current=False)
    with override_settings(**celery_settings):
        app.config_from_object("django.conf:settings", namespace="CELERY")
        reset_config(app)
        get_config(app)  # read while the settings are in force
    return app


def test_celery_reads_celery_fair_settings_through_the_namespace(django_db, redis_server,
                                                                 namespace):
    app = Celery("djangoproj", set_as_current=False)

    @app.task(base=FairTask, shared=False, name="djangoproj.convert")
    def convert() -> None:
        return None

    with override_settings(CELERY_BROKER_URL=redis_server.url + "/0",
                           CELERY_TASK_DEFAULT_QUEUE="q-" + namespace,
                           CELERY_FAIR_KEY_PREFIX=namespace,
                           CELERY_FAIR_DEFAULT_GROUP="nobody",
                           CELERY_FAIR_DEFAULT_CONCURRENCY=3,
                           CELERY_FAIR_GROUP_WEIGHTS={"acme": 2},
                           CELERY_FAIR_GROUP_RESOLVER="tests.test_django.tenant_from_header"):
        app.config_from_object("django.conf:settings", namespace="CELERY")
        config = get_config(app)
        assert (config.key_prefix, config.default_group, config.default_concurrency) == \
            (namespace, "nobody", 3)
        assert dict(config.group_weights) == {"acme": 2.0}
        assert config.group_resolver == "tests.test_django.tenant_from_header"

        # A task published through this app is held under the namespaced settings.
        result = convert.delay()
        assert held_ids(app) == {result.id}
        assert placement(app, result.id) == ("nobody", "b")


def test_unknown_namespaced_setting_is_named_as_written(django_db):
    with pytest.raises(ConfigurationError) as info:
        django_configured_app(CELERY_BROKER_URL="redis://127.0.0.1:1/0",
                              CELERY_FAIR_DEFALT_GROUP="x")
    assert "unknown celery_fair setting 'CELERY_FAIR_DEFALT_GROUP'" in str(info.value)
    assert "did you mean 'CELERY_FAIR_DEFAULT_GROUP'?" in str(info.value)


def test_other_django_settings_are_not_celery_fair_ones(django_db):
    # Without the CELERY_ prefix a setting is not Celery's: another app's FAIR_* is fine.
    app = django_configured_app(CELERY_BROKER_URL="redis://127.0.0.1:1/0",
                                FAIR_THEME="dark", CELERY_FAIR_BATCH_SIZE=7)
    assert get_config(app).batch_size == 7


def test_bad_resolver_setting_is_rejected_by_celery_too(django_db):
    with pytest.raises(ConfigurationError) as info:
        django_configured_app(CELERY_BROKER_URL="redis://127.0.0.1:1/0",
                              CELERY_FAIR_GROUP_RESOLVER=["not", "a", "path"])
    assert "fair_group_resolver" in str(info.value)
    assert "dotted path" in str(info.value)


# -- the middleware --------------------------------------------------------------------------

def test_logged_in_user_tasks_are_held_in_the_user_group_interactive(web, user):
    client = Client()
    client.force_login(user)

    task_id = client.get("/enqueue/").json()["id"]
    assert placement(web, task_id) == (str(user.pk), "i")

    # A task that states interactive=False keeps its class; the group is still the user's.
    task_id = client.get("/background/").json()["id"]
    assert placement(web, task_id) == (str(user.pk), "b")


def test_anonymous_request_has_no_group(web):
    task_id = Client().get("/enqueue/").json()["id"]
    assert placement(web, task_id) == ("default", "i")


def test_group_resolver_setting_names_the_group(web, user):
    with override_settings(CELERY_FAIR_GROUP_RESOLVER="tests.test_django.tenant_from_header"):
        client = Client()
        client.force_login(user)  # the resolver wins over the user
        task_id = client.get("/enqueue/", headers={"X-Tenant": "acme"}).json()["id"]
        assert placement(web, task_id) == ("acme", "i")
        task_id = client.get("/enqueue/").json()["id"]  # no tenant: no group
        assert placement(web, task_id) == ("default", "i")


def test_resolver_callable_setting(web):
    with override_settings(CELERY_FAIR_GROUP_RESOLVER=lambda request: "from-callable"):
        task_id = Client().get("/enqueue/").json()["id"]
    assert placement(web, task_id) == ("from-callable", "i")


@pytest.mark.parametrize("value, text", [
    ("tests.test_django.no_such_function", "does not import"),
    ("tests.test_django.NOT_CALLABLE", "expected a callable"),
    ("not a path", "dotted path"),
])
def test_bad_resolver_setting_fails_the_first_request(web, value, text):
    with override_settings(CELERY_FAIR_GROUP_RESOLVER=value):
        with pytest.raises(ConfigurationError) as info:
            Client().get("/enqueue/")
    assert "CELERY_FAIR_GROUP_RESOLVER" in str(info.value)
    assert text in str(info.value)
    assert held_ids(web) == set()


def test_resolver_giving_a_bad_group_is_named(web):
    with override_settings(CELERY_FAIR_GROUP_RESOLVER="tests.test_django.bad_tenant"):
        with pytest.raises(InvalidGroup) as info:
            Client().get("/enqueue/")
    assert "group resolver bad_tenant gave {'tenant': 1} for GET /enqueue/" in str(info.value)
    assert held_ids(web) == set()


def test_context_ends_with_the_request_even_when_the_view_fails(web, user):
    client = Client()
    client.force_login(user)
    with pytest.raises(RuntimeError, match="view failed"):
        client.get("/fail/")
    (held,) = held_ids(web)
    assert placement(web, held) == (str(user.pk), "i")

    # Back outside any request: no scope, so a task goes to the default group, background.
    assert current_scope() is None
    later = web.tasks["proj.group_of"].delay()
    assert placement(web, later.id) == ("default", "b")


def test_async_request_goes_through_the_async_middleware(web, user):
    logged_in = Client()
    logged_in.force_login(user)
    client = AsyncClient()
    client.cookies = logged_in.cookies  # the session (aforce_login is Django 5+)
    response = asyncio.run(client.get("/async/"))
    assert placement(web, response.json()["id"]) == (str(user.pk), "i")
    assert current_scope() is None


def test_worker_runs_the_request_task_in_the_user_group(web, user, worker, dispatcher):
    client = Client()
    client.force_login(user)
    task_id = client.get("/enqueue/").json()["id"]
    assert placement(web, task_id) == (str(user.pk), "i")
    with worker(concurrency=2), dispatcher():
        # proj.group_of returns the fair_group header the worker received
        assert web.AsyncResult(task_id).get(timeout=20) == str(user.pk)
    assert held_ids(web) == set()
