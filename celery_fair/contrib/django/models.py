"""The admin's handle on the fair queues: a model without a table.

Django's admin lists models, and its permissions belong to models; the fair queues live
in celery-fair's store, not in Django's database. So :class:`FairQueue` is unmanaged
(no table is ever created or read): it only gives the page its entry in the admin index
and its two permissions, ``view_fairqueue`` (see the page) and ``change_fairqueue``
(change a group's limits).
"""

from __future__ import annotations

from django.db import models


class FairQueue(models.Model):
    """A fair queue, as the admin's permissions name it (no table)."""

    class Meta:
        managed = False
        verbose_name = "fair queue"
        verbose_name_plural = "fair queues"
        default_permissions = ("view", "change")
