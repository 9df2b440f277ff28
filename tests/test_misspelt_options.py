"""A misspelt celery_fair option raises, naming it and the option meant, instead of landing
the task in the default group; a setting celery_fair does not support yet is refused."""

from __future__ import annotations

import pytest
import redis
from celery import Celery

from celery_fair import FairTask, InvalidOption, fair_task


def tenant_report(tenant_id: str) -> None:
    """A task body for the tests below."""


def _nothing_held(redis_client: redis.Redis, namespace: str) -> None:
    assert redis_client.keys(f"{namespace}:*") == []


def test_fair_task_with_a_misspelt_option_raises_did_you_mean() -> None:
    with pytest.raises(InvalidOption) as info:
        @fair_task(grup="tenant_id")
        def report(tenant_id: str) -> None: ...
    assert "'grup'" in str(info.value) and "did you mean 'group'?" in str(info.value)


def test_fair_task_with_a_fair_prefixed_option_raises_did_you_mean() -> None:
    with pytest.raises(InvalidOption) as info:
        @fair_task(group="tenant_id", fair_cost=3)
        def report(tenant_id: str) -> None: ...
    assert "'fair_cost'" in str(info.value) and "did you mean 'cost'?" in str(info.value)


def test_app_task_with_a_misspelt_fair_option_raises_did_you_mean(app: Celery) -> None:
    with pytest.raises(InvalidOption) as info:
        task = app.task(base=FairTask, shared=False, fair_grup="tenant_id",
                        name="t.misspelt")(tenant_report)
        task.name  # noqa: B018  (a lazy app evaluates the task here)
    assert "'fair_grup'" in str(info.value) and "did you mean 'fair_group'?" in str(info.value)


def test_app_task_with_a_bare_fair_option_name_raises_did_you_mean(app: Celery) -> None:
    with pytest.raises(InvalidOption) as info:
        task = app.task(base=FairTask, shared=False, group="tenant_id",
                        name="t.bare")(tenant_report)
        task.name  # noqa: B018
    assert "did you mean 'fair_group'?" in str(info.value)


def test_a_fair_task_subclass_with_a_misspelt_option_raises() -> None:
    with pytest.raises(InvalidOption) as info:
        class TenantTask(FairTask):
            fair_interactiv = True
    assert "did you mean 'fair_interactive'?" in str(info.value)


def test_app_task_keeps_accepting_celery_and_custom_attributes(app: Celery) -> None:
    task = app.task(base=FairTask, shared=False, fair_group="tenant_id", name="t.custom",
                    acks_late=True, audit_level=3, typing=False)(tenant_report)
    assert (task.fair_group, task.acks_late, task.audit_level) == ("tenant_id", True, 3)


def test_apply_async_with_a_misspelt_fair_option_raises_and_holds_nothing(
        app: Celery, redis_client: redis.Redis, namespace: str) -> None:
    with pytest.raises(InvalidOption) as info:
        app.tasks["proj.work"].apply_async(("acme", "x"), fair_grup="globex")
    assert "'fair_grup'" in str(info.value) and "did you mean 'fair_group'?" in str(info.value)
    _nothing_held(redis_client, namespace)
    assert redis_client.llen(app.conf.task_default_queue) == 0
