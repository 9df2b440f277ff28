"""``celery -A proj fair migrate``: bring the SQL store's schema up to date, check it,
or print its SQL. Registered on the ``fair`` group by ``cli.py``."""

from __future__ import annotations

from typing import Any

import click
from celery.bin.base import CeleryCommand, CeleryOption

from .errors import FairError
from .redact import safe_url
from .urls import REDIS_SCHEMES, scheme_of


@click.command(cls=CeleryCommand)
@click.option("--check", is_flag=True,
              help="Change nothing; exit 1 when the schema is not current.",
              cls=CeleryOption, help_group="Migrate Options")
@click.option("--sql", "as_sql", is_flag=True,
              help="Print the SQL of the upgrade from an empty schema; change nothing.",
              cls=CeleryOption, help_group="Migrate Options")
@click.pass_context
def migrate(ctx: click.Context, check: bool, as_sql: bool) -> None:
    """Create or upgrade the SQL store's tables (fair_store_url, fair_store_table_prefix).

    Run it before starting dispatchers and workers on a new celery_fair release: they
    refuse a schema that is missing or out of date. Safe to run again, and from two
    places at once.
    """
    from .config import get_config

    if check and as_sql:
        raise click.UsageError("--check and --sql cannot be combined")
    try:
        config = get_config(ctx.obj.app)
    except FairError as exc:
        raise click.ClickException(str(exc)) from None
    url, prefix = config.store_url, config.store_table_prefix
    if scheme_of(url) in REDIS_SCHEMES:
        click.echo(f"nothing to migrate: the store is Redis ({safe_url(url)}), which has "
                   "no schema")
        return
    sql = _sql_module()
    try:
        if as_sql:
            click.echo(sql.upgrade_sql(url, prefix), nl=False)
        elif check:
            _check(ctx, sql, config)
        else:
            before, after = sql.migrate(url, prefix)
            where = sql.describe(url)
            click.echo(f"migrated {where} (prefix {prefix}): {before or 'none'} -> {after}"
                       + (" (already current)" if before == after else ""))
    except FairError as exc:
        raise click.ClickException(str(exc)) from None


def _check(ctx: click.Context, sql: Any, config: Any) -> None:
    from .store import bounds_of

    engine = sql.make_engine(config.store_url, bounds_of(config))
    try:
        sql.check_schema(engine, config.store_table_prefix, "fair migrate --check")
    except sql.SchemaOutOfDate as exc:
        click.echo(str(exc), err=True)
        ctx.exit(1)
    finally:
        engine.dispose()
    click.echo(f"schema of {sql.describe(engine)} (prefix {config.store_table_prefix}) "
               f"is current: revision {sql.SCHEMA_VERSION}")


def _sql_module() -> Any:
    """The SQL store's package (SQLAlchemy and Alembic are the ``sql`` extra)."""
    try:
        from .store import sql
    except ImportError as exc:
        raise click.ClickException(f"the SQL store needs its packages: pip install "
                                   f"'celery-fair[sql]' ({exc})") from None
    return sql
