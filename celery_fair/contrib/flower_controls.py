"""The Fair queues page's controls in Flower: pause, resume, purge, limit, boost and
unboost.

Each action is a ``POST /api/fair/<action>`` (form fields: ``queue``, ``group`` and the
action's own) handled by a subclass of Flower's ``BaseApiHandler``, so Flower guards it
as it guards its own control API (``/api/task/revoke``): its authentication, its
``--read-only`` (403), and its cross-site check (Tornado's ``xsrf_cookies``, which Flower
turns on and narrows in ``BaseHandler.check_xsrf_cookie``: a cross-site or cross-origin
request is refused; with OAuth the ``_xsrf`` token is needed too, which the page sends as
Flower's own pages do, in ``X-XSRFToken``). The action runs :mod:`celery_fair.controls`
in Flower's thread pool, so it is validated and recorded in the audit log as from the
CLI, under the Flower user's name (OAuth's user, else basic auth's, else ``flower``).

:data:`ACTIONS` maps each route to its function; a later control is one more entry
there and one more button on the page.
"""

from __future__ import annotations

import logging
from base64 import b64decode
from collections.abc import Callable, Mapping
from typing import Any

from tornado import web
from tornado.ioloop import IOLoop

from .. import controls
from ..errors import FairError, InvalidLimit, StoreError

try:
    from flower.api import BaseApiHandler
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("celery_fair.contrib.flower needs Flower: pip install flower") from exc

__all__ = ["ACTIONS", "FairControlApi", "control_routes", "flower_user"]

logger = logging.getLogger(__name__)

#: The form fields an action reads (anything else is ignored).
FIELDS = ("queue", "group", "for", "reason", "concurrency", "weight", "rate", "burst",
          "reset", "class")

Form = Mapping[str, str]


def _queue(form: Form) -> str | None:
    return form.get("queue") or None


def _pause(app: Any, form: Form, actor: str) -> str:
    seconds = controls.parse_duration(form["for"]) if form.get("for") else None
    done = controls.pause(app, form.get("group") or None, queue=_queue(form),
                          for_seconds=seconds, reason=form.get("reason") or None,
                          actor=actor)
    return "paused " + "; ".join(map(str, done))


def _resume(app: Any, form: Form, actor: str) -> str:
    done = controls.resume(app, form.get("group") or None, queue=_queue(form),
                           reason=form.get("reason") or None, actor=actor)
    return "resumed " + "; ".join(map(str, done)) if done else "nothing was paused there"


def _purge(app: Any, form: Form, actor: str) -> str:
    done = controls.purge(app, form.get("group", ""), queue=_queue(form),
                          klass=form.get("class") or None,
                          reason=form.get("reason") or None, actor=actor)
    return f"purged {len(done)} held tasks of group {form.get('group')} (marked REVOKED)"


def _boost(app: Any, form: Form, actor: str) -> str:
    weight = controls.parse_weight(form.get("weight", ""), "boost weight")
    if weight is controls.UNCHANGED:
        raise InvalidLimit("boost weight is required: the weight the group is picked with "
                           "while boosted")
    seconds = controls.parse_duration(form["for"]) if form.get("for") else None
    done = controls.boost(app, form.get("group", ""), weight=weight, queue=_queue(form),
                          for_seconds=seconds, reason=form.get("reason") or None,
                          actor=actor)
    return "boosted " + "; ".join(map(str, done))


def _unboost(app: Any, form: Form, actor: str) -> str:
    done = controls.unboost(app, form.get("group", ""), queue=_queue(form),
                            reason=form.get("reason") or None, actor=actor)
    return "boost ended: " + "; ".join(map(str, done)) if done else \
        "nothing to end: not boosted there"


def _limit(app: Any, form: Form, actor: str) -> str:
    reset = form.get("reset", "").lower() in ("1", "true", "on", "yes")
    fields = ("concurrency", "weight", "rate", "burst")
    given = [f for f in fields if form.get(f, "").strip()]
    if reset and given:  # as the CLI: a reset sets nothing else
        raise InvalidLimit(f"reset takes no {', '.join(given)}: reset the group's limits, "
                           "or set them")
    numbers: dict[str, Any] = {} if reset else {
        "concurrency": controls.parse_concurrency(form.get("concurrency", "")),
        "weight": controls.parse_weight(form.get("weight", "")),
        "rate": controls.parse_rate(form.get("rate", "")),
        "burst": controls.parse_burst(form.get("burst", ""))}
    done = controls.limit(app, form.get("group", ""), queue=_queue(form), reset=reset,
                          reason=form.get("reason") or None, actor=actor, **numbers)
    return "limits now: " + "; ".join(map(str, done))


#: route name -> the control it runs (app, form, actor) -> a message for the page.
ACTIONS: dict[str, Callable[[Any, Form, str], str]] = {
    "pause": _pause, "resume": _resume, "purge": _purge, "limit": _limit,
    "boost": _boost, "unboost": _unboost}


def flower_user(handler: Any) -> str:
    """Who acts: Flower's OAuth user, else the basic auth user name, else ``flower``."""
    user = handler.current_user
    if isinstance(user, bytes):
        user = user.decode(errors="replace")
    if isinstance(user, str) and user.strip():
        return user.strip()
    scheme, _, token = handler.request.headers.get("Authorization", "").partition(" ")
    if scheme == "Basic":
        try:
            name = b64decode(token.strip()).decode().partition(":")[0].strip()
        except (ValueError, UnicodeDecodeError):
            name = ""
        if name:
            return name
    return "flower"


class FairControlApi(BaseApiHandler):
    """``POST /api/fair/<action>``: ``{"message": text}``; 400 ``{"error": text}`` for bad
    input (nothing changed), 403 in read-only mode, 503 when the store failed."""

    @web.authenticated
    async def post(self, action: str) -> None:
        if self.application.options.read_only:
            raise web.HTTPError(403, "Read only mode is enabled")
        run = ACTIONS.get(action)
        if run is None:
            raise web.HTTPError(404, f"no celery_fair action {action!r}")
        form = {k: self.get_argument(k, "", escape=False) for k in FIELDS}
        actor = flower_user(self)
        try:
            message = await IOLoop.current().run_in_executor(None, run, self.capp, form,
                                                             actor)
        except StoreError as exc:
            logger.warning("celery_fair: %s from Flower failed: %s", action, exc)
            self.set_status(503)
            self.write({"error": f"celery_fair could not reach its store: {exc}"})
            return
        except FairError as exc:  # validation: nothing was written
            self.set_status(400)
            self.write({"error": str(exc)})
            return
        logger.info("celery_fair: %s by %s from Flower: %s", action, actor, message)
        self.write({"message": message})


def control_routes() -> list[tuple[str, type]]:
    """The routes :func:`celery_fair.contrib.flower.enable` adds for the actions."""
    return [(r"/api/fair/(" + "|".join(ACTIONS) + ")", FairControlApi)]
