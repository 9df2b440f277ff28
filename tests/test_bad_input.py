"""Bad input fails loudly, at the right moment, naming the culprit, and holds nothing.

Invalid groups and costs raise at call time (or at decoration time for ``fair_task``);
invalid settings raise :class:`ConfigurationError` naming the setting when a Dispatcher is
built, at the first ``apply_async`` and when a worker starts.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from celery_fair import (
    ConfigurationError,
    FairTask,
    InvalidCost,
    InvalidGroup,
    InvalidOption,
    fair_context,
    fair_task,
)
from celery_fair.config import reset_config
from celery_fair.dispatcher import Dispatcher
from celery_fair.store.base import Placement
from celery_fair.task import store_for

from .conftest import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELERY = os.path.join(os.path.dirname(sys.executable), "celery")


def _nothing_held(redis_client: Any, namespace: str) -> None:
    keys = sorted(k.decode() for k in redis_client.keys(f"{namespace}:*"))
    assert keys == [], f"a failed call left keys behind: {keys}"


LONG = "g" * 201

# (value, text the error must contain to name the value)
BAD_GROUPS = [
    ("", "empty"),
    (LONG, "201 characters"),
    ({"tenant": 1}, repr({"tenant": 1})),
    (1.5, "1.5"),
    (["a"], repr(["a"])),
    (True, "True"),
    ("acme\x00", repr("acme\x00")),
    ("ac\nme", repr("ac\nme")),
    ("tab\there", repr("tab\there")),
    ("bell\x07", repr("bell\x07")),
    ("k" * 10240, "10240 characters"),
    ("del\x7f", repr("del\x7f")),
    ("sur\ud800", "surrogates"),
]
BAD_GROUP_IDS = ["empty", "201-chars", "dict", "float", "list", "bool", "nul", "newline",
                 "tab", "bell", "10kB", "del", "surrogate"]


@pytest.mark.parametrize("value,named", BAD_GROUPS, ids=BAD_GROUP_IDS)
def test_invalid_group_at_call_time(app, redis_client, namespace, value, named):
    work, add = app.tasks["proj.work"], app.tasks["proj.add"]
    calls = {
        "call-time fair_group": lambda: add.apply_async((1, 2), fair_group=value),
        "argument rule": lambda: work.delay(value, "x"),
        "argument rule (kwarg)": lambda: work.apply_async(kwargs={"tenant": value}),
        "header": lambda: add.apply_async((1, 2), headers={"fair_group": value}),
    }
    for how, call in calls.items():
        with pytest.raises(InvalidGroup) as info:
            call()
        assert named in str(info.value), f"{how}: {info.value}"
        assert isinstance(info.value, ValueError)
    _nothing_held(redis_client, namespace)


@pytest.mark.parametrize("value,named", BAD_GROUPS, ids=BAD_GROUP_IDS)
def test_invalid_group_from_callable_rule_and_context(app, redis_client, namespace, value,
                                                      named):
    @app.task(base=FairTask, fair_group=lambda args, kwargs: value, shared=False,
              name="proj.bad_rule")
    def bad_rule() -> None:
        return None

    with pytest.raises(InvalidGroup) as info:
        bad_rule.delay()
    assert named in str(info.value)

    with pytest.raises(InvalidGroup) as info:
        with fair_context(group=value):
            pass
    assert named in str(info.value)
    _nothing_held(redis_client, namespace)


def test_none_group_means_unresolved(app):
    work = app.tasks["proj.work"]
    store = store_for(app)
    work.apply_async(kwargs={"tenant": None})
    work.apply_async(("acme",), fair_group=None)
    with fair_context(group=None):
        app.tasks["proj.add"].delay(1, 2)
    groups = {g["group"]: g["held_background"]
              for g in store.snapshot(app.conf.task_default_queue)["groups"]}
    assert groups == {"default": 2, "acme": 1}


def test_exactly_200_characters_is_fine(app):
    name = "é" * 200
    app.tasks["proj.add"].apply_async((1, 2), fair_group=name)
    snap = store_for(app).snapshot(app.conf.task_default_queue)
    assert [g["group"] for g in snap["groups"]] == [name]


def test_fair_task_group_must_name_an_argument():
    with pytest.raises(InvalidGroup) as info:
        @fair_task(group="nope")
        def convert(tenant: str, path: str) -> None:
            return None
    message = str(info.value)
    assert "'nope'" in message and "convert" in message
    assert "tenant" in message and "path" in message  # lists the real arguments

    # bind=True: the first argument is the task itself, not a group source
    with pytest.raises(InvalidGroup, match="'self'"):
        @fair_task(group="self", bind=True)
        def bound(self: Any, tenant: str) -> None:
            return None

    with pytest.raises(InvalidGroup, match="42"):
        @fair_task(group=42)
        def numbered(tenant: str) -> None:
            return None

    with pytest.raises(TypeError):
        fair_task("tenant")  # positional options are a mistake, not a group


def test_fair_group_option_naming_no_argument_fails_at_call(app, redis_client, namespace):
    @app.task(base=FairTask, fair_group="nope", shared=False, name="proj.no_such_arg")
    def no_such_arg(tenant: str) -> None:
        return None

    with pytest.raises(InvalidGroup, match="'nope'"):
        no_such_arg.delay("acme")
    _nothing_held(redis_client, namespace)


BAD_COSTS = [0, -1, -0.5, math.nan, math.inf, -math.inf, "1", "cheap",
             True, 1e10, [1]]


@pytest.mark.parametrize("cost", BAD_COSTS, ids=[repr(c) for c in BAD_COSTS])
def test_invalid_cost(app, redis_client, namespace, cost):
    with pytest.raises(InvalidCost) as info:
        app.tasks["proj.add"].apply_async((1, 2), fair_cost=cost)
    assert repr(cost) in str(info.value)
    assert isinstance(info.value, ValueError)

    with pytest.raises(InvalidCost):
        @fair_task(cost=cost)
        def costly() -> None:
            return None

    @app.task(base=FairTask, fair_cost=cost, shared=False, name="proj.costly")
    def costly_option() -> None:
        return None

    with pytest.raises(InvalidCost):
        costly_option.delay()
    _nothing_held(redis_client, namespace)


def test_valid_costs_are_accepted(app):
    add = app.tasks["proj.add"]
    for cost in (1, 0.001, 2.5, 1e9):
        add.apply_async((1, 2), fair_cost=cost)
    snap = store_for(app).snapshot(app.conf.task_default_queue)
    assert snap["groups"][0]["held_background"] == 4


# (settings, the setting the error must name, other text it must contain)
BAD_SETTINGS = [
    ({"fair_max_inflight": 0}, "fair_max_inflight", "0"),
    ({"fair_max_inflight": "many"}, "fair_max_inflight", "'many'"),
    ({"fair_max_inflight": -3}, "fair_max_inflight", "-3"),
    ({"fair_max_inflight": 2.5}, "fair_max_inflight", "2.5"),
    ({"fair_dispatch_ahead": -1}, "fair_dispatch_ahead", "'auto' or an integer >= 0"),
    ({"fair_dispatch_ahead": "some"}, "fair_dispatch_ahead", "'some'"),
    ({"fair_dispatch_ahead": True}, "fair_dispatch_ahead", "True"),
    ({"fair_default_concurrency": -1}, "fair_default_concurrency", "-1"),
    ({"fair_default_concurrency": 0}, "fair_default_concurrency", "0"),
    ({"fair_group_weights": {"a": 0}}, "fair_group_weights", "'a'"),
    ({"fair_group_weights": {"a": -2}}, "fair_group_weights", "-2"),
    ({"fair_group_weights": "heavy"}, "fair_group_weights", "'heavy'"),
    ({"fair_group_weights": {"a": math.nan}}, "fair_group_weights", "nan"),
    ({"fair_group_weights": {"a": math.inf}}, "fair_group_weights", "inf"),
    ({"fair_group_weights": {"a": -math.inf}}, "fair_group_weights", "-inf"),
    ({"fair_group_weights": {"a": 1e12}}, "fair_group_weights", "1000000000000.0"),
    ({"fair_group_weights": {"a": True}}, "fair_group_weights", "True"),
    ({"fair_group_weights": {"a": "2"}}, "fair_group_weights", "'2'"),
    ({"fair_group_weights": {"": 2}}, "fair_group_weights", "empty"),
    ({"fair_group_concurrency": {"a": 0}}, "fair_group_concurrency", "'a'"),
    ({"fair_group_concurrency": {"": 1}}, "fair_group_concurrency", "empty"),
    ({"fair_lease_seconds": "x"}, "fair_lease_seconds", "'x'"),
    ({"fair_lease_seconds": 0}, "fair_lease_seconds", "0"),
    ({"fair_lease_seconds": math.nan}, "fair_lease_seconds", "nan"),
    ({"fair_done_ttl": -1}, "fair_done_ttl", "-1"),
    ({"fair_done_ttl": 1.5}, "fair_done_ttl", "1.5"),
    ({"fair_max_inflite": 10}, "fair_max_inflite", "fair_max_inflight"),
    ({"fair_store_url": None, "broker_url": "amqp://guest:guest@127.0.0.1:1//"},
     "fair_store_url", "amqp://"),
    ({"fair_store_url": "http://127.0.0.1:6379"}, "fair_store_url", "http://"),
    ({"fair_policy": "lottery"}, "fair_policy", "expected one of 'wfq', 'harmony'"),
    ({"fair_queue_policies": ["exports"]}, "fair_queue_policies", "['exports']"),
    ({"fair_queue_policies": {"exports": {"fair_policy": "harmony"}}},
     "fair_queue_policies", "unknown queue 'exports'"),
    ({"fair_queue_policies": {"exports": "harmony"}, "task_routes": {"x": "exports"}},
     "fair_queue_policies['exports']", "'harmony'"),
    ({"fair_queue_policies": {"exports": {"fair_polcy": "harmony"}},
      "task_routes": {"x": "exports"}}, "fair_queue_policies['exports']",
     "unknown key 'fair_polcy': expected one of 'fair_policy', 'fair_charge', "
     "'fair_cap_mode', 'fair_interactive_share'"),
    ({"fair_queue_policies": {"exports": {"fair_policy": "fifo"}},
      "task_routes": {"x": {"queue": "exports"}}},
     "fair_queue_policies['exports']['fair_policy']", "'fifo'"),
    ({"fair_cap_mode": "squishy"}, "fair_cap_mode", "expected one of 'hard', 'soft'"),
    ({"fair_interactive_share": 0}, "fair_interactive_share",
     "=0 is invalid: expected None (strict priority) or a number greater than 0"),
    ({"fair_interactive_share": 1.5}, "fair_interactive_share", "at most 1, such as 0.8"),
    ({"fair_interactive_share": math.nan}, "fair_interactive_share", "nan"),
    ({"fair_interactive_share": True}, "fair_interactive_share", "True"),
    ({"fair_interactive_share": "80%"}, "fair_interactive_share", "'80%'"),
    ({"fair_queue_policies": {"exports": {"fair_interactive_share": 1.5}},
      "task_routes": {"x": {"queue": "exports"}}},
     "fair_queue_policies['exports']['fair_interactive_share']", "1.5"),
    ({"fair_queue_policies": {"exports": {"fair_cap_mode": "loose"}},
      "task_routes": {"x": {"queue": "exports"}}},
     "fair_queue_policies['exports']['fair_cap_mode']", "'loose'"),
    ({"fair_scope": "world"}, "fair_scope", "expected one of 'queue', 'app'"),
    ({"fair_queue_policies": {"exports": {"fair_scope": "global"}},
      "task_routes": {"x": {"queue": "exports"}}},
     "fair_queue_policies['exports']['fair_scope']", "expected one of 'queue', 'app'"),
    ({"fair_affinity": "sticky"}, "fair_affinity", "expected one of 'none', 'hash'"),
    ({"fair_affinity_spill_seconds": -1}, "fair_affinity_spill_seconds",
     "a number of seconds, 0 or more"),
    ({"fair_affinity_spill_seconds": "30s"}, "fair_affinity_spill_seconds", "'30s'"),
    ({"fair_queue_policies": {"exports": {"fair_affinity": "pinned"}},
      "task_routes": {"x": {"queue": "exports"}}},
     "fair_queue_policies['exports']['fair_affinity']", "'pinned'"),
    ({"fair_assign": "not a path"}, "fair_assign", "(group, workers) -> hostname"),
    ({"fair_group_queues": {"vip-*": ""}}, "fair_group_queues",
     "a dict of {group glob pattern: real queue name}"),
    ({"fair_group_queues": ["vip-*"]}, "fair_group_queues", "['vip-*']"),
    ({"fair_queue_policies": {"exports": {"fair_group_queues": {"": "vip"}}},
      "task_routes": {"x": {"queue": "exports"}}},
     "fair_queue_policies['exports']['fair_group_queues']", "both non-empty strings"),
    ({"fair_interactive_reserve": -1}, "fair_interactive_reserve", "-1"),
    ({"fair_batch_size": 0}, "fair_batch_size", "0"),
    ({"fair_default_group": ""}, "fair_default_group", "empty"),
    ({"fair_key_prefix": ""}, "fair_key_prefix", "''"),
    ({"fair_on_store_error": "drop"}, "fair_on_store_error", "'drop'"),
    ({"fair_group_max_held": 0}, "fair_group_max_held", "None (unlimited) or an integer"),
    ({"fair_group_max_held": 2.5}, "fair_group_max_held", "2.5"),
    ({"fair_group_max_held_overrides": {"a": -1}}, "fair_group_max_held_overrides", "'a'"),
    ({"fair_group_max_held_overrides": {"": 5}}, "fair_group_max_held_overrides", "empty"),
    # WAIT counts whole milliseconds, and WAIT 0 waits for ever
    ({"fair_store_replicas_timeout": 0.0004, "fair_store_replicas": 1},
     "fair_store_replicas_timeout", "at least 0.001 seconds"),
    # a port redis-py would quote (a piece of an unencoded password) is named, not shown
    ({"fair_store_url": "redis://:pw/x@127.0.0.1:6379/0"}, "fair_store_url",
     "the port must be a number"),
]
BAD_SETTING_IDS = [f"{next(iter(c))}={next(iter(c.values()))!r}" for c, _, _ in BAD_SETTINGS]


@pytest.mark.parametrize("conf,setting,text", BAD_SETTINGS, ids=BAD_SETTING_IDS)
def test_invalid_setting(make_app, redis_client, namespace, conf, setting, text):
    app = make_app(**conf)
    with pytest.raises(ConfigurationError) as info:
        Dispatcher(app)
    assert setting in str(info.value)
    assert text in str(info.value)

    # The failed validation is not cached: the first publish fails the same way ...
    reset_config(app)
    for _ in range(2):  # ... and so does the next one
        with pytest.raises(ConfigurationError) as info:
            app.tasks["proj.work"].delay("acme", "x")
        assert setting in str(info.value)
    _nothing_held(redis_client, namespace)


def test_unknown_setting_suggests_the_right_one(make_app):
    app = make_app(fair_max_inflite=10)
    with pytest.raises(ConfigurationError) as info:
        Dispatcher(app)
    assert "did you mean 'fair_max_inflight'" in str(info.value)
    # Celery's own settings and unrelated keys are left alone.
    app = make_app(fairness_level=3, task_acks_late=True)
    Dispatcher(app)


def _celery(args: list[str], conf: dict[str, Any], broker: str, namespace: str,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CELERY, "-A", "tests.proj", *args], cwd=ROOT,
                          env=subprocess_env(conf, broker, namespace), capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("conf,setting", [
    ({"fair_max_inflight": 0}, "fair_max_inflight"),
    ({"fair_lease_seconds": "x"}, "fair_lease_seconds"),
    ({"fair_max_inflite": 3}, "fair_max_inflite"),
], ids=["max_inflight", "lease", "unknown"])
def test_bad_setting_fails_worker_at_startup(redis_server, redis_client, namespace, conf,
                                             setting):
    done = _celery(["worker", "-P", "solo", "-c", "1", "--without-mingle",
                    "--without-gossip", "-n", f"bad-{namespace}@%h"],
                   conf, redis_server.url + "/0", namespace)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "ConfigurationError" in output and setting in output, output
    _nothing_held(redis_client, namespace)


def test_bad_setting_fails_dispatch_command(redis_server, redis_client, namespace):
    done = _celery(["fair", "dispatch", "--once"], {"fair_group_weights": {"a": 0}},
                   redis_server.url + "/0", namespace)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "fair_group_weights" in output, output
    _nothing_held(redis_client, namespace)


def test_fair_task_unknown_to_the_worker_releases_its_slot(app, make_app, worker,
                                                          dispatcher):
    """A worker that does not know the task rejects the message (task_unknown); its slot
    must come back at once, not a lease later."""
    from celery.exceptions import NotRegistered

    from .conftest import wait_for

    @app.task(base=FairTask, shared=False, name="proj.only_in_the_client")
    def only_in_the_client() -> str:
        return "never"

    # Same broker, store namespace and queue, but without that task.
    worker_app = make_app(fair_lease_seconds=120)
    result = only_in_the_client.apply_async(fair_group="acme")
    store, queue = store_for(app), app.conf.task_default_queue
    # Both use a lease far longer than the test waits: only the signal can free the slot.
    with worker(concurrency=1, the_app=worker_app), dispatcher(worker_app):
        with pytest.raises(NotRegistered):
            result.get(timeout=30)
        wait_for(lambda: store.snapshot(queue)["inflight"] == 0, timeout=30,
                 what="the unknown task's slot to be released")
        assert store.snapshot(queue)["groups"] == []
        # the worker carries on with tasks it knows
        assert worker_app.tasks["proj.add"].delay(1, 2).get(timeout=30) == 3


def test_eager_mode_still_rejects_a_bad_group_and_cost(make_app):
    app = make_app(task_always_eager=True, broker_url="memory://")
    work = app.tasks["proj.work"]
    with pytest.raises(InvalidGroup):
        work.apply_async(("",))
    with pytest.raises(InvalidCost):
        work.apply_async(("acme",), fair_cost=-1)
    assert work.apply_async(("acme", "eager")).get() == "eager"


@pytest.mark.parametrize("value", ["false", 1, 0.0, "yes"])
def test_fair_interactive_must_be_a_bool(app, value):
    with pytest.raises(InvalidOption, match="fair_interactive"):
        app.tasks["proj.work"].apply_async(("acme",), fair_interactive=value)
    with pytest.raises(InvalidOption, match="fair_interactive"):
        fair_task(interactive=value)


# -- command-line arguments ----------------------------------------------------------------

@pytest.mark.parametrize("args,named", [
    (["fair", "dispatch", "--batch-size", "0"], "--batch-size"),
    (["fair", "dispatch", "--batch-size", "many"], "--batch-size"),
    (["fair", "dispatch", "--loglevel", "LOUD"], "--loglevel"),
    (["fair", "cancel"], "TASK_IDS"),
    (["fair", "status", "--colour"], "--colour"),
    (["fair", "check", "--repair=yes"], "--repair"),
], ids=["batch-0", "batch-word", "loglevel", "cancel-no-ids", "status-unknown", "check-flag"])
def test_bad_command_line_names_the_option(redis_server, redis_client, namespace, args,
                                           named):
    done = _celery(args, {}, redis_server.url + "/0", namespace)
    assert done.returncode == 2, done.stdout + done.stderr  # click's usage error
    assert named in done.stderr, done.stderr
    _nothing_held(redis_client, namespace)


def test_bad_demo_scale_names_the_option():
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "celery-fair"),
                           "demo", "--scale", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--scale" in done.stderr, done.stderr


# -- corrupt or foreign data in the store --------------------------------------------------

def test_undecodable_messages_are_quarantined_and_the_rest_dispatches(
        app, worker, dispatcher, ledger, redis_client, caplog):
    """Values celery_fair did not write — garbage, a right prefix over broken metadata, a
    due delayed entry of garbage — each move to the quarantine hash with an error log line;
    every other group's tasks run."""
    import logging

    from celery_fair.check import check

    from .conftest import wait_for

    store, queue = store_for(app), app.conf.task_default_queue
    k = store.keys(queue)
    work = app.tasks["proj.work"]
    results = [work.delay(g, f"{g}-{i}") for g in ("acme", "globex") for i in range(3)]
    # garbage in a ready group's list (a foreign writer, or a damaged value)
    redis_client.hset(k.msg, "junk-1", b"\xff\xfe garbage")
    redis_client.rpush(k.held("b", "evil"), "junk-1")
    redis_client.zadd(k.ready("b"), {"evil": 0})
    redis_client.sadd(k.groups, "evil")  # once its only message is gone, it is forgotten
    # a valid prefix over metadata that is not JSON: only the dispatcher can tell
    store.hold(queue, "junk-2", b"b01:4:evil{not json\n[]", Placement("evil", "b", 1, False),
               0, 0)
    # a due delayed entry of garbage
    redis_client.hset(k.msg, "junk-3", b"???")
    redis_client.zadd(k.delayed, {"junk-3": 1})
    caplog.set_level(logging.ERROR)
    with worker(concurrency=2), dispatcher():
        assert [r.get(timeout=30) for r in results] == [
            f"{g}-{i}" for g in ("acme", "globex") for i in range(3)]
        wait_for(lambda: redis_client.hlen(k.quarantine) == 3, what="3 quarantined values")
    quarantined = redis_client.hgetall(k.quarantine)
    assert quarantined[b"junk-1"] == b"\xff\xfe garbage"
    assert quarantined[b"junk-3"] == b"???"
    assert b"b01:4:evil{not json\n[]" in quarantined.values()  # under its dispatch id
    text = caplog.text
    assert "junk-1" in text and "junk-3" in text and "quarantine" in text
    assert "junk-2" in text and "could not be decoded" in text
    assert sorted(ledger.runs()) == sorted(f"{g}-{i}" for g in ("acme", "globex")
                                           for i in range(3))
    report = check(app)
    assert report.ok, str(report)


