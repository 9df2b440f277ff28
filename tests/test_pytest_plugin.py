"""celery_fair.contrib.pytest with Celery's fixtures as pytest-celery registers them.

The documented recipe (docs/testing.md, read from the page) runs as a user's suite in a
subprocess with both plugins active; the function-scoped fixtures run in a user's suite
through pytester; and a fair task runs through Celery's ``celery_session_worker`` and
celery_fair's per-test ``fair_dispatcher``. All in subprocesses, on real redis-servers.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

pytest_plugins = ["pytester"]

ROOT = Path(__file__).parent.parent
TESTING_DOC = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")


def doc_files(section: str) -> dict[str, str]:
    """The Python code blocks of docs/testing.md under ``section``, by the file name each
    starts with (``# conftest.py``, ``# tests/smoke/conftest.py``: keyed ``conftest.py``)."""
    start = TESTING_DOC.index(f"\n## {section}\n")
    end = TESTING_DOC.find("\n## ", start + 1)
    text = TESTING_DOC[start:end if end > 0 else None]
    blocks = re.findall(r"^```python\n# (\S+\.py)[^\n]*\n(.*?)^```", text, re.M | re.S)
    return {Path(name).name: f"# {name}\n{body}" for name, body in blocks}


def test_the_documented_recipe_runs_with_pytest_celery_and_celery_fair(
        tmp_path: Path) -> None:
    files = doc_files("The recipe")
    assert sorted(files) == ["conftest.py", "tasks.py", "test_tasks.py"]
    for name, code in files.items():
        (tmp_path / name).write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    # pytest-celery (entry point "celery") and celery_fair's plugin are both active...
    version = importlib.metadata.version("pytest-celery")
    assert re.search(rf"^plugins: .*\bcelery-{re.escape(version)}\b", out, re.M), out
    assert re.search(r"^celery_fair\.contrib\.pytest: fair_redis_url, fair_app, fair_store",
                     out, re.M), out
    # ... and the user's tests ran through Celery's session worker and our dispatcher.
    assert "test_every_tenant_gets_its_exports PASSED" in out, out
    assert "test_each_test_starts_with_an_empty_store PASSED" in out, out
    assert re.search(r"\b2 passed\b", out), out


def test_the_docker_smoke_setup_matches_pytest_celerys_api() -> None:
    """The Docker-based smoke setup is not run (no Docker engine in CI); its conftest is
    executed, which builds its fixtures from pytest-celery's API without contacting Docker."""
    files = doc_files("A Docker smoke setup with a dispatcher container")
    namespace: dict[str, Any] = {"__name__": "smoke_conftest"}
    exec(compile(files["conftest.py"], "tests/smoke/conftest.py", "exec"), namespace)
    for fixture in ("fair_image", "fair_worker_container", "fair_dispatcher_container",
                    "celery_worker_cluster", "fair_dispatcher_node"):
        assert fixture in namespace
    assert namespace["FairDispatcherContainer"].command()[:5] == \
        ["celery", "-A", "app", "fair", "dispatch"]
    compile(files["test_fair_smoke.py"], "tests/smoke/test_fair_smoke.py", "exec")


# -- Celery's session worker with a per-test dispatcher ------------------------------------
# In a subprocess of its own: Celery's session worker lives until its session ends, and
# alive next to the embedded workers of this project's later tests it made one of them
# miss its task (tests/test_send_task.py's beat test, run after it in one process).

SESSION_CONFTEST = '''
import pytest

pytest_plugins = ["celery_fair.contrib.pytest"]


@pytest.fixture(scope="session")
def celery_config(fair_redis_url):
    return {"broker_url": fair_redis_url, "result_backend": fair_redis_url,
            "task_default_queue": "reports"}
'''

SESSION_TESTS = '''
from celery_fair import fair_task


@fair_task(group="tenant")
def triple(tenant, x):
    return 3 * x


def test_fair_tasks_through_the_session_worker(celery_session_app, celery_session_worker,
                                               fair_app, fair_dispatcher, fair_store,
                                               fair_drain):
    assert fair_app is celery_session_app          # the store of the worker's app
    results = [triple.delay("acme", i) for i in range(4)] + [triple.delay("globex", 5)]
    assert [r.get(timeout=30) for r in results] == [0, 3, 6, 9, 15]
    fair_drain()
    assert fair_store.queues() == ["reports"]
    assert fair_store.queue_figures("reports").released == 5


def test_the_next_test_gets_an_empty_store_and_a_new_dispatcher(
        celery_session_worker, fair_dispatcher, fair_store, fair_drain):
    assert fair_store.queues() == []
    assert triple.delay("initech", 7).get(timeout=30) == 21
    fair_drain()
'''


def test_session_worker_with_a_per_test_dispatcher(pytester) -> None:
    pytester.makeconftest(SESSION_CONFTEST)
    pytester.makepyfile(test_session=SESSION_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", timeout=120)
    result.assert_outcomes(passed=2)


# -- the function-scoped fixtures in a user's suite ------------------------------------------

# Listing celery.contrib.pytest after pytest-celery's plugin gives back Celery's in-thread
# celery_worker (pytest-celery 1.x replaces it with a Docker worker): docs/testing.md.
CONFTEST = '''
import pytest

pytest_plugins = ["celery.contrib.pytest", "celery_fair.contrib.pytest"]


@pytest.fixture(scope="session")
def celery_config(fair_redis_url):
    return {"broker_url": fair_redis_url, "result_backend": fair_redis_url,
            "fair_key_prefix": "users-tests", "fair_default_concurrency": 1}
'''

TASKS = '''
from celery_fair import fair_task


@fair_task(group="tenant")
def double(tenant, x):
    return 2 * x
'''

TESTS = '''
import pytest

from tasks import double


def test_fair_tasks_run_through_the_dispatcher(celery_app, celery_worker, fair_dispatcher,
                                               fair_store, fair_drain):
    results = [double.delay("acme", i) for i in range(4)] + [double.delay("globex", 10)]
    assert [r.get(timeout=30) for r in results] == [0, 2, 4, 6, 20]
    fair_drain()
    assert fair_store.queues() == ["celery"]
    assert fair_store.queue_figures("celery").released == 5


def test_each_test_starts_with_an_empty_store(celery_app, fair_store):
    assert fair_store.queues() == []


def test_drain_says_what_is_left(celery_app, fair_store, fair_drain):
    double.delay("acme", 1)                     # no worker, no dispatcher: stays held
    with pytest.raises(AssertionError, match="celery: 1 held, 0 delayed, 0 in flight"):
        fair_drain(timeout=0.2)


@pytest.mark.celery(broker_url="memory://")
def test_dispatcher_on_an_unsupported_broker(celery_app, fair_dispatcher):
    pass
'''


def test_plugin_fixtures_in_a_user_suite(pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(tasks=TASKS, test_user=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", timeout=180)
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines([
        "*test_dispatcher_on_an_unsupported_broker ERROR*",
        "*fair_store: *memory*celery_fair needs a Redis or RabbitMQ broker*",
    ])


def test_plugin_is_not_loaded_unless_asked(pytester) -> None:
    pytester.makepyfile(test_plain="def test_nothing(request):\n"
                                   "    assert 'fair_store' not in request.fixturenames\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fixtures", timeout=120)
    assert "fair_store" not in result.stdout.str()


def test_a_missing_celery_plugin_is_named(pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["celery_fair.contrib.pytest"]\n')
    pytester.makepyfile(test_user="def test_store(fair_store):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:celery",
                                           timeout=120)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fair_app: Celery's fixture 'celery_app' is not available."
                                 " Install pytest-celery*celery.contrib.pytest*"])
