"""docshop: customers upload documents; a Celery worker converts them fairly."""

# Load the Celery app with Django, so @fair_task/@shared_task bind to it.
from .celery import app as celery_app

__all__ = ["celery_app"]
