"""Flower integration: a "Fair queues" page, holding depth, and celery-fair metrics.

Flower has no plugin API, but its config file (``flowerconfig.py``, or ``--conf``) runs as
Python before Flower builds its web application. :func:`enable`, called there, changes
what Flower is about to build:

* a **Fair queues** page (``/fair-queues``, linked from the navigation bar) listing the
  live dispatchers (a red warning naming the command to start one when a queue holds
  work and none serves it) and each fair queue and its groups: held tasks per class, in
  flight / cap, weight, oldest wait; and the same as JSON at ``/api/fair/queues``;
* a task's place (:func:`celery_fair.position`) as JSON at ``/api/fair/position/<task id>``;
* the pauses and boosts in force, live from the store, with who set them and why
  (:mod:`celery_fair.contrib.flower_state`), and the page's controls (pause, resume,
  purge, limit, boost, unboost), ``POST /api/fair/<action>``
  (:mod:`celery_fair.contrib.flower_controls`);
* a **Held (fair)** column on the Broker page, and ``fair_held`` / ``fair_delayed`` /
  ``fair_inflight`` in each queue of ``/api/queues/length``;
* in ``/metrics``, the store-wide metrics of the dispatcher's own ``/metrics``
  (:mod:`celery_fair.metrics`: same names and labels, per listed group), the live
  dispatchers per queue (``celery_fair_dispatchers``) and the summary's freshness and
  oldest waits.

Every figure comes from the summary the dispatcher keeps in Redis
(:mod:`celery_fair.summary`), but liveness, read from the dispatchers' heartbeats and the
queues' counters (a dead dispatcher writes no summary); all is read in Flower's thread
pool, so a slow Redis never blocks Flower's event loop. The new handlers subclass
Flower's own, so Flower's authentication (``--basic-auth``, ``--auth`` with OAuth) guards
them exactly as it guards Flower's pages and API.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator
from typing import Any, Callable

from prometheus_client.core import REGISTRY, GaugeMetricFamily
from tornado import web
from tornado.ioloop import IOLoop
from tornado.template import Loader, Template

from ..config import get_config
from ..errors import FairError
from ..liveness import (
    Liveness,
    app_name,
    dispatch_command,
    read_liveness,
    utc,
)
from ..metrics import add_queue_figures, dispatchers_family, store_families
from ..position import position_of
from ..store import Bounds, redis_options_of, store_for_url
from ..summary import format_wait, read_summaries
from .flower_controls import control_routes
from .flower_state import InForce, notes_for, read_in_force, short_utc

try:
    from flower import urls as flower_urls
    from flower.api import BaseApiHandler
    from flower.api.tasks import GetQueueLengths
    from flower.views import BaseHandler
    from flower.views.broker import BrokerView
    from flower.views.monitor import Metrics
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("celery_fair.contrib.flower needs Flower: pip install flower") from exc

__all__ = ["enable"]

logger = logging.getLogger(__name__)

TEMPLATES = os.path.join(os.path.dirname(__file__), "templates")
PAGE_TEMPLATE = "fair_queues.html"

Summaries = dict[str, "dict[str, Any] | None"]


def enable() -> None:
    """Add celery-fair's page, columns and metrics to the Flower about to start.

    Call it from ``flowerconfig.py``::

        from celery_fair.contrib.flower import enable
        enable()

    Calling it again does nothing.
    """
    settings = flower_urls.settings
    if isinstance(settings.get("template_loader"), FairTemplateLoader):
        return
    handlers = flower_urls.handlers
    handlers[:] = [_swapped(entry) for entry in handlers]
    handlers[_catch_all(handlers):0] = [
        web.url(r"/fair-queues", FairQueuesView, name="fair-queues"),
        (r"/api/fair/queues", FairQueuesApi),
        (r"/api/fair/position/(.+)", FairPositionApi),
        *control_routes(),
    ]
    settings["template_loader"] = FairTemplateLoader(settings["template_path"])
    REGISTRY.register(COLLECTOR)


# -- reading the summaries, off the event loop ------------------------------------------


async def fetch_summaries(app: Any) -> tuple[Summaries, str | None]:
    """Every fair queue's summary, and an error message if they could not be read."""
    try:
        summaries: Summaries = await IOLoop.current().run_in_executor(None, _read, app)
    except FairError as exc:  # the store wraps its errors
        logger.warning("celery_fair: summaries not read: %s", exc)
        return {}, f"celery_fair could not read its store: {exc}"
    return summaries, None


#: Seconds a read may take before the page says the store is unreachable (a web page
#: should fail fast, and a hung read would hold one of Flower's pool threads).
READ_TIMEOUT = 5.0


def _store(app: Any) -> Any:
    config = get_config(app)
    bounds = Bounds(socket_timeout=READ_TIMEOUT, connect_timeout=READ_TIMEOUT)
    return store_for_url(config.store_url, config.key_prefix, bounds,
                         config.store_table_prefix, redis_options_of(config))


def _read(app: Any) -> Summaries:
    return read_summaries(_store(app))


