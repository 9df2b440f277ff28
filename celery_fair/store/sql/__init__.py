"""The SQL store (SQLAlchemy Core): PostgreSQL, MariaDB/MySQL and SQLite.

The schema's migrations are public here: :func:`migrate`, :func:`check_schema`,
:func:`schema_revision` and :func:`upgrade_sql` (``celery -A proj fair migrate``)."""

from ...errors import SchemaOutOfDate
from ..connection import Bounds
from .engine import make_engine
from .migrate import check_schema, describe, migrate, schema_revision, upgrade_sql
from .schema import DEFAULT_PREFIX, SCHEMA_VERSION

__all__ = ["DEFAULT_PREFIX", "SCHEMA_VERSION", "Bounds", "SchemaOutOfDate", "check_schema",
           "describe", "make_engine", "migrate", "schema_revision", "upgrade_sql"]
