"""The **Fair queues** page of the Django admin, and its limit actions.

Listed in the admin index under *celery-fair* when ``celery_fair.contrib.django`` is in
``INSTALLED_APPS``. The page (the changelist of the table-less
:class:`~celery_fair.contrib.django.models.FairQueue`) shows each fair queue and its
busiest groups; its forms set or reset a group's runtime limits through
:func:`celery_fair.controls.limit`, the function behind ``celery -A proj fair limit``.

The admin's own checks apply: a visitor who is not active staff is sent to the login
page; staff need ``celery_fair.view_fairqueue`` (or change) to see the page, and
``celery_fair.change_fairqueue`` to change limits (superusers have both). Changes are
POST forms with Django's CSRF protection; each one is logged with the user's name.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from ... import controls
from ...errors import FairError, InvalidLimit
from .models import FairQueue
from .queues import celery_app, read_queues

logger = logging.getLogger(__name__)

TEMPLATE = "celery_fair/admin/fair_queues.html"


@admin.register(FairQueue)
class FairQueueAdmin(admin.ModelAdmin):
    """The fair queues (read from celery-fair's store, not Django's database)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def url_name(self, view: str) -> str:
        """The name of one of the page's URLs (``celery_fair_fairqueue_limit``)."""
        return f"{self.opts.app_label}_{self.opts.model_name}_{view}"

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view  # staff only, CSRF, never cached
        return [path("", view(self.changelist_view), name=self.url_name("changelist")),
                path("limit/", view(self.limit_view), name=self.url_name("limit"))]

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The page: every fair queue and its busiest groups."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        try:
            queues = read_queues(celery_app())
        except FairError as exc:  # the store wraps its errors
            logger.warning("celery_fair admin: store not read: %s", exc)
            messages.error(request, f"celery-fair could not read its store: {exc}")
            queues = []
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Fair queues",
            "queues": queues,
            "can_change": self.has_change_permission(request),
            "limit_url": reverse(f"{self.admin_site.name}:{self.url_name('limit')}"),
            **(extra_context or {}),
        }
        return TemplateResponse(request, TEMPLATE, context)

    def limit_view(self, request: HttpRequest) -> HttpResponse:
        """POST: set (``action=set``) or reset (``action=reset``) a group's limits."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        try:
            for done in apply_limit(celery_app(), request.POST, actor=request.user):
                logger.info("celery_fair admin: %s set %s", request.user, done)
                messages.success(request, f"Limits in force: {done}")
        except FairError as exc:  # a bad value or queue, or the store failed
            messages.error(request, str(exc))
        return redirect(f"{self.admin_site.name}:{self.url_name('changelist')}")


def apply_limit(app: Any, form: Any, actor: Any = None) -> list[controls.Limit]:
    """Run one submitted limit form through :func:`celery_fair.controls.limit`.

    Fields: ``group``, ``queue`` (blank: every fair queue), ``action`` (``set`` or
    ``reset``), and for ``set`` ``concurrency`` (an integer, ``none``, or blank to keep
    it), ``weight`` (a number, or blank to keep it), ``rate`` (``10/s``, ``none``, or
    blank to keep it) and ``burst`` (with a rate: an integer, blank for 1). ``actor``
    (the admin page passes ``request.user``) is who the audit log names.

    Raises:
        FairError: naming the field at fault, before anything is written.
    """
    group = form.get("group", "").strip()
    queue = form.get("queue", "").strip() or None
    if form.get("action") == "reset":
        return controls.limit(app, group, queue=queue, reset=True, actor=actor)
    where = f" for group {group!r}"
    concurrency = controls.parse_concurrency(form.get("concurrency", ""), "concurrency" + where)
    weight = controls.parse_weight(form.get("weight", ""), "weight" + where)
    rate = controls.parse_rate(form.get("rate", ""), "rate limit" + where)
    burst = controls.parse_burst(form.get("burst", ""), "burst" + where)
    if concurrency is controls.UNCHANGED and weight is controls.UNCHANGED \
            and rate is controls.UNCHANGED:
        raise InvalidLimit(f"nothing to set{where}: give a concurrency (an "
                           "integer, or 'none' for no cap), a weight, a rate, or several")
    return controls.limit(app, group, queue=queue, concurrency=concurrency, weight=weight,
                          rate=rate, burst=burst, actor=actor)


