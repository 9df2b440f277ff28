"""Django: tasks published while serving a request go to the request's group, interactive.

Add the middleware after Django's ``AuthenticationMiddleware``::

    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "celery_fair.contrib.django.FairGroupMiddleware",
    ]
    CELERY_FAIR_GROUP_RESOLVER = "myapp.tenancy.tenant_of"   # optional: request -> group

The group is the resolver's answer for the request (by default the logged-in user's id;
anonymous requests have no group, so the task's own rule or ``fair_default_group``
decides). Tasks published during the request are interactive unless the task says
``interactive=False``. Celery reads ``CELERY_FAIR_*`` settings as ``fair_*`` when the app
is configured with ``app.config_from_object("django.conf:settings", namespace="CELERY")``.

Adding ``"celery_fair.contrib.django"`` to ``INSTALLED_APPS`` also puts a **Fair queues**
page in the Django admin (:mod:`celery_fair.contrib.django.admin`). The middleware alone
needs no entry there.
"""

from __future__ import annotations

from typing import Any, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings

from ..web import SETTING, Resolver, load_resolver, request_group, request_scope


def user_id(request: Any) -> Any:
    """The default resolver: the authenticated user's primary key, else no group."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return user.pk


class FairGroupMiddleware:
    """Sets :func:`~celery_fair.fair_context` for each request, sync or async.

    Subclass with ``interactive = False`` to leave the class of tasks to their own rule
    (background unless stated).
    """

    sync_capable = True
    async_capable = True
    #: Mark tasks published during a request interactive (unless the task says otherwise).
    interactive = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response
        self._resolve: Resolver = load_resolver(getattr(settings, SETTING, None)) or user_id
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        if self._async:
            return self._acall(request)
        with request_scope(self.group(request), self.interactive):
            return self.get_response(request)

    async def _acall(self, request: Any) -> Any:
        # The resolver may touch the database (request.user, a tenant lookup): run it
        # where Django allows that. The context itself is set here, in the request's task.
        group = await sync_to_async(self.group)(request)
        with request_scope(group, self.interactive):
            return await self.get_response(request)

    def group(self, request: Any) -> str | None:
        """The group of ``request``, checked (an error names the resolver)."""
        return request_group(self._resolve, request, f"{request.method} {request.path}")
