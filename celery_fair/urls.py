"""The URL schemes of ``fair_store_url`` and which store serves each: a leaf module, so
the settings check a URL without importing the stores."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

#: Schemes the Redis store serves.
REDIS_SCHEMES = ("redis", "rediss", "unix")
#: Schemes of a Redis behind Sentinel: ``redis+sentinel://h1:26379,h2:26379/0`` (one URL
#: naming every sentinel), or kombu's own ``sentinel://h1:26379;sentinel://h2:26379``.
SENTINEL_SCHEMES = ("redis+sentinel", "sentinel")
#: Schemes of a Redis Cluster: ``redis+cluster://h1:7000,h2:7001/`` (any of its nodes:
#: the client finds the others).
CLUSTER_SCHEMES = ("redis+cluster",)
#: Schemes the SQL store serves (SQLAlchemy URLs; a driver is chosen when none is named).
SQL_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "mysql", "mysql+pymysql",
               "mariadb", "mariadb+pymysql", "sqlite")


def scheme_of(url: str) -> str:
    """The scheme of ``url`` ('' when it has none)."""
    scheme, found, _ = url.partition("://")
    return scheme.lower() if found else ""


def describe_schemes() -> str:
    """The supported schemes as a user reads them in an error."""
    return ", ".join(f"{s}://" for s in REDIS_SCHEMES + SENTINEL_SCHEMES + CLUSTER_SCHEMES
                     + SQL_SCHEMES)


def check_redis_url(url: str) -> None:
    """A ``redis://`` or ``rediss://`` URL's port and database are numbers (redis-py would
    fail later, quoting them: a piece of a password written unencoded).

    Raises:
        ValueError: naming what is wrong, never its text.
    """
    if scheme_of(url) == "unix":
        return
    parts = urlsplit(url)
    try:
        _ = parts.port
    except ValueError:
        raise ValueError(f"the port must be a number from 0 to 65535{_ENCODE}") from None
    path = parts.path.strip("/")
    if path and not _DIGITS.fullmatch(path):
        raise ValueError(f"the database must be a number{_ENCODE}")


@dataclass(frozen=True)
class SentinelUrl:
    """What a Sentinel URL says: the sentinels, the database and the master's
    credentials (the sentinels' own are in ``sentinel_kwargs``, as in kombu)."""

    sentinels: tuple[tuple[str, int], ...]
    db: int
    username: str | None = field(repr=False)
    password: str | None = field(repr=False)

    def where(self, master_name: str) -> str:
        """Where the store is, as errors and logs may show it: no credentials."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.db} (master {master_name!r})"


def parse_sentinel_url(url: str) -> SentinelUrl:
    """The sentinels of ``redis+sentinel://[user:password@]host:port[,host:port...][/db]``
    or of kombu's ``sentinel://[:password@]host:port[/db][;sentinel://host:port...]``
    (port 26379 when none is given; the first password and database named count).

    Raises:
        ValueError: not such a URL (the message never shows the password).
    """
    sentinels: list[tuple[str, int]] = []
    db, username, password = None, None, None
    for part in url.split(";"):
        if scheme_of(part) not in SENTINEL_SCHEMES:
            raise ValueError("each ';'-separated part must be a sentinel:// or "
                             "redis+sentinel:// URL")
        netloc = part.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0]
        auth, _, hosts = netloc.rpartition("@")
        if auth and password is None:
            user, _, secret = auth.partition(":")
            username, password = unquote(user) or None, unquote(secret) or None
        for host in hosts.split(","):
            sentinels.append(_host_port(host, len(sentinels) + 1))
        path = urlsplit(part.replace(netloc, "h", 1)).path.strip("/")
        if path and db is None:
            if not _DIGITS.fullmatch(path):
                raise ValueError(f"the database must be a number{_ENCODE}")
            db = int(path)
    return SentinelUrl(tuple(sentinels), db or 0, username, password)


@dataclass(frozen=True)
class ClusterUrl:
    """What a Redis Cluster URL says: some of its nodes (the client finds the rest) and
    the credentials."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = field(repr=False)
    password: str | None = field(repr=False)

    def where(self) -> str:
        """Where the store is, as errors and logs may show it: no credentials."""
        return "redis+cluster://" + ",".join(f"{h}:{p}" for h, p in self.nodes) + "/"


def parse_cluster_url(url: str) -> ClusterUrl:
    """The nodes of ``redis+cluster://[user:password@]host:port[,host:port...][/0]``
    (port 6379 when none is given).

    Raises:
        ValueError: not such a URL, or a database other than 0 (a cluster has only 0);
            the message never shows the password.
    """
    if scheme_of(url) not in CLUSTER_SCHEMES:
        raise ValueError("expected a redis+cluster:// URL")
    netloc = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0]
    auth, _, hosts = netloc.rpartition("@")
    user, _, secret = auth.partition(":")
    nodes = tuple(_host_port(host, i, 6379, "node")
                  for i, host in enumerate(hosts.split(","), 1))
    path = urlsplit(url.replace(netloc, "h", 1)).path.strip("/")
    if path not in ("", "0"):
        raise ValueError(f"a Redis Cluster has only database 0{_ENCODE}")
    return ClusterUrl(nodes, unquote(user) or None, unquote(secret) or None)


#: Why a URL whose password holds ``/ ? # @`` may look malformed. The errors name what
#: is wrong by position, never by its text: a parser cut at such a character takes a
#: piece of the password for a host, a port or a database.
_ENCODE = " (percent-encode any / ? # @ : in the password)"
_DIGITS = re.compile(r"[0-9]+")


def _host_port(text: str, index: int, default_port: int = 26379,
               what: str = "sentinel") -> tuple[str, int]:
    host, colon, port = text.rpartition(":") if not text.endswith("]") else (text, "", "")
    if not colon:
        host, port = text, str(default_port)
    host = host.strip("[]")
    if not host or not _DIGITS.fullmatch(port) or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port for each {what}; {what} {index} is not "
                         f"one{_ENCODE}")
    return host, int(port)
