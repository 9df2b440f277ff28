"""Settings of the docshop example. Environment variables let the end-to-end test (and
you) point it at another Redis or database, and make conversions slower or faster."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DOCSHOP_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("DOCSHOP_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

# A page that fails logs its traceback to the console with DEBUG off too (Django's default
# sends it only to ADMINS by mail then).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django.request": {"handlers": ["console"], "level": "ERROR",
                                   "propagate": False}},
}

INSTALLED_APPS = [
    # The admin at /admin/, with celery-fair's "Fair queues" page (celery_fair.contrib.django)
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "celery_fair.contrib.django",
    "documents",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # Tasks published while serving a request go to the request's customer (see
    # CELERY_FAIR_GROUP_RESOLVER) and are interactive unless the task says otherwise.
    "celery_fair.contrib.django.FairGroupMiddleware",
]

ROOT_URLCONF = "docshop.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
WSGI_APPLICATION = "docshop.wsgi.application"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DOCSHOP_DB", str(BASE_DIR / "db.sqlite3")),
        # The web app and the worker's threads write at once: wait for the lock.
        "OPTIONS": {"timeout": 30},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
STATIC_URL = "static/"

# -- Celery (app.config_from_object("django.conf:settings", namespace="CELERY")) ----------
REDIS_URL = os.environ.get("DOCSHOP_REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("DOCSHOP_QUEUE", "docshop")

# -- celery-fair: every fair_* setting, spelt CELERY_FAIR_* ------------------------------
CELERY_FAIR_KEY_PREFIX = os.environ.get("DOCSHOP_FAIR_PREFIX", "fair")
# A customer never holds more than this many workers (None: no cap, round robin only).
_cap = os.environ.get("DOCSHOP_CUSTOMER_CAP", "")
CELERY_FAIR_DEFAULT_CONCURRENCY = int(_cap) if _cap else None
# The group of a request: the customer its URL names.
CELERY_FAIR_GROUP_RESOLVER = "documents.tenancy.customer_of"

# How long one conversion / preview takes (the work is simulated).
DOCSHOP_CONVERT_SECONDS = float(os.environ.get("DOCSHOP_CONVERT_SECONDS", "0.5"))
DOCSHOP_PREVIEW_SECONDS = float(os.environ.get("DOCSHOP_PREVIEW_SECONDS", "0.05"))
