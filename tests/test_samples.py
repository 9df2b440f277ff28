"""Every sample output in the README and the tutorial is what the real command prints.

Each block marked ``<!-- sample: NAME -->`` is produced here (or in test_tutorial.py,
test_demo.py) by running the documented command in the documented scenario, on a real
Redis, and compared after tests/samples.py's normalization (task ids, durations, ports).

After a change of what a command prints, regenerate every sample from real runs with
this one-liner, then review and commit the diff of README.md and docs/tutorial.md:

    CELERY_FAIR_UPDATE_SAMPLES=1 .venv/bin/python -m pytest tests/test_samples.py \
        tests/test_tutorial.py tests/test_demo.py tests/test_simulate.py
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_fair.cli import fair
from celery_fair.config import reset_config
from celery_fair.liveness import app_name, read_liveness
from celery_fair.task import store_for
from celery_fair.testing import RedisServer

from .conftest import DispatcherThread, wait_for
from .proj import create_app
from .samples import DOCUMENTS, MARKER, check_sample, cli_shape, samples

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "examples" / "tutorial"
CELERY = str(Path(sys.executable).with_name("celery"))
#: Samples checked by other modules (they own the run that produces them).
ELSEWHERE = {"tutorial-run": "test_tutorial.py", "demo": "test_demo.py",
             "simulate-noisy-neighbour": "test_simulate.py",
             "simulate-mixed-durations": "test_simulate.py",
             "simulate-policies": "test_simulate.py"}


def _run(app: Celery, *args: str) -> str:
    """``celery -A proj fair ARGS`` as a user types it, its output as a pipe gets it."""
    result = CliRunner().invoke(fair, list(args), obj=CLIContext(app=app, no_color=True,
                                                                 workdir=None))
    assert result.exit_code == 0, result.output
    return f"$ celery -A proj fair {' '.join(args)}\n{result.output}"


def _register_worker(app: Celery, concurrency: int) -> None:
    """What a worker of ``concurrency`` processes consuming ``celery`` writes at its start
    (the dispatcher sizes its capacity from it); no worker takes the dispatched tasks, so
    what is in flight stays put while the samples are taken."""
    now = int(time.time() * 1000)
    store_for(app).register_worker("celery", "celery@host", concurrency, now + 600_000, now)


@pytest.fixture(scope="module")
def readme_app() -> Iterator[Celery]:
    """The README's scenario: a 4-per-group cap, globex limited at runtime to 2, one
    worker of 6 processes, one countdown task waiting; production key prefix and queue."""
    server = RedisServer()
    app = create_app(server.url + "/0", "fair", "celery", fair_default_concurrency=4)
    reset_config(app)
    try:
        yield app
    finally:
        server.stop()


def test_every_output_block_is_a_checked_sample():
    # An output block is one that shows a command's prompt (`$ `) or a log line.
    for doc in DOCUMENTS:
        text = doc.read_text(encoding="utf-8")
        marked = {m.start(3) for m in MARKER.finditer(text)}
        for block in re.finditer(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S):
            if re.search(r"^(\$ |\[\.\.\.: )", block.group(1), re.M):
                assert block.start(1) in marked, (doc.name, block.group(1))
    produced = {"status-readme", "inspect-readme", "limit-readme", "cancel-readme",
                "tutorial-status", "tutorial-dispatcher-log", *ELSEWHERE}
    assert set(samples()) == produced


def test_readme_status_inspect_limit_and_cancel_samples(readme_app: Celery):
    app = readme_app
    work, preview = app.tasks["proj.work"], app.tasks["proj.preview"]
    _register_worker(app, 6)
    last = [work.delay("acme", f"a{i}") for i in range(16)][-1]
    for i in range(3):
        work.delay("globex", f"g{i}")
    work.apply_async(("initech", "later"), countdown=3600)
    check_sample("limit-readme", _run(app, "limit", "globex", "--concurrency", "2"))
    store = store_for(app)
    # A running dispatcher, as in the README: it fills the 6 slots (none ahead: the
    # broker is the store's Redis, so releases refill; acme at its cap, globex at its
    # limit), and then nothing moves (no worker takes a task), so the samples show one
    # stable moment.
    with DispatcherThread(app):
        wait_for(lambda: store.queue_figures("celery").inflight == 6, timeout=30,
                 what="the dispatcher to fill the capacity")
        # and to say so: its beat records its last step a moment after the step (a loaded
        # CI machine once showed "last step none yet")
        wait_for(lambda: any(d["last_step_ms"] for d in read_liveness(
            store, app_name(app), ["celery"]).of_queue("celery")["dispatchers"]),
            timeout=30, what="the dispatcher's beat to show its first step")
        urgent = preview.delay("acme", "preview")  # after the burst: it waits for a slot
        check_sample("status-readme", _run(app, "status"), cli_shape)
        check_sample("inspect-readme", _run(app, "inspect", last.id), cli_shape)
        check_sample("cancel-readme", _run(app, "cancel", urgent.id))


@pytest.fixture(scope="module")
def tutorial_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The tutorial's project as the tutorial runs it (`celery -A proj fair dispatch`,
    `python big.py`), the capacity of its `celery -A proj worker -c 4` registered as the
    worker does it, and no task taken, so `fair status` shows the moment after the burst
    and not a random one. Yields the dispatcher's log and `fair status`."""
    server = RedisServer()
    # A stock redis-server's snapshots (the test server runs without), so the dispatcher's
    # start is what the tutorial's reader sees with `redis-server` as Debian ships it.
    redis.Redis(port=server.port).config_set("save", "3600 1 300 100 60 10000")
    # The tutorial's URL is redis://localhost:6379; its port is the one thing changed.
    env = {**os.environ, "REDIS_URL": f"redis://localhost:{server.port}"}
    log = tmp_path_factory.mktemp("tutorial") / "dispatch.log"
    app = Celery("proj", broker=server.url + "/0", set_as_current=False)
    dispatcher = None
    try:
        _register_worker(app, 4)
        subprocess.run([sys.executable, "big.py"], cwd=TUTORIAL, env=env, check=True,
                       capture_output=True, timeout=120)
        with open(log, "wb") as out:
            dispatcher = subprocess.Popen([CELERY, "-A", "proj", "fair", "dispatch"],
                                          cwd=TUTORIAL, env=env, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        client = redis.Redis.from_url(server.url + "/0")
        wait_for(lambda: client.llen("celery") >= 3, timeout=60,
                 what="the dispatcher to fill big-corp's cap")
        status = subprocess.run([CELERY, "-A", "proj", "fair", "status"], cwd=TUTORIAL,
                                env=env, capture_output=True, text=True, timeout=60,
                                check=True)
        yield {"log": log.read_text(errors="replace"), "status": status.stdout,
               "port": str(server.port)}
    finally:
        if dispatcher is not None:
            os.killpg(dispatcher.pid, signal.SIGTERM)
            dispatcher.wait(30)
        server.stop()


def test_tutorial_dispatcher_log_sample(tutorial_run: dict[str, str]):
    # The log as the tutorial shows it: the time stamp elided, Redis on its default port.
    lines = [re.sub(r"^\[[^]]*: ", "[...: ", line)
             for line in tutorial_run["log"].splitlines() if line.startswith("[")]
    text = "\n".join(lines).replace(f"localhost:{tutorial_run['port']}/", "localhost:6379/")
    check_sample("tutorial-dispatcher-log", text)


def test_tutorial_status_sample(tutorial_run: dict[str, str]):
    check_sample("tutorial-status",
                 f"$ celery -A proj fair status\n{tutorial_run['status']}", cli_shape)

