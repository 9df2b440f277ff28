"""Flask: tasks published while serving a request go to the request's group, interactive.

::

    from celery_fair.contrib.flask import FairGroup

    app = Flask(__name__)
    FairGroup(app, resolver=lambda request: g.tenant_id)   # or FairGroup().init_app(app)

Without ``resolver=``, the ``CELERY_FAIR_GROUP_RESOLVER`` config key (a callable or its
dotted path) is used, then the Flask-Login user's id when Flask-Login is installed;
otherwise requests have no group (the task's own rule or ``fair_default_group`` decides).
Tasks published during the request are interactive unless the task says
``interactive=False``.
"""

from __future__ import annotations

import contextlib
from typing import Any

from flask import Flask, g, request

from .web import SETTING, Resolver, load_resolver, request_group, request_scope

_SCOPE = "_celery_fair_scope"  # the open request_scope, on flask.g


def login_user_id(req: Any) -> Any:
    """The default resolver: the Flask-Login user's id, else no group."""
    try:
        from flask_login import current_user
    except ImportError:
        return None
    if current_user is None or not current_user.is_authenticated:
        return None
    return current_user.get_id()


class FairGroup:
    """Flask extension setting :func:`~celery_fair.fair_context` for each request.

    Parameters:
        resolver: callable ``request -> group`` (or its dotted path); None reads the
            app's ``CELERY_FAIR_GROUP_RESOLVER``, then falls back to Flask-Login's user.
        interactive: mark tasks published during a request interactive (default True).
    """

    def __init__(self, app: Flask | None = None, resolver: Resolver | str | None = None,
                 interactive: bool = True) -> None:
        self.resolver = resolver
        self.interactive = interactive
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        where, value = ("resolver", self.resolver) if self.resolver is not None \
            else (SETTING, app.config.get(SETTING))
        resolve = load_resolver(value, where) or login_user_id
        interactive = self.interactive

        def enter() -> None:
            scope = request_scope(
                request_group(resolve, request, f"{request.method} {request.path}"),
                interactive)
            scope.__enter__()
            setattr(g, _SCOPE, scope)

        def leave(exc: BaseException | None) -> None:
            scope: contextlib.AbstractContextManager[None] | None = g.pop(_SCOPE, None)
            if scope is not None:
                scope.__exit__(None, None, None)

        app.before_request(enter)
        app.teardown_request(leave)
        app.extensions["celery_fair"] = self
