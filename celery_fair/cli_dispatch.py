"""``celery -A proj fair dispatch``: run a dispatcher. Registered on the ``fair`` group by
``cli.py``.

Its logging and pid file options are ``celery worker``'s, done with Celery's own helpers
(``app.log.setup``, ``celery.platforms.create_pidlock``), so a dispatcher logs in the
worker's format (``worker_log_format``, the ``setup_logging`` signal) and a second
dispatcher given the same ``--pidfile`` refuses to start, as a second worker does.
"""

from __future__ import annotations

from typing import Any

import click
from celery.bin.base import LOG_LEVEL, CeleryCommand, CeleryOption

from .cli_queues import known_queues, queue_option, require_known
from .errors import FairError
from .shards import Shard, parse_shard


def _shard(ctx: click.Context, param: click.Parameter, value: str | None) -> Shard | None:
    if value is None:
        return None
    try:
        return parse_shard(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


@click.command(cls=CeleryCommand)
@queue_option("Dispatch Options", default="every fair queue, as they appear")
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=None,
              help="Most messages per pick (default: fair_batch_size).",
              cls=CeleryOption, help_group="Dispatch Options")
@click.option("--shard", default=None, callback=_shard, metavar="I/N",
              help="Serve only shard I of N of the fair queues (crc32 of the name mod N), "
                   "so that N dispatchers split the work by queue (default: all).",
              cls=CeleryOption, help_group="Dispatch Options")
@click.option("--once", is_flag=True, help="Do one step and exit.",
              cls=CeleryOption, help_group="Dispatch Options")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics on this port at /metrics (default: "
                   "fair_metrics_port; 0: any free port).",
              cls=CeleryOption, help_group="Dispatch Options")
@click.option("--metrics-address", default=None,
              help="Address of the metrics endpoint (default: fair_metrics_address).",
              cls=CeleryOption, help_group="Dispatch Options")
@click.option("--wait-for-store", type=click.FloatRange(min=0), default=0, metavar="SECONDS",
              help="Wait up to SECONDS for the store to come up at start (default: exit "
                   "at once when it cannot be reached).",
              cls=CeleryOption, help_group="Dispatch Options")
@click.option("-l", "--loglevel", default="INFO", type=LOG_LEVEL,
              help="Logging level, as for celery worker (default: INFO).",
              cls=CeleryOption, help_group="Logging and Daemon Options")
@click.option("-f", "--logfile", type=click.Path(dir_okay=False), default=None,
              help="Log to this file instead of stderr (as celery worker --logfile).",
              cls=CeleryOption, help_group="Logging and Daemon Options")
@click.option("--pidfile", type=click.Path(dir_okay=False), default=None,
              help="Write the process id here; refuse to start while a live process "
                   "holds it (as celery worker --pidfile).",
              cls=CeleryOption, help_group="Logging and Daemon Options")
@click.pass_context
def dispatch(ctx: click.Context, queues: tuple[str, ...], batch_size: int | None,
             shard: Shard | None, once: bool, metrics_port: int | None, metrics_address: str | None,
             wait_for_store: float, loglevel: int, logfile: str | None,
             pidfile: str | None) -> None:
    """Feed the real worker queues from the holding queues, fairly."""
    from celery.platforms import create_pidlock

    from .dispatcher import Dispatcher
    from .logtime import log_in_utc

    app = ctx.obj.app
    if shard is not None:
        try:
            shard.refuse_others(list(queues))
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    app.log.setup(loglevel, logfile)
    if pidfile:
        create_pidlock(pidfile)  # released at exit; exits 73 when a live process holds it
    metrics = None
    try:
        dispatcher = Dispatcher(app, queues=list(queues) or None, batch_size=batch_size,
                                shard=shard)
        log_in_utc(dispatcher.config.log_utc)  # fair_log_utc (logtime.py)
        _reach(dispatcher, wait_for_store)
        require_known(queues, known_queues(app, dispatcher.store))
        metrics = _serve_metrics(dispatcher, metrics_port, metrics_address)
        if once:
            result = dispatcher.step()
            click.echo(f"dispatched {result.dispatched}, promoted {result.promoted}, "
                       f"reclaimed {result.requeued + result.lost}")
        else:
            dispatcher.run()
    except FairError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if metrics is not None:
            metrics.close()


def _reach(dispatcher: Any, wait_for_store: float) -> None:
    from .errors import StoreConnectionError

    try:
        dispatcher.reach_store(wait_for_store)
    except StoreConnectionError as exc:
        hint = "" if wait_for_store else \
            "; to wait for it at start, pass --wait-for-store SECONDS"
        raise click.ClickException(f"{exc}{hint}") from None


def _serve_metrics(dispatcher: Any, port: int | None, address: str | None) -> Any:
    """Start the dispatcher's /metrics endpoint when a port is given or configured."""
    config = dispatcher.config
    port = config.metrics_port if port is None else port
    if port is None:
        return None
    from .metrics import DispatcherMetrics

    metrics = DispatcherMetrics(dispatcher, config.metrics_groups).attach()
    try:
        metrics.serve(port, address or config.metrics_address)
    except OSError as exc:
        raise click.BadParameter(f"cannot listen on port {port}: {exc}",
                                 param_hint="'--metrics-port'") from None
    return metrics
