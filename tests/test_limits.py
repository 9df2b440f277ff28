"""Caps, weights and costs: every entry point refuses a non-finite or out-of-range number
before writing anything (settings, ``celery fair limit``, the store API, the scripts
themselves), a hold is all or nothing, and ``check --repair`` fixes the numbers an older
version could store (NaN, infinity, a cap of 1e20) so that dispatch works again."""

from __future__ import annotations

import math
from typing import Any

import pytest
import redis
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_fair.check import check
from celery_fair.cli import fair
from celery_fair.config import reset_config
from celery_fair.dispatcher import Dispatcher
from celery_fair.errors import (
    ConfigurationError,
    CorruptMessage,
    FairError,
    InvalidCost,
    StoreError,
)
from celery_fair.store.base import Placement, Policy
from celery_fair.store.redis import RESET, RedisStore

from .store_helpers import NOW, Q, hold, pick, value


@pytest.fixture
def store(redis_client: redis.Redis, namespace: str) -> RedisStore:
    return RedisStore(redis_client, namespace)


def dump(client: redis.Redis, namespace: str) -> dict[str, Any]:
    """Every key of the namespace with its content (to show that nothing was written)."""
    out: dict[str, Any] = {}
    for raw in client.scan_iter(match=f"{namespace}:*"):
        key = raw.decode()
        kind = client.type(key).decode()
        out[key] = {"hash": client.hgetall, "list": lambda k: client.lrange(k, 0, -1),
                    "set": client.smembers, "zset": lambda k: client.zrange(k, 0, -1,
                                                                            withscores=True),
                    "string": client.get}[kind](key)
    return out


BAD_WEIGHTS = ["nan", "inf", "-inf", "1e7", "0"]
BAD_CAPS = ["99999999999999999999", "1000001", "-2"]


# -- the command line ----------------------------------------------------------------------

@pytest.mark.parametrize("option, bad", [("--weight", w) for w in BAD_WEIGHTS]
                         + [("--concurrency", c) for c in BAD_CAPS])
def test_limit_command_refuses_a_non_finite_or_out_of_range_number(app: Any, store: Any,
                                                                   option: str,
                                                                   bad: str) -> None:
    app.tasks["proj.work"].delay("acme", "x")
    queue = app.conf.task_default_queue
    before = dump(store.client, app.conf.fair_key_prefix)
    obj = CLIContext(app=app, no_color=True, workdir=None)
    result = CliRunner().invoke(fair, ["limit", "acme", option, bad], obj=obj)
    assert result.exit_code == 2, result.output
    assert option in result.output and bad in result.output, result.output
    name = "weight" if option == "--weight" else "concurrency"
    assert f"{name} for group 'acme' must be" in result.output, result.output
    assert "Traceback" not in result.output
    assert dump(store.client, app.conf.fair_key_prefix) == before
    # the store is still usable: a valid limit afterwards works
    ok = CliRunner().invoke(fair, ["limit", "acme", "--queue", queue, option, "2"], obj=obj)
    assert ok.exit_code == 0, ok.output


# -- the Python API ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [{"weight": math.nan}, {"weight": math.inf},
                                    {"weight": -math.inf}, {"weight": 1e7},
                                    {"weight": 0}, {"cap": 10**20}, {"cap": -2},
                                    {"cap": 2.5}, {"cap": "many"}, {"cap": True}],
                         ids=repr)
def test_store_limit_refuses_a_bad_number_before_writing(store: RedisStore,
                                                         namespace: str,
                                                         kwargs: dict[str, Any]) -> None:
    hold(store, "acme")
    before = dump(store.client, namespace)
    with pytest.raises(ValueError) as info:
        store.limit(Q, "acme", **kwargs)
    name = "weight" if "weight" in kwargs else "concurrency"
    expected = ("a finite number between 1e-06 and 1e+06" if name == "weight"
                else "an integer from 0 to 1_000_000")
    assert str(info.value) == (f"{name} for group 'acme' must be {expected}, "
                               f"got {next(iter(kwargs.values()))!r}")
    assert isinstance(info.value, FairError)
    assert dump(store.client, namespace) == before


@pytest.mark.parametrize("policy, named", [
    (Policy(10**20, 1, 1.0, {}, {}), "default concurrency"),
    (Policy(None, 10**20, 1.0, {}, {}), "interactive reserve"),
    (Policy(None, 1, math.nan, {}, {}), "default weight"),
    (Policy(None, 1, 1.0, {"acme": 10**20}, {}), "concurrency for group 'acme'"),
    (Policy(None, 1, 1.0, {}, {"acme": math.inf}), "weight for group 'acme'"),
])
def test_store_configure_refuses_a_bad_number_before_writing(store: RedisStore,
                                                             namespace: str, policy: Policy,
                                                             named: str) -> None:
    hold(store, "acme")
    before = dump(store.client, namespace)
    with pytest.raises(ValueError, match=named):
        store.configure(Q, policy)
    assert dump(store.client, namespace) == before