def test_foreign_key_type_gives_a_clear_error_and_blocks_nothing_else(app, redis_client):
    from celery_fair.check import check
    from celery_fair.errors import StoreError

    store, queue = store_for(app), app.conf.task_default_queue
    k = store.keys(queue)
    work = app.tasks["proj.work"]
    work.delay("globex", "first")  # registers the fair queue
    redis_client.set(k.held("b", "acme"), "someone else's string")
    with pytest.raises(StoreError) as info:
        work.delay("acme", "x")
    message = str(info.value)
    assert "WRONGTYPE" in message and "operation hold" in message and queue in message
    assert "fair check" in message
    assert redis_client.hlen(k.msg) == 1, "the failed hold left a half-held message"
    work.delay("globex", "second")
    picked = store.pick(queue, 10, None, 0, 10_000)
    assert [p.hold_id for p in picked] != [] and len(picked) == 2
    report = check(app)
    assert report.kinds() == {"foreign_key"} and k.held("b", "acme") in str(report)
    assert not check(app, repair=True).problems
    work.delay("acme", "now fine")
    assert [p.hold_id for p in store.pick(queue, 10, None, 0, 10_000)] != []


@pytest.mark.parametrize(("replicas", "timeout", "says"), [
    (-1, 1.0, "replicas=-1: expected a whole number"),
    (True, 1.0, "replicas=True: expected a whole number"),
    (1, 0.0004, "replicas_timeout=0.0004: expected seconds, at least 0.001"),
    (1, math.inf, "replicas_timeout=inf: expected seconds"),
])
def test_a_redis_store_refuses_bad_replica_settings_before_any_write(
        replicas: Any, timeout: Any, says: str) -> None:
    """The Python API too: a bad value is refused when the store is made, not after a
    script wrote and its WAIT failed (or waited for ever)."""
    import redis

    from celery_fair.errors import ConfigurationError
    from celery_fair.store.redis import RedisStore

    with pytest.raises(ConfigurationError, match=re.escape(says)):
        RedisStore(redis.Redis(port=1), "ns", replicas=replicas, replicas_timeout=timeout)
