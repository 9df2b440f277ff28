"""Flower's settings for docshop (``celery -A docshop flower`` reads this file from the
directory it starts in): the celery-fair page — groups, held tasks, caps — behind basic auth.

Flower answers its API (``/api/...``, the fair page's ``/api/fair/queues`` included) only
behind authentication, so docshop's Flower always starts with it. The user and password
come from the environment, ``DOCSHOP_FLOWER_AUTH=user:password``: not from this file, nor
from the command line, where ``ps`` and shell history would show them.
"""

import os

import celery_fair.contrib.flower

celery_fair.contrib.flower.enable()

port = 5555
address = "127.0.0.1"

_credentials = os.environ.get("DOCSHOP_FLOWER_AUTH", "")
_user, _, _password = _credentials.partition(":")
if not (_user and _password):
    raise SystemExit(
        "docshop's Flower starts with basic auth (its API answers only behind it): set "
        "DOCSHOP_FLOWER_AUTH=user:password, e.g. export DOCSHOP_FLOWER_AUTH=admin:$(python3 "
        "-c 'import secrets; print(secrets.token_urlsafe(16))')")
basic_auth = [_credentials]