async def fetch_liveness(app: Any) -> Liveness | None:
    """The live dispatchers and the fair queues none serves (None: the store could not be
    read; :func:`fetch_summaries` says so)."""
    name = app_name(app)  # here: the -A of `celery flower`, in the command's thread
    try:
        return await IOLoop.current().run_in_executor(
            None, lambda: read_liveness(_store(app), name))
    except FairError as exc:
        logger.warning("celery_fair: dispatchers' heartbeats not read: %s", exc)
        return None


async def fetch_in_force(app: Any, queues: list[str]) -> dict[str, InForce]:
    """:func:`~celery_fair.contrib.flower_state.read_in_force` off the event loop ({}
    when the store could not be read: the page says so already)."""
    try:
        return await IOLoop.current().run_in_executor(
            None, lambda: read_in_force(store := _store(app), queues, notes_for(store),
                                        get_config(app).default_rate))
    except FairError as exc:
        logger.warning("celery_fair: pauses and boosts not read: %s", exc)
        return {}


# -- the Fair queues page and its JSON ---------------------------------------------------


class FairQueuesView(BaseHandler):
    """The Fair queues page."""

    @web.authenticated
    async def get(self) -> None:
        summaries, error = await fetch_summaries(self.capp)
        liveness = await fetch_liveness(self.capp)
        in_force = await fetch_in_force(self.capp, list(summaries))
        self.render(PAGE_TEMPLATE, active_tab="fair", fair_queues=summaries,
                    fair_in_force=in_force, fair_error=error, fair_now=time.time(),
                    fair_wait=format_wait,
                    fair_live=liveness, fair_command=dispatch_command(app_name(self.capp)),
                    fair_utc=utc, fair_short=short_utc)


class FairQueuesApi(BaseApiHandler):
    """``GET /api/fair/queues``: ``{"queues": {queue: summary or null}, "dispatchers":
    [beat], "warning": text or null}``."""

    @web.authenticated
    async def get(self) -> None:
        summaries, error = await fetch_summaries(self.capp)
        liveness = await fetch_liveness(self.capp)
        if error or liveness is None:
            raise web.HTTPError(503, error or "celery_fair could not read its store")
        self.write({"queues": summaries, **liveness.as_json()})


class FairPositionApi(BaseApiHandler):
    """``GET /api/fair/position/<task id>``: :meth:`Position.as_json
    <celery_fair.position.Position.as_json>` (state "not held" for an unknown id)."""

    @web.authenticated
    async def get(self, task_id: str) -> None:
        try:
            found = await IOLoop.current().run_in_executor(
                None, lambda: position_of(store := _store(self.capp), store.locate(task_id)))
        except FairError as exc:
            logger.warning("celery_fair: position of %s not read: %s", task_id, exc)
            raise web.HTTPError(503, f"celery_fair could not read its store: {exc}") from None
        self.write(found.as_json())


# -- holding depth on the Broker page and in /api/queues/length ----------------------


class _HoldingBroker:
    """Flower's broker object; ``queues()`` adds each fair queue's holding depth."""

    def __init__(self, broker: Any, app: Any) -> None:
        self._broker = broker
        self._app = app

    def __getattr__(self, name: str) -> Any:
        return getattr(self._broker, name)

    async def queues(self, names: Any) -> Any:
        queues = await self._broker.queues(names)
        summaries, _ = await fetch_summaries(self._app)
        for queue in queues:
            name = queue.get("name")
            if name in summaries:
                summary = summaries[name] or {}
                held = [summary.get(k) for k in ("held_interactive", "held_background")]
                queue["fair_held"] = sum(held) if None not in held else None  # type: ignore[arg-type]
                queue["fair_delayed"] = summary.get("delayed")
                queue["fair_inflight"] = summary.get("inflight")
        return queues


class _HoldingDepth:
    """Mixin for Flower handlers that list queues through ``get_broker()``."""

    capp: Any

    def get_broker(self) -> Any:
        return _HoldingBroker(super().get_broker(), self.capp)  # type: ignore[misc]


class FairBrokerView(_HoldingDepth, BrokerView):
    """Flower's Broker page with a Held (fair) column."""


class FairQueueLengths(_HoldingDepth, GetQueueLengths):
    """``/api/queues/length`` with ``fair_held``, ``fair_delayed``, ``fair_inflight``."""


# -- /metrics ----------------------------------------------------------------------------


class FairCollector:
    """celery-fair's metrics from the summaries the last ``/metrics`` request read.

    The store-wide families are the dispatcher's own (:func:`celery_fair.metrics.
    store_families`: same names, labels and help), over the summary's groups; the summary
    adds its freshness and the oldest waits.
    """

    def __init__(self) -> None:
        self.summaries: Summaries = {}
        self.liveness: Liveness | None = None

    def describe(self) -> list[Any]:
        return []  # nothing to read at registration

    def collect(self) -> Iterator[Any]:
        families = store_families()
        gauges = {name: GaugeMetricFamily(f"celery_fair_{name}", doc, labels=labels)
                  for name, doc, labels in _SUMMARY_GAUGES}
        for queue, summary in sorted(self.summaries.items()):
            gauges["summary_up"].add_metric([queue], 0 if summary is None else 1)
            if summary is not None:
                add_queue_figures(families, queue,
                                  {**summary, "group_count": summary["groups_total"]},
                                  summary["groups"], summary["capacity"])
                _add_summary(gauges, queue, summary)
        yield from families.values()
        yield from gauges.values()
        if self.liveness is not None:
            yield dispatchers_family(self.liveness.serving)


