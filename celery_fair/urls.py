"""The URL schemes of ``fair_store_url`` and which store serves each: a leaf module, so
the settings check a URL without importing the stores."""

from __future__ import annotations

#: Schemes the Redis store serves.
REDIS_SCHEMES = ("redis", "rediss", "unix")
#: Schemes the SQL store serves (SQLAlchemy URLs; a driver is chosen when none is named).
SQL_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "mysql", "mysql+pymysql",
               "mariadb", "mariadb+pymysql", "sqlite")


def scheme_of(url: str) -> str:
    """The scheme of ``url`` ('' when it has none)."""
    scheme, found, _ = url.partition("://")
    return scheme.lower() if found else ""


def describe_schemes() -> str:
    """The supported schemes as a user reads them in an error."""
    return ", ".join(f"{s}://" for s in REDIS_SCHEMES + SQL_SCHEMES)
