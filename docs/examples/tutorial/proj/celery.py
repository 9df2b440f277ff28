import os

from celery import Celery

REDIS = os.environ.get("REDIS_URL", "redis://localhost:6379")

app = Celery("proj", broker=f"{REDIS}/0", backend=f"{REDIS}/1", include=["proj.tasks"])
app.conf.worker_prefetch_multiplier = 1

app.conf.fair_default_concurrency = 3   # at most 3 tasks of one tenant at a time
