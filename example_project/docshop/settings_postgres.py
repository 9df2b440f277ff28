"""docshop with no Redis anywhere: RabbitMQ is the broker, PostgreSQL keeps the held
tasks (celery-fair's SQL store) and the task results (Celery's database backend).

Select it with ``DJANGO_SETTINGS_MODULE=docshop.settings_postgres`` for every process
(web, worker, dispatcher), after ``celery -A docshop fair migrate`` created the store's
tables. Everything else is ``settings.py``'s.
"""

import os

from .settings import *  # noqa: F403 - the same site, another broker and store

del REDIS_URL  # noqa: F821 - nothing here talks to Redis

# A RabbitMQ virtual host (guest/guest only connects from localhost).
CELERY_BROKER_URL = os.environ.get("DOCSHOP_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
# One PostgreSQL database for celery-fair's tables (fair_*, made by `fair migrate`) and
# Celery's results (celery_taskmeta, made by Celery); psycopg 3 is the driver.
POSTGRES_URL = os.environ.get("DOCSHOP_POSTGRES_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/docshop")
CELERY_RESULT_BACKEND = "db+" + POSTGRES_URL
CELERY_FAIR_STORE_URL = POSTGRES_URL