_Q, _G = ["queue"], ["queue", "group"]
#: What only the summary knows (the dispatcher's own metrics have a wait histogram).
_SUMMARY_GAUGES = (
    ("summary_up", "1 when a live dispatcher's summary of the fair queue was read", _Q),
    ("summary_age_seconds", "Age of the fair queue's summary", _Q),
    ("oldest_wait_seconds", "How long the oldest held task of the listed groups has "
     "waited since due", _Q),
    ("group_oldest_wait_seconds", "Oldest held task's wait per listed group", _G),
)


def _add_summary(gauges: dict[str, GaugeMetricFamily], queue: str,
                 summary: dict[str, Any]) -> None:
    gauges["summary_age_seconds"].add_metric(
        [queue], max(0.0, time.time() - summary["written_at"]))
    if summary["oldest_wait"] is not None:
        gauges["oldest_wait_seconds"].add_metric([queue], summary["oldest_wait"])
    for g in summary["groups"]:
        if g["oldest_wait"] is not None:
            gauges["group_oldest_wait_seconds"].add_metric([queue, g["group"]],
                                                           g["oldest_wait"])


COLLECTOR = FairCollector()


class FairMetrics(Metrics):
    """Flower's ``/metrics``; reads the summaries first, off the event loop."""

    async def get(self) -> None:
        summaries, error = await fetch_summaries(self.capp)
        if error is None:
            COLLECTOR.summaries = summaries
        COLLECTOR.liveness = await fetch_liveness(self.capp)
        result = super().get()  # a coroutine in Flower 2.x
        if result is not None:
            await result


# -- wiring into Flower's handlers and templates ----------------------------------------

_REPLACED: dict[type, type] = {
    BrokerView: FairBrokerView, GetQueueLengths: FairQueueLengths, Metrics: FairMetrics}


def _swapped(entry: Any) -> Any:
    """A route of Flower's, with our subclass where we extend its handler."""
    if isinstance(entry, web.url):
        new = _REPLACED.get(entry.handler_class)
        return entry if new is None else web.url(entry.regex.pattern, new, entry.kwargs,
                                                 entry.name)
    new = _REPLACED.get(entry[1])
    return entry if new is None else (entry[0], new, *entry[2:])


def _catch_all(handlers: list[Any]) -> int:
    """Where new routes go: before Flower's final catch-all (404) route."""
    for i, entry in enumerate(handlers):
        pattern = entry.regex.pattern if isinstance(entry, web.url) else entry[0]
        if pattern in (r".*", r".*$"):
            return i
    return len(handlers)


_NAV_ITEM = """
        <li class="nav-item">
          <a class="nav-link{% if active_tab == 'fair' %} active{% end %}"
            href="{{ reverse_url('fair-queues') }}"
            {% if active_tab == 'fair' %}aria-current="page"{% end %}>Fair queues</a>
        </li>"""
_HELD_HEAD = '<th title="Tasks celery-fair holds for this queue">Held (fair)</th>'
_HELD_CELL = ("<td>{{ '' if queue.get('fair_held') is None "
              "else queue['fair_held'] }}</td>")


def _patch_navbar(source: str) -> str | None:
    at = source.find("reverse_url('broker')")
    end = source.find("</li>", at) if at >= 0 else -1
    if end < 0:
        return None
    end += len("</li>")
    return source[:end] + _NAV_ITEM + source[end:]


def _patch_broker(source: str) -> str | None:
    cell = re.search(r"<td[^>\n]*>[^\n]*queue\.get\(['\"]consumers['\"][^\n]*?</td>", source)
    head = re.search(r"<th[^>\n]*>\s*Consumers\s*</th>", source)
    if cell is None or head is None or head.end() > cell.start():
        return None
    source = (source[:head.end()] + _HELD_HEAD + source[head.end():cell.end()] + _HELD_CELL
              + source[cell.end():])
    return source.replace('colspan="6"', 'colspan="7"')  # the "no queues" row


_PATCHES: dict[str, Callable[[str], str | None]] = {
    "navbar.html": _patch_navbar, "broker.html": _patch_broker}


class FairTemplateLoader(Loader):
    """Flower's templates plus ours; adds the nav link and the Broker page's column.

    A template of another Flower version that does not look as expected is served
    unchanged (the page is still reachable at ``/fair-queues``).
    """

    def _create_template(self, name: str) -> Template:
        root = TEMPLATES if name.startswith("fair_") else self.root  # ours: fair_*.html
        with open(os.path.join(root, name), "rb") as f:
            source = f.read().decode("utf-8")
        patch = _PATCHES.get(name)
        if patch is not None:
            patched = patch(source)
            if patched is None:
                logger.warning("celery_fair: Flower's %s is not as expected; "
                               "served unchanged", name)
            source = patched or source
        return Template(source, name=name, loader=self)
