"""Redis settings that can lose held tasks, read once when a dispatcher starts.

Held tasks exist only in Redis. An eviction policy other than ``noeviction`` lets Redis
delete keys under memory pressure: ``allkeys-*`` any key (a held message, a group's
list), ``volatile-*`` keys with a TTL — celery_fair's tombstones of superseded dispatches,
without which a stale duplicate copy of a task would run a second time. Without AOF and
RDB save points a restart loses everything held.
"""

from __future__ import annotations

import logging

import redis

logger = logging.getLogger(__name__)


def unsafe_settings(client: redis.Redis) -> list[str]:
    """One sentence per setting of ``client``'s server that can lose held tasks.

    Returns an empty list when the settings are safe, or cannot be read (managed services
    often disable ``CONFIG``; that is logged at INFO).
    """
    try:
        policy = _config(client, "maxmemory-policy")
        appendonly = _config(client, "appendonly")
        save = _config(client, "save")
    except redis.RedisError as exc:
        logger.info("celery_fair: could not read the Redis settings (%s); make sure "
                    "maxmemory-policy is noeviction and persistence is on", exc)
        return []
    found = []
    if policy.startswith("allkeys-"):
        found.append(f"maxmemory-policy is {policy}: under memory pressure Redis deletes "
                     "any key, held tasks included; set it to noeviction")
    elif policy != "noeviction":
        found.append(f"maxmemory-policy is {policy}: under memory pressure Redis deletes "
                     "keys with a TTL, including celery_fair's records of superseded "
                     "dispatches (a stale copy of a task could then run twice); set it "
                     "to noeviction")
    if appendonly != "yes" and not save.strip():
        found.append("persistence is off (appendonly no and no save points): a Redis "
                     "restart loses every held task; set appendonly yes")
    return found


def _config(client: redis.Redis, name: str) -> str:
    value = client.config_get(name).get(name, "")
    return value.decode() if isinstance(value, bytes) else str(value)
