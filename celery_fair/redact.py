"""URLs as they may be shown in errors, logs and CLI output: without their passwords."""

from __future__ import annotations

from typing import Any

from kombu.utils.url import maybe_sanitize_url


def safe_url(url: Any) -> Any:
    """``url`` with its password masked, as Celery shows URLs (kombu's ``sanitize_url``:
    ``redis://user:**@host:6379/0``). The query string, where redis-py also reads a
    ``password=``, is dropped; each URL of a ``;``-separated failover list is masked.
    Anything else (not a string, not a URL) is returned as it is."""
    if not isinstance(url, str):
        return url
    return ";".join(_one(part) for part in url.split(";"))


def _one(url: str) -> str:
    if "://" not in url:
        return url
    if "," in url.split("://", 1)[1].split("/", 1)[0]:
        return _several_hosts(url)
    try:
        return str(maybe_sanitize_url(url))
    except ValueError:  # not parseable (a bad port...): keep only what precedes any secret
        return url.split("://", 1)[0] + "://<unparseable URL>"


def _several_hosts(url: str) -> str:
    """A URL naming several hosts (``redis+sentinel://:pw@h1:26379,h2:26379/0``), which
    kombu cannot parse: its password masked the same way, its query dropped."""
    scheme, rest = url.split("://", 1)
    netloc, slash, path = rest.partition("/")
    auth, at, hosts = netloc.rpartition("@")
    if at:
        user, colon, _ = auth.partition(":")
        netloc = f"{user}:**@{hosts}" if colon else f"{user}@{hosts}"
    return f"{scheme}://{netloc}{slash}{path.split('?', 1)[0]}"
