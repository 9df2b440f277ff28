"""URLs as they may be shown in errors, logs and CLI output: without their passwords."""

from __future__ import annotations

from typing import Any


def safe_url(url: Any) -> Any:
    """``url`` with its password masked, as Celery shows URLs (kombu's ``sanitize_url``:
    ``redis://user:**@host:6379/0``). The query string, where redis-py also reads a
    ``password=``, is dropped; each URL of a ``;``-separated failover list is masked.
    Anything else (not a string, not a URL) is returned as it is."""
    if not isinstance(url, str):
        return url
    return ";".join(_one(part) for part in url.split(";"))


def _one(url: str) -> str:
    """One URL masked as kombu masks it (``scheme://user:**@host/path``, no query). The
    credentials are everything before the *last* ``@``: a password written with an
    unencoded ``/``, ``?``, ``#`` or ``@`` (which ends a netloc for a URL parser) is
    masked whole, never cut where a parser would cut it."""
    if "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    auth, at, tail = rest.rpartition("@")
    if at:
        user, colon, _ = auth.partition(":")
        rest = f"{user}:**@{tail}" if colon else f"{user}@{tail}"
    return f"{scheme}://{rest.split('?', 1)[0].split('#', 1)[0]}"
