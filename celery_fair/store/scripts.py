"""Loads the Lua scripts in ``lua/``: one file per atomic operation.

A line ``-- @include NAME`` is replaced by ``lua/include/NAME.lua``; that is the whole
preprocessor. Includes do not nest. For Redis Cluster (``cluster=True``) the singleton
keys' scope is the queue (``SG.app`` false in ``include/singleton.lua``): a script reaches
one slot only.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_INCLUDE = re.compile(r"^-- @include (\w+)$", re.MULTILINE)

OPERATIONS = ("hold", "hold_many", "pick", "confirm", "begin", "renew", "release", "reclaim",
              "promote", "configure", "cancel", "summarize", "limit", "check", "forget", "poll",
              "pause", "boost", "boost_task", "rate", "register", "assign", "check_scope")


def _read(path: str) -> str:
    return resources.files(__package__).joinpath("lua", path).read_text(encoding="utf-8")


_APP_SCOPE = "local SG = {app = true}"


@cache
def source(name: str, cluster: bool = False) -> str:
    """The runnable source of script ``name`` with its includes inserted (for Redis
    Cluster with ``cluster``)."""
    if name not in OPERATIONS:
        raise KeyError(f"no Lua script named {name!r}")

    def insert(match: re.Match[str]) -> str:
        included = _read(f"include/{match.group(1)}.lua")
        if _INCLUDE.search(included):
            raise ValueError(f"include {match.group(1)!r} includes another file")
        return included

    text = _INCLUDE.sub(insert, _read(f"{name}.lua"))
    return text.replace(_APP_SCOPE, "local SG = {app = false}") if cluster else text