# -- settings ------------------------------------------------------------------------------

@pytest.mark.parametrize("conf, text", [
    ({"fair_group_weights": {"acme": math.nan}}, "nan"),
    ({"fair_group_weights": {"acme": 1e7}}, "10000000.0"),
    ({"fair_group_concurrency": {"acme": 10**20}}, str(10**20)),
    ({"fair_default_concurrency": 10**20}, str(10**20)),
    ({"fair_interactive_reserve": 10**20}, str(10**20)),
    ({"fair_tasks": {"proj.*": {"group": "value:acme", "cost": math.inf}}}, "inf"),
], ids=lambda v: repr(v)[:60])
def test_a_bad_number_in_the_settings_fails_at_start(make_app: Any, redis_client: Any,
                                                     namespace: str, conf: dict[str, Any],
                                                     text: str) -> None:
    app = make_app(**conf)
    with pytest.raises(ConfigurationError) as info:
        Dispatcher(app)
    setting = next(iter(conf))
    assert setting in str(info.value) and text in str(info.value), str(info.value)
    assert "must be" in str(info.value) or "expected" in str(info.value)
    reset_config(app)
    assert list(redis_client.scan_iter(match=f"{namespace}:*")) == []


# -- the scripts, called directly ----------------------------------------------------------

@pytest.mark.parametrize("script, args", [
    ("limit", ["acme", "", "nan"]),
    ("limit", ["acme", "", "inf"]),
    ("limit", ["acme", "", "1e300"]),
    ("limit", ["acme", "1e20", ""]),
    ("limit", ["acme", "99999999999999999999", ""]),
    ("limit", ["acme", "2.5", "2"]),
    ("configure", ["-1", "1", "nan", "{}", "{}", "{}", ""]),
    ("configure", ["1e20", "1", "1", "{}", "{}", "{}", ""]),
    ("configure", ["-1", "-3", "1", "{}", "{}", "{}", ""]),
    ("configure", ["-1", "1", "1", '{"acme": 1e20}', "{}", "{}", ""]),
    ("configure", ["-1", "1", "1", "{}", '{"acme": 1e300}', "{}", ""]),
    ("configure", ["-1", "1", "1", "{}", '{"acme": NaN}', "{}", ""]),
    ("configure", ["-1", "1", "1", "{}", "{}", '{"acme": "0:1"}', ""]),
    ("configure", ["-1", "1", "1", "{}", "{}", '{"acme": "100:0"}', ""]),
    ("configure", ["-1", "1", "1", "{}", "{}", "{}", "nan:1"]),
    ("configure", ["-1", "1", "1", "{}", "{}", "{}", "", "lottery"]),
    ("rate", ["set", "acme", "1e300:1"]),
    ("rate", ["set", "acme", "fast"]),
], ids=repr)
def test_a_script_refuses_a_bad_number_and_writes_nothing(store: RedisStore, namespace: str,
                                                          script: str,
                                                          args: list[str]) -> None:
    hold(store, "acme")
    store.limit(Q, "acme", 3, 2.0)
    before = dump(store.client, namespace)
    with pytest.raises(redis.ResponseError, match="must be"):
        store._scripts[script](keys=[store.keys(Q).prefix], args=args)
    assert dump(store.client, namespace) == before


# -- holds are all or nothing --------------------------------------------------------------

def test_a_hold_that_fails_leaves_every_count_unchanged(store: RedisStore,
                                                        namespace: str) -> None:
    hold(store, "acme")
    k = store.keys(Q)
    store.client.delete(k.backlog)
    store.client.set(k.backlog, "not a zset")  # a foreign key type: the hold must fail
    before = dump(store.client, namespace)
    with pytest.raises(StoreError):
        hold(store, "acme")
    assert dump(store.client, namespace) == before


def test_a_hold_into_a_group_with_a_nan_tag_is_held_whole(store: RedisStore) -> None:
    """7bd68a0 let `limit --weight nan` through; a pick then stored tag 'nan' and every
    later hold of the group raised after counting the message as held."""
    hold(store, "acme")
    k = store.keys(Q)
    store.client.hset(k.group("acme"), "tb", "nan")
    store.client.delete(k.ready("b"))
    held = hold(store, "acme")
    figures = store.queue_figures(Q)
    assert figures.held_background == 2
    assert store.client.hexists(k.msg, held)
    assert [p.hold_id for p in pick(store, 5)][-1] == held


