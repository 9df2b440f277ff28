"""The Celery app, configured from Django settings (CELERY_* names, CELERY_FAIR_* too)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "docshop.settings")

app = Celery("docshop")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
