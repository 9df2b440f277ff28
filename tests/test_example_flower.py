"""example_project's Flower starts with basic auth, so its API answers (Flower serves the
API only behind authentication), and refuses to start without credentials.

A real ``celery -A docshop flower`` started from example_project/ as its README says, on
a redis-server of its own.
"""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_fair.testing import RedisServer, free_port

from .conftest import wait_for

pytest.importorskip("flower")

PROJECT = Path(__file__).resolve().parent.parent / "example_project"
CELERY = str(Path(sys.executable).with_name("celery"))


def _flower(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([CELERY, "-A", "docshop", "flower", f"--port={port}"],
                                cwd=PROJECT, env=env, stdout=out, stderr=subprocess.STDOUT)


def _get(url: str, auth: str | None) -> int:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0  # not listening yet


@pytest.fixture(scope="module")
def redis_env() -> Iterator[dict[str, str]]:
    server = RedisServer()
    env = {**os.environ, "DOCSHOP_REDIS_URL": server.url + "/0"}
    env.pop("DOCSHOP_FLOWER_AUTH", None)
    try:
        yield env
    finally:
        server.stop()


def test_docshop_flower_api_answers_behind_basic_auth(redis_env, tmp_path):
    auth = "admin:" + secrets.token_urlsafe(16)
    port, log = free_port(), tmp_path / "flower.log"
    flower = _flower({**redis_env, "DOCSHOP_FLOWER_AUTH": auth}, port, log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _get(url + "/api/workers", auth) == 200, timeout=60,
                 what=f"Flower's API to answer (log: {log})")
        assert _get(url + "/api/fair/queues", auth) == 200
        assert _get(url + "/api/workers", None) == 401
        assert _get(url + "/api/workers", "admin:wrong") == 401
    finally:
        flower.terminate()
        flower.wait(20)
    assert auth.partition(":")[2] not in log.read_text(errors="replace")


def test_docshop_flower_refuses_to_start_without_credentials(redis_env, tmp_path):
    log = tmp_path / "flower.log"
    flower = _flower(redis_env, free_port(), log)
    assert flower.wait(60) != 0
    assert "DOCSHOP_FLOWER_AUTH=user:password" in log.read_text(errors="replace")
