"""Flask: the FairGroup extension sets the request's group and class (before_request and
teardown_request). Real Flask test client, real Redis; the end-to-end test runs the task
on a real worker through a dispatcher."""

from __future__ import annotations

from typing import Any, Callable

import pytest

flask = pytest.importorskip("flask")
flask_login = pytest.importorskip("flask_login")

from celery import Celery  # noqa: E402

from celery_fair import ConfigurationError, FairTask, InvalidGroup  # noqa: E402
from celery_fair.contrib.flask import FairGroup  # noqa: E402
from celery_fair.groups import current_scope  # noqa: E402

from .helpers import held_envelope, held_ids  # noqa: E402


class User(flask_login.UserMixin):
    def __init__(self, user_id: str) -> None:
        self.id = user_id


def tenant_from_header(request: Any) -> Any:
    return request.headers.get("X-Tenant")


def make_web(app: Celery, **extension: Any) -> flask.Flask:
    """A Flask app whose views publish the test app's tasks; ``?user=`` logs in."""

    @app.task(base=FairTask, fair_interactive=False, shared=False, name="proj.background")
    def background() -> None:
        return None

    web = flask.Flask(__name__)
    web.config.update(SECRET_KEY="test-only", **extension.pop("config", {}))
    login = flask_login.LoginManager(web)
    login.request_loader(lambda request: User(request.args["user"])
                         if "user" in request.args else None)
    # Teardown functions run last-registered first: this one sees what FairGroup's left.
    web.extensions["scope_after_teardown"] = after = []
    web.teardown_request(lambda exc: after.append(current_scope()))
    FairGroup(web, **extension)

    def publish(name: str) -> dict[str, str]:
        return {"id": app.tasks[name].delay().id}

    web.add_url_rule("/enqueue", "enqueue", lambda: publish("proj.group_of"))
    web.add_url_rule("/background", "background", lambda: publish("proj.background"))

    def fail() -> None:
        publish("proj.group_of")
        raise RuntimeError("view failed after publishing")

    web.add_url_rule("/fail", "fail", fail)
    return web


def placement(app: Celery, task_id: str) -> tuple[str, str]:
    headers = held_envelope(app, task_id).headers
    return headers["fair_group"], headers["fair_class"]


def get_id(web: flask.Flask, url: str, **kw: Any) -> str:
    response = web.test_client().get(url, **kw)
    assert response.status_code == 200, response.data
    return str(response.get_json()["id"])


def test_logged_in_user_tasks_are_held_in_the_user_group_interactive(app):
    web = make_web(app)
    assert placement(app, get_id(web, "/enqueue?user=alice")) == ("alice", "i")
    # a task that states interactive=False keeps its class
    assert placement(app, get_id(web, "/background?user=alice")) == ("alice", "b")
    # no user logged in: no group
    assert placement(app, get_id(web, "/enqueue")) == ("default", "i")


@pytest.mark.parametrize("how", ["argument", "dotted path", "config key"])
def test_resolver_names_the_group(app, how):
    path = "tests.test_flask.tenant_from_header"
    extension: dict[str, Any] = {
        "argument": {"resolver": tenant_from_header},
        "dotted path": {"resolver": path},
        "config key": {"config": {"CELERY_FAIR_GROUP_RESOLVER": path}},
    }[how]
    web = make_web(app, **extension)
    task_id = get_id(web, "/enqueue?user=alice", headers={"X-Tenant": "acme"})
    assert placement(app, task_id) == ("acme", "i")


def test_interactive_false_leaves_the_class_to_the_task(app):
    web = make_web(app, interactive=False)
    assert placement(app, get_id(web, "/enqueue?user=bob")) == ("bob", "b")


def test_bad_resolver_is_rejected_at_init_app(app):
    with pytest.raises(ConfigurationError, match="resolver='tests.test_flask.nope' does not"):
        make_web(app, resolver="tests.test_flask.nope")
    with pytest.raises(ConfigurationError, match="CELERY_FAIR_GROUP_RESOLVER=42"):
        make_web(app, config={"CELERY_FAIR_GROUP_RESOLVER": 42})


def test_resolver_giving_a_bad_group_is_named(app):
    web = make_web(app, resolver=lambda request: "")
    web.testing = True  # exceptions reach the test client
    with pytest.raises(InvalidGroup, match="group resolver .* gave '' for GET /enqueue"):
        web.test_client().get("/enqueue")
    assert held_ids(app) == set()
    assert current_scope() is None


def test_context_ends_with_the_request_even_when_the_view_fails(app):
    web = make_web(app)
    web.testing = True
    with pytest.raises(RuntimeError, match="view failed"):
        web.test_client().get("/fail?user=carol")
    (held,) = held_ids(app)
    assert placement(app, held) == ("carol", "i")
    assert web.extensions["scope_after_teardown"] == [None]  # reset by teardown_request
    assert current_scope() is None
    later = app.tasks["proj.group_of"].delay()
    assert placement(app, later.id) == ("default", "b")


def test_worker_runs_the_request_task_in_the_user_group(app, worker: Callable[..., Any],
                                                         dispatcher: Callable[..., Any]):
    web = make_web(app)
    task_id = get_id(web, "/enqueue?user=dave")
    with worker(concurrency=2), dispatcher():
        # proj.group_of returns the fair_group header the worker received
        assert app.AsyncResult(task_id).get(timeout=20) == "dave"
    assert held_ids(app) == set()
