"""The Django app ``celery_fair.contrib.django``: the admin page of the fair queues."""

from __future__ import annotations

from django.apps import AppConfig


class CeleryFairConfig(AppConfig):
    """Adds **Fair queues** to the Django admin (label ``celery_fair``)."""

    name = "celery_fair.contrib.django"
    #: Permissions are ``celery_fair.view_fairqueue`` and ``celery_fair.change_fairqueue``.
    label = "celery_fair"
    verbose_name = "celery-fair"
    default_auto_field = "django.db.models.AutoField"
