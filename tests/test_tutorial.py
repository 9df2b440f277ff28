"""The tutorial (docs/tutorial.md) works as written: its files, its commands, its outcome.

The tutorial includes the files under docs/examples/tutorial/ verbatim; this test runs
them the way the tutorial says — a prefork worker and a dispatcher started with the
`celery` command, then `python big.py` and `python acme.py` — against a Redis of its own,
and checks the tutorial's sample of their output (see tests/samples.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_fair.testing import RedisServer

from .conftest import wait_for
from .samples import check_sample

TUTORIAL = Path(__file__).resolve().parent.parent / "docs" / "examples" / "tutorial"
CELERY = str(Path(sys.executable).with_name("celery"))


@pytest.fixture
def tutorial_env() -> Iterator[dict[str, str]]:
    server = RedisServer()
    try:
        yield {**os.environ, "REDIS_URL": server.url}
    finally:
        server.stop()


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    # Its own session, so stopping it stops the prefork pool's children too.
    with open(log, "wb") as out:
        return subprocess.Popen(args, cwd=TUTORIAL, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _run(script: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, script], cwd=TUTORIAL, env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_small_tenant_is_served_while_the_big_backlog_is_held(tutorial_env, tmp_path):
    env = tutorial_env
    logs = (tmp_path / "worker.log", tmp_path / "dispatch.log")
    worker = _start([CELERY, "-A", "proj", "worker", "-c", "4", "-l", "INFO"], env, logs[0])
    dispatcher = _start([CELERY, "-A", "proj", "fair", "dispatch"], env, logs[1])
    try:
        store = redis.Redis.from_url(env["REDIS_URL"] + "/0")
        # The worker is up once it has registered its pool size for the queue `celery`.
        wait_for(lambda: store.hlen("fair:{celery}:workers"), timeout=60,
                 what="the worker to register its capacity")

        big = _run("big.py", env)
        assert big.strip() == "big-corp queued 2000 documents"
        out = _run("acme.py", env)
        match = re.fullmatch(r"acme's document 1 is back after (\d+\.\d\d)s\n", out)
        assert match, out
        # The tutorial shows both outputs; acme's time is its own run's.
        check_sample("tutorial-run", f"$ python big.py\n{big}$ python acme.py\n{out}",
                     lambda text: re.sub(r"after \d+\.\d\ds", "after N.NNs", text))
        status = subprocess.run([CELERY, "-A", "proj", "fair", "status", "--json"],
                                cwd=TUTORIAL, env=env, capture_output=True, text=True,
                                timeout=60, check=True)
    except (AssertionError, subprocess.CalledProcessError) as exc:
        shown = "\n".join(f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}"
                           for log in logs)
        raise AssertionError(f"{exc}\n{shown}") from None
    finally:
        _stop(dispatcher)
        _stop(worker)

    groups = {g["group"]: g for q in json.loads(status.stdout)["queues"] for g in q["groups"]}
    # big-corp's 2,000 tasks take at least 2000 × 0.1 s / 3 (its cap) ≈ 67 s; acme's one
    # came back in seconds, with most of big-corp's backlog still held behind it.
    assert float(match.group(1)) < 10
    assert groups["big-corp"]["held_background"] > 0
    assert groups["big-corp"]["inflight"] <= 3
