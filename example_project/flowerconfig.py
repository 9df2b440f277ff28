"""Flower's settings for docshop (``celery -A docshop flower`` reads this file from the
directory it starts in): the celery-fair page — groups, held tasks, caps."""

import celery_fair.contrib.flower

celery_fair.contrib.flower.enable()

port = 5555
address = "127.0.0.1"