def test_a_hold_of_an_infinite_cost_is_refused(store: RedisStore, namespace: str) -> None:
    # as the placement argument: refused before anything is sent
    with pytest.raises(InvalidCost, match="hold x: cost must be a finite number"):
        store.hold(Q, "x", value("acme"), Placement("acme", "b", 1e308 * 10, False), 0, NOW)
    assert list(dump(store.client, namespace)) == []
    # in the value's prefix, under a placement in range: hold.lua refuses the disagreement
    with pytest.raises(CorruptMessage, match="hold x: the stored value's prefix is not"):
        store.hold(Q, "x", value("acme", cost=1e308 * 10), Placement("acme", "b", 1, False),
                   0, NOW)
    assert list(dump(store.client, namespace)) == [f"{namespace}:queues"]  # known, no more


# -- a store damaged by an older version ---------------------------------------------------

def corrupt_the_old_way(store: RedisStore) -> None:
    """What 7bd68a0 wrote after `limit --weight nan/inf`, `--concurrency 1e20` and a
    pick of the group (the scripts stored the value as given)."""
    k = store.keys(Q)
    store.configure(Q, Policy(None, 1, 1.0, {"globex": 4}, {"globex": 2.0}))
    for g in ("acme", "globex", "initech"):
        for _ in range(2):
            hold(store, g)
    c = store.client
    c.hset(k.limit_weights, "acme", "nan")
    c.hset(k.weights, "acme", "nan")
    c.hset(k.limit_caps, "initech", "99999999999999999999")
    c.hset(k.caps, "initech", "99999999999999999999")
    c.hset(k.conf_weights, "globex", "inf")
    c.hset(k.weights, "globex", "inf")
    c.hset(k.conf_caps, "globex", "1e20")
    c.hset(k.caps, "globex", "1e20")
    c.hset(k.conf, "weight", "-nan")
    c.hset(k.limit_rates, "acme", "nan:1")  # not an older version's: rates came later
    c.hset(k.rates, "acme", "nan:1")
    c.hset(k.group("acme"), "tb", "nan")
    c.hset(k.vt, "b", "inf")


def test_check_repair_fixes_numbers_an_older_version_stored(store: RedisStore) -> None:
    corrupt_the_old_way(store)
    k = store.keys(Q)
    found = check(store, queues=[Q])
    bad = [f for f in found.findings if f.kind == "bad_number"]
    subjects = {f.subject for f in bad}
    assert {"acme", "initech", "globex", "weight", "b"} <= subjects, str(found)
    assert any("nan" in f.detail and k.limit_weights in f.detail for f in bad), str(found)
    repaired = check(store, repair=True, queues=[Q])
    assert not repaired.problems, str(repaired)
    assert check(store, queues=[Q]).ok
    # the bad runtime limits are gone; the settings apply again where they were valid
    assert store.client.hgetall(k.limit_weights) == {}
    assert store.client.hgetall(k.limit_caps) == {}
    assert store.client.hgetall(k.limit_rates) == {} == store.client.hgetall(k.rates)
    assert store.client.hget(k.weights, "acme") is None
    assert store.client.hget(k.caps, "globex") is None  # its setting was damaged too
    # and dispatch works: every held message is picked
    assert sorted(p.hold_id.split("-")[0] for p in pick(store, 10)) == \
        ["acme"] * 2 + ["globex"] * 2 + ["initech"] * 2


def test_limit_reset_works_on_a_store_an_older_version_damaged(store: RedisStore) -> None:
    corrupt_the_old_way(store)
    assert store.limit(Q, "acme", RESET, RESET) == (None, 1.0)
    assert store.limit(Q, "initech", RESET, RESET) == (None, 1.0)
    # a damaged setting is not put back in force by the reset
    assert store.limit(Q, "globex", RESET, RESET) == (None, 1.0)
    assert store.limit(Q, "acme", 3, 2.0) == (3, 2.0)


def test_dispatch_and_release_keep_working_before_the_repair(store: RedisStore) -> None:
    """A damaged number reads as absent (the default applies): 7bd68a0's pick, release
    and hold stopped on it with a Lua float error, mid-way through their writes."""
    corrupt_the_old_way(store)
    picked = pick(store, 10)
    assert len(picked) == 6
    for p in picked:
        assert store.release(Q, p.dispatch_id)
    hold(store, "acme")
    assert store.queue_figures(Q).held_background == 1
    assert store.queue_figures(Q).inflight == 0
