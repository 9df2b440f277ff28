"""Where held messages and dispatch state live. See base.Store for the contract."""

from __future__ import annotations

from .base import BeginResult, Picked, Store
from .redis import RedisStore

__all__ = ["BeginResult", "Picked", "RedisStore", "Store"]
