"""docs/monitoring: the Grafana dashboard, the Prometheus alert rules and the KEDA example
use only metrics the exporters really emit (a dispatcher's /metrics with held and
dispatched tasks, and the file ``fair check --metrics-file`` writes), the rules pass
``promtool check rules`` (Debian's prometheus package), the dashboard decodes with
Grafana's typed models (grafana-foundation-sdk) and the KEDA file is a ScaledObject."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from celery_fair.check import Report
from celery_fair.check_export import SLOT_KINDS, write_metrics_file
from celery_fair.errors import ConfigurationError
from celery_fair.task import store_for

from .components import PROMTOOL, require
from .conftest import subprocess_env, wait_for
from .helpers import queue_of
from .test_check import CELERY, ROOT
from .test_metrics import served

MONITORING = Path(ROOT) / "docs" / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
ALERTS = MONITORING / "alerts.yml"
KEDA = MONITORING / "keda-scaledobject.yaml"

#: The sample names each metric type adds to its family's name.
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
                                                             "_created"),
            "gauge": ("",), "summary": ("_sum", "_count", "_created"), "info": ("_info",)}
#: PromQL words that look like names: aggregation modifiers, set operators, literals.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset", "inf", "nan"}


def metric_names(expr: str) -> dict[str, set[str]]:
    """The metric names a PromQL expression reads, each with the labels its matchers use.

    Strings, label matchers, range selectors and ``by (...)``-like clauses are removed
    first; a name followed by ``(`` is a function, not a metric.
    """
    found: dict[str, set[str]] = {}
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    for name, matchers in re.findall(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}", expr):
        found.setdefault(name, set()).update(
            re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", matchers))
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ",
                  expr)
    for name in re.findall(r"(?<![\w:.$])([a-zA-Z_:][\w:]*)\b(?!\s*\()", expr):
        if name.lower() not in KEYWORDS:
            found.setdefault(name, set())
    return found


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":  # label_values(metric, label): the metric is what counts
            query = var["query"]["query"]
            match = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
            exprs.append(match.group(1) if match else query)
    return exprs


def alert_exprs() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def keda_exprs() -> list[str]:
    return [t["metadata"]["query"] for t in yaml.safe_load(KEDA.read_text())["spec"]["triggers"]
            if t["type"] == "prometheus"]


def exposed(texts: Iterable[str]) -> dict[str, set[str]]:
    """{sample name: its label names} of Prometheus text outputs; a family declared
    without samples yet (a labelled counter before its first event) counts with its
    type's sample names and no labels."""
    out: dict[str, set[str]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            for suffix in SUFFIXES.get(family.type, ("",)):
                out.setdefault(family.name + suffix, set())
            for sample in family.samples:
                out.setdefault(sample.name, set()).update(sample.labels)
    return out


def missing(exprs: Iterable[str], names: dict[str, set[str]]) -> list[str]:
    """What ``exprs`` read that ``names`` lacks: metric names, or labels of one."""
    problems = []
    for expr in exprs:
        for name, labels in metric_names(expr).items():
            if name not in names:
                problems.append(f"{name} (in {expr.strip()!r})")
            elif names[name] and labels - names[name] - {"le"}:
                problems.append(f"{name} has no label {sorted(labels - names[name])}")
    return problems


def test_metric_names_are_read_from_promql() -> None:
    expr = ('histogram_quantile(0.9, sum by (queue, le) (rate(celery_fair_wait_seconds_bucket'
            '{queue=~"$queue", class!="a{b}"}[$__rate_interval]))) > 3 * 3600 and on (queue) '
            'max(celery_fair_capacity) == bool 1e3 unless absent(up) - time()')
    assert metric_names(expr) == {"celery_fair_wait_seconds_bucket": {"queue", "class"},
                                  "celery_fair_capacity": set(), "up": set()}
    names = {"celery_fair_capacity": {"queue"}, "up": set()}
    assert missing(['celery_fair_capacity{queue="q"} > celery_fair_capcity',
                    'celery_fair_capacity{queu="q"}'], names) == [
        "celery_fair_capcity (in 'celery_fair_capacity{queue=\"q\"} > celery_fair_capcity')",
        "celery_fair_capacity has no label ['queu']"]


def test_every_metric_used_is_exported_and_the_alerts_fire_on_it(
        make_app, dispatcher, redis_server, namespace, redis_client, tmp_path) -> None:
    # Two slots and no worker: two tasks are dispatched (wait histograms, dispatch
    # counters), the rest stay held (held, oldest waits): two groups, both classes.
    app = make_app(fair_max_inflight=2)
    queue = queue_of(app)
    for tenant, count in (("acme", 3), ("globex", 2)):
        for i in range(count):
            app.tasks["proj.work"].delay(tenant, f"{tenant}-{i}")
    app.tasks["proj.preview"].delay("acme", "p")
    with served(dispatcher(app), groups=10) as (_, port):
        wait_for(lambda: store_for(app).queue_figures(queue).inflight == 2,
                 what="two tasks dispatched")
        with_data = scrape_text(port)
    # A leaked slot for the check to find: acme's counter says 7 in flight, its records fewer.
    redis_client.hset(store_for(app).keys(queue).group("acme"), "n", 7)
    check_file = tmp_path / "celery_fair.prom"
    ran = subprocess.run([CELERY, "-A", "tests.proj", "fair", "check", "--metrics-file",
                          str(check_file)], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env=subprocess_env({}, redis_server.url + "/0", namespace))
    assert ran.returncode == 1, ran.stdout + ran.stderr  # a problem found and left
    check_text = check_file.read_text()
    check = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for f in text_string_to_metric_families(check_text) for s in f.samples}
    assert check[("celery_fair_check_findings",
                  (("kind", "group_inflight"), ("queue", queue)))] == 1
    assert all(check[("celery_fair_check_findings", (("kind", k), ("queue", queue)))] == 0
               for k in SLOT_KINDS if k != "group_inflight")
    # The dispatcher has stopped by now: check also finds the held work no one dispatches.
    assert check[("celery_fair_check_findings", (("kind", "no_dispatcher"), ("queue", queue)))] == 1
    assert check[("celery_fair_check_unrepaired", (("queue", queue),))] == 2

    names = exposed([with_data, check_text])
    assert {"celery_fair_wait_seconds_bucket", "celery_fair_group_oldest_wait_seconds",
            "celery_fair_oldest_wait_seconds", "celery_fair_oldest_head_wait_seconds",
            "celery_fair_group_head_wait_seconds"} <= names.keys()
    dashboard = json.loads(DASHBOARD.read_text())
    assert missing(dashboard_exprs(dashboard), names) == []
    assert missing(alert_exprs(), names) == []
    assert missing(keda_exprs(), names) == []
    # The rules on these very figures: the leak fires, a healthy dispatcher stays silent.
    leak = {"alertname": "CeleryFairLeakedSlots", "exp_alerts": [{
        "exp_labels": {"severity": "warning", "queue": queue, "kind": "group_inflight"},
        "exp_annotations": {
            "summary": f"fair check found 1 group_inflight finding(s) in {queue}",
            "description": f"Run `celery -A <app> fair check -Q {queue}` to see them and "
                           "`--repair` to fix them; report the finding (it means a crash "
                           "or a bug)."}}]}
    silent = [{"alertname": name, "exp_alerts": []} for name in (
        "CeleryFairNoDispatcher", "CeleryFairDispatcherMetricsAbsent",
        "CeleryFairDispatcherStalled", "CeleryFairHeadWaitOverSLO")]
    run_promtool_tests(tmp_path, ALERTS, [{
        "interval": "1m", "input_series": as_series([with_data, check_text], "x10"),
        "alert_rule_test": [{"eval_time": "10m", **e} for e in (leak, *silent)]}])


def as_series(texts: list[str], values: str) -> list[dict[str, str]]:
    """promtool's input series: every sample of ``texts``, each value followed by
    ``values`` (``"x10"``: held for 10 more intervals)."""
    return [{"series": name + "{" + ",".join(f"{k}={json.dumps(v)}"
                                              for k, v in sorted(labels.items())) + "}",
             "values": f"{value!r}{values}"}
            for text in texts for family in text_string_to_metric_families(text)
            for name, labels, value, *_ in family.samples]


def run_promtool_tests(tmp_path: Path, rules: Path, tests: list[dict[str, Any]]) -> None:
    """``promtool test rules``: ``rules`` evaluated on each test's series."""
    promtool = require(PROMTOOL)  # skipped with the reason outside CI, failed in CI
    spec = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests}
    path = tmp_path / "alerts_test.yml"
    path.write_text(yaml.safe_dump(spec))
    ran = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_metrics_file_in_a_missing_directory_is_refused(tmp_path) -> None:
    path = tmp_path / "nosuch" / "celery_fair.prom"
    with pytest.raises(ConfigurationError, match=r"--metrics-file .*nosuch.* does not exist"):
        write_metrics_file(Report(queues=["q"], repair=False), str(path))


def scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def test_alert_rules_pass_promtool() -> None:
    promtool = require(PROMTOOL)
    ran = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"SUCCESS: {len(alert_exprs())} rules found" in ran.stdout


def test_keda_example_is_a_scaled_object_on_held_work() -> None:
    doc = yaml.safe_load(KEDA.read_text())
    assert doc["apiVersion"] == "keda.sh/v1alpha1" and doc["kind"] == "ScaledObject"
    assert doc["metadata"]["name"] and doc["spec"]["scaleTargetRef"]["name"]
    assert 0 <= doc["spec"]["minReplicaCount"] <= doc["spec"]["maxReplicaCount"]
    (trigger,) = doc["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    meta = trigger["metadata"]
    assert meta["serverAddress"].startswith("http")
    assert float(meta["threshold"]) > 0 and float(meta["activationThreshold"]) >= 0
    # KEDA reads every metadata value as a string: a bare YAML number would be rejected
    assert all(isinstance(v, str) for v in meta.values()), meta
    assert "celery_fair_held_tasks" in metric_names(meta["query"])


def _round_trip(dashboard: dict[str, Any]) -> list[str]:
    """What Grafana's typed dashboard model (grafana-foundation-sdk) does not keep of
    ``dashboard``: a field it does not know, or a value it changes."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    back = json.loads(json.dumps(Dashboard.from_json(dashboard), cls=JSONEncoder))

    def diff(a: Any, b: Any, path: str) -> Iterable[str]:
        if isinstance(a, dict) and isinstance(b, dict):
            for key, value in a.items():
                yield from (diff(value, b[key], f"{path}.{key}") if key in b
                            else [f"{path}.{key}: unknown to the model"])
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                yield from diff(x, y, f"{path}[{i}]")
        elif a != b:
            yield f"{path}: {a!r} became {b!r}"

    return list(diff(dashboard, back, "$"))


def test_dashboard_matches_grafanas_schema() -> None:
    pytest.importorskip("grafana_foundation_sdk",
                        reason="grafana-foundation-sdk (the test extra) needs Python 3.11+")
    from grafana_foundation_sdk.cog.runtime import Runtime
    from grafana_foundation_sdk.models.dashboard import VariableType

    dashboard = json.loads(DASHBOARD.read_text())
    assert _round_trip(dashboard) == []
    # the models keep unchecked strings: panel, query and variable types checked here
    runtime = Runtime()
    assert {p["type"] for p in dashboard["panels"]} <= runtime.panelcfg_variants.keys()
    assert {t["datasource"]["type"] for p in dashboard["panels"] for t in p["targets"]} \
        == {"prometheus"} <= runtime.dataquery_variants.keys()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {v["type"] for v in variables.values()} <= {t.value for t in VariableType}
    assert variables["datasource"]["query"] == "prometheus"
    assert "label_values(" in variables["queue"]["query"]["query"]
    assert dashboard["schemaVersion"] >= 41  # Grafana 11.6 and later
    # every panel's queries filter on the queue variable, but the per-dispatcher loop lag
    assert all('queue=~"$queue"' in t["expr"] for p in dashboard["panels"]
               for t in p["targets"] if "loop_lag" not in t["expr"])
    # the check is not blind: a misspelt field is reported
    broken = copy.deepcopy(dashboard)
    broken["panels"][0]["gridpos"] = broken["panels"][0].pop("gridPos")
    broken["panels"][1]["targets"][0]["exprr"] = "up"
    assert _round_trip(broken) == ["$.panels[0].gridpos: unknown to the model",
                                   "$.panels[1].targets[0].exprr: unknown to the model"]


def test_each_alert_fires_when_it_should_and_only_then(tmp_path) -> None:
    """The rules' logic (expressions, ``for``, labels) on made-up series; their texts
    are checked on real figures above."""
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            del rule["annotations"]
    bare = tmp_path / "alerts.yml"
    bare.write_text(yaml.safe_dump(rules))

    def fired(name: str, *labels: dict[str, str], at: str = "10m") -> dict[str, Any]:
        severity = next(r["labels"]["severity"] for g in rules["groups"]
                        for r in g["rules"] if r["alert"] == name)
        return {"eval_time": at, "alertname": name,
                "exp_alerts": [{"exp_labels": {**x, "severity": severity}} for x in labels]}

    def held(queue: str, n: int) -> dict[str, str]:
        return {"series": f'celery_fair_held_tasks{{queue="{queue}",group="a",'
                          f'class="background",instance="d1"}}', "values": f"{n}x15"}

    def gauge(name: str, values: str, **labels: str) -> dict[str, str]:
        inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return {"series": f"{name}{{{inner}}}", "values": values}

    running = {"interval": "1m", "input_series": [
        # q1: work and no dispatcher; q2: no work, no dispatcher; q3: work and one
        held("q1", 5), held("q2", 0), held("q3", 5),
        gauge("celery_fair_dispatchers", "0x15", queue="q1"),
        gauge("celery_fair_dispatchers", "0x15", queue="q2"),
        gauge("celery_fair_dispatchers", "1x15", queue="q3"),
        gauge("celery_fair_oldest_head_wait_seconds", "400x15", queue="q1"),
        gauge("celery_fair_oldest_head_wait_seconds", "100x15", queue="q3"),
        gauge("celery_fair_loop_lag_seconds", "0.2x15", instance="d1"),
        gauge("celery_fair_loop_lag_seconds", "0+60x15", instance="d2"),  # stuck
        gauge("celery_fair_check_findings", "0x15", queue="q1", kind="group_inflight"),
        gauge("celery_fair_check_findings", "2x15", queue="q3", kind="dispatch_without_lease"),
        gauge("celery_fair_check_last_run_timestamp_seconds", "0x15")],
        "alert_rule_test": [
            fired("CeleryFairNoDispatcher", at="2m"),  # not yet: 3 minutes first
            fired("CeleryFairNoDispatcher", {"queue": "q1"}),
            fired("CeleryFairHeadWaitOverSLO", {"queue": "q1"}),
            fired("CeleryFairDispatcherStalled", {"instance": "d2"}),
            fired("CeleryFairLeakedSlots", {"queue": "q3", "kind": "dispatch_without_lease"}),
            fired("CeleryFairDispatcherMetricsAbsent"),
            fired("CeleryFairCheckNotRunning")]}
    nothing_scraped = {"interval": "1m", "input_series": [held("q1", 5)],
                       "alert_rule_test": [fired("CeleryFairDispatcherMetricsAbsent", {})]}
    stale_check = {"interval": "1h", "input_series": [
        gauge("celery_fair_check_last_run_timestamp_seconds", "0x5")],
        "alert_rule_test": [fired("CeleryFairCheckNotRunning", at="2h"),
                            fired("CeleryFairCheckNotRunning", {}, at="4h")]}
    run_promtool_tests(tmp_path, bare, [running, nothing_scraped, stale_check])
