"""celery_fair.contrib.pytest, used the way a user would: a small test suite of its own,
with Celery's celery_app/celery_worker fixtures, run by pytest's pytester in a
subprocess against a real redis-server."""

from __future__ import annotations

pytest_plugins = ["pytester"]

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
