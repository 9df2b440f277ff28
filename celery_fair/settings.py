"""Every ``fair_*`` setting: its name, default and meaning (:data:`SETTINGS`). The README's
settings table and the docs are generated from it; ``config.py`` validates each one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    doc: str


#: The shortest fair_store_replicas_timeout (seconds): WAIT counts whole milliseconds,
#: and WAIT with 0 waits for ever (until the socket times out and the write is resent).
MIN_REPLICAS_TIMEOUT = 0.001

SETTINGS: tuple[Setting, ...] = (
    Setting("fair_store_url", None,
            "URL of the holding store: Redis (redis://, rediss://, unix://), Redis behind "
            "Sentinel (redis+sentinel://host:port,host:port/db, or kombu's "
            "sentinel://host:port;sentinel://host:port; the master's name in "
            "fair_store_transport_options), a Redis Cluster "
            "(redis+cluster://host:port,host:port/, any of its nodes; database 0 only) "
            "or a SQL database (postgresql://, mysql://, "
            "mariadb://, sqlite:///; run `fair migrate` first). Default: the broker URL "
            "when it is Redis (or Sentinel)."),
    Setting("fair_store_transport_options", {},
            "Sentinel store, as Celery's broker_transport_options: {'master_name': "
            "'mymaster' (required), 'sentinel_kwargs': {'password': ...} (how to connect "
            "to the sentinels themselves)}. The master's password is the URL's. Default, "
            "when the store is the broker: the broker's master_name and sentinel_kwargs."),
    Setting("fair_store_replicas", 0,
            "Redis store: replicas each hold, release and cancel waits for (WAIT) before "
            "it returns, and each dispatcher pick before it is published, so that a "
            "failover is unlikely to lose it (Sentinel may still "
            "promote a replica that had not acknowledged); fewer in time fail the call "
            "with ReplicationTimeout (a hold: HoldNotReplicated). 0: Redis's asynchronous "
            "replication (a failover may lose the last writes)."),
    Setting("fair_store_replicas_timeout", 1.0,
            "Seconds a write waits for fair_store_replicas replicas; shorter than "
            "fair_store_socket_timeout, at least 0.001."),
    Setting("fair_key_prefix", "fair", "Namespace of the store: prefix of every Redis key, "
            "and the namespace column of every SQL row, celery_fair writes."),
    Setting("fair_default_group", "default",
            "Group of a fair task whose group cannot be resolved otherwise."),
    Setting("fair_default_concurrency", None,
            "Most tasks of one group in flight at once (None: no cap)."),
    Setting("fair_group_concurrency", {},
            "Per-group caps overriding the default: {group: n}. Under fair_subgroup 'path' a "
            "key with a '/' (a subgroup path, 'acme/alice') caps that subgroup (every store; "
            "SQL: migration 0017)."),
    Setting("fair_group_weights", {},
            "Per-group weights (default 1): a weight-2 group gets twice the share."),
    Setting("fair_default_rate_limit", None,
            "Rate limit of every group without one of its own: Celery's notation ('10/s', "
            "'100/m', '5/h'), or {'rate': '10/s', 'burst': 20} to let up to 20 go at once "
            "after a quiet spell (default burst 1). None: no rate limit."),
    Setting("fair_group_rate_limits", {},
            "Per-group rate limits overriding the default: {group: '10/m', or {'rate': ..., "
            "'burst': n}, or None for no rate limit}. `fair limit GROUP --rate` overrides "
            "these at runtime."),
    Setting("fair_group_max_held", None,
            "Backpressure: most tasks one group may hold in a fair queue (waiting, both "
            "classes, and delayed); holding one more raises GroupFull at publish time "
            "(None: unlimited). Retries are never refused."),
    Setting("fair_group_max_held_overrides", {},
            "Per-group limits overriding fair_group_max_held: {group: n or None}."),
    Setting("fair_policy", "wfq",
            "Scheduling policy of every fair queue: 'wfq' (weighted fair queueing: each "
            "group gets its weight's share of the dispatches), 'harmony' (the group "
            "with the fewest tasks in flight per unit of weight goes first; ties go to "
            "the group served least recently) or 'smallest' (groups as under wfq; inside "
            "a group the held task with the smallest declared cost first, aged by "
            "fair_aging_seconds). Every store runs all three. See docs/policies.md."),
    Setting("fair_charge", "cost",
            "What a dispatch charges its group's share under 'wfq' and 'smallest': 'cost' "
            "(the task's declared fair_cost), 'count' (1 per task, whatever its cost) or "
            "'runtime' "
            "(the wall time the task ran, measured by the worker: the group's mean "
            "runtime, or the declared cost in seconds until it has one, is charged at "
            "dispatch and corrected at release). See docs/policies.md."),
    Setting("fair_cap_mode", "hard",
            "How a group's concurrency cap binds: 'hard' (a group at its cap waits) or "
            "'soft' (a group at its cap may go on only while no other group has work it "
            "may run; a newcomer gets the next free slot). A cap of 0 pauses either way. "
            "See docs/policies.md."),
    Setting("fair_interactive_share", None,
            "The most of a fair queue's capacity interactive tasks may hold while "
            "background tasks wait: a number in (0, 1], such as 0.8; None (the default) "
            "is strict priority, interactive first. Needs a capacity (fair_max_inflight). "
            "See docs/policies.md."),
    Setting("fair_aging_seconds", 1.0,
            "Under fair_policy 'smallest': the seconds of waiting worth one unit of declared "
            "cost. A held task of cost c ranks as if it had come c times this many seconds "
            "later, so a task is never passed by tasks of its group that became "
            "dispatchable more than that later (0: arrival order). See docs/policies.md."),
    Setting("fair_affinity", "none",
            "'hash': each group's tasks go to one live worker's own queue (Celery's "
            "worker_direct queue, which celery-fair makes the workers consume), chosen by "
            "consistent hashing over the live workers so that a worker joining or leaving "
            "moves as few groups as possible; a group waits for a free slot of its own "
            "worker. 'none' (the default): any worker. Every store (Redis, SQL, memory). "
            "See docs/affinity.md."),
    Setting("fair_affinity_spill_seconds", None,
            "With fair_affinity 'hash': after this many seconds waiting for its own "
            "worker's free slot, a group's next task goes to the worker with the most "
            "room. None (the default): it waits."),
    Setting("fair_subgroup", "none",
            "Two-level fairness: 'path' holds a task whose group is \"acme/alice\" (split "
            "at the first '/') in the group 'acme' as its subgroup 'alice': groups take "
            "turns as the policy says, and inside a group its subgroups take turns by "
            "fair queueing, weighted by fair_group_weights keyed by the path "
            "(\"acme/alice\"). 'none' (the default): \"acme/alice\" is a group of its own. "
            "Not with fair_policy 'smallest'. Every store (SQL: migration 0012). See "
            "docs/policies.md."),
    Setting("fair_scope", "queue",
            "Where a group's cap counts its tasks in flight: 'queue' (the default: in each "
            "fair queue apart) or 'app' (over every fair queue whose scope is 'app': a cap "
            "of 2 lets the group run 2 at once across them, not 2 per queue). Every store "
            "but Redis Cluster (SQL: migration 0016). See docs/policies.md."),
    Setting("fair_assign", None,
            "With fair_affinity 'hash': a function (group, workers) -> hostname or None "
            "choosing a group's worker instead of the hash, or its path "
            "('module:function'); workers are AssignWorker (hostname, started_at, pool, "
            "queues). None, an unknown hostname or an error (logged) fall back to the "
            "hash."),
    Setting("fair_group_queues", {},
            "Dedicated pools: {group glob pattern: real queue name}, such as {'vip-*': "
            "'vip'}. A matching group's tasks go to that real queue (so to the workers "
            "consuming it, whose pools are its capacity) while the group stays in its "
            "fair queue's accounting (virtual time, caps, weights); the first matching "
            "pattern wins, and one naming the fair queue itself keeps its groups there. "
            "Every store (Redis, SQL, memory). See docs/affinity.md."),
    Setting("fair_queue_policies", {},
            "Per fair queue, companion settings overriding the app-wide ones: {queue: "
            "{'fair_policy': 'harmony', 'fair_charge': 'runtime', 'fair_cap_mode': "
            "'soft', 'fair_interactive_share': 0.8, 'fair_aging_seconds': 2, "
            "'fair_affinity': 'hash', 'fair_affinity_spill_seconds': 30, "
            "'fair_group_queues': {'vip-*': 'vip'}, 'fair_subgroup': 'path'}}."),
    Setting("fair_max_inflight", "auto",
            "Tasks in flight per fair queue: 'auto' (sum of live workers' pool sizes "
            "consuming the queue, plus fair_dispatch_ahead when that sum is not 0) or a "
            "positive number (the capacity as it is)."),
    Setting("fair_dispatch_ahead", "auto",
            "With fair_max_inflight 'auto': messages kept in the real queue beyond the "
            "workers' free slots, so a slot that frees up takes its next task at once "
            "instead of waiting for the dispatcher. 'auto': 0 where releases refill the "
            "slots they free (the store's Redis is the broker, fair_direct_push), else 2; "
            "or a number (0: none)."),
    Setting("fair_interactive_reserve", 1,
            "Extra slots above a group's cap usable only by interactive tasks."),
    Setting("fair_lease_seconds", 30,
            "How long a dispatched task's slot survives without a sign of life from a worker."),
    Setting("fair_done_ttl", 3900,
            "Seconds a finished dispatch is remembered (about 30 bytes of Redis each), so "
            "a copy the broker redelivers after the task ran (acks_late: the ack died with "
            "its worker or connection) is skipped, not run twice; must cover the broker's "
            "redelivery delay (Redis: visibility_timeout, 3600 by default). 0: off."),
    Setting("fair_batch_size", 100, "Most messages one dispatcher pick takes at once."),
    Setting("fair_direct_push", True,
            "When the broker is the store's own Redis, let the pick script push messages "
            "into kombu's queue itself (no publish round trip); False: always publish "
            "with kombu."),
    Setting("fair_quick_start", False,
            "Let a task that acks early start without asking the store first (one round "
            "trip less per task) when its message was pushed by the pick script itself "
            "(fair_direct_push), is a first delivery and has over half its lease left. "
            "Trade-off: should its worker die mid-task, the task runs again after its "
            "lease instead of being lost. acks_late tasks always ask."),
    Setting("fair_tasks", {},
            "Tasks published by name (send_task, beat) that celery_fair.install(app) holds: "
            "{name or glob: {'group': 'kwarg:NAME' / 'arg:N' / 'header:NAME' / "
            "'value:GROUP' (or a list of them, or a callable (args, kwargs) -> group), "
            "'interactive': bool, 'cost': n}}."),
    Setting("fair_group_resolver", None,
            "Web integrations (Django middleware, Flask extension): the group of tasks "
            "published during a request, as a callable request -> group or its dotted "
            "path ('myapp.tenancy.tenant_of'). None: the logged-in user's id."),
    Setting("fair_metrics_port", None,
            "Port where `celery fair dispatch` serves Prometheus metrics on /metrics "
            "(None: off; needs the `metrics` extra)."),
    Setting("fair_metrics_address", "0.0.0.0", "Address the metrics endpoint listens on."),
    Setting("fair_metrics_groups", 10,
            "Groups with metric series of their own: the ones holding the most tasks; "
            "the others are summed under group `_other` (0: only `_other`)."),
    Setting("fair_on_store_error", "raise",
            "When the store cannot hold a fair task at publish time (Redis down or full): "
            "'raise' a StoreError naming the store, or 'publish' the task straight to the "
            "broker (it runs, but outside fairness and caps). 'publish' only when it was "
            "certainly not held (no connection, or the store full); a lost reply raises "
            "HoldOutcomeUnknown either way."),
    Setting("fair_store_socket_timeout", 5.0,
            "Seconds one store command may wait for Redis's answer before it fails (and "
            "is retried); bounds how long a task start, release or publish blocks on a "
            "store that stopped answering."),
    Setting("fair_store_connect_timeout", 5.0,
            "Seconds a connection to the store may take to open."),
    Setting("fair_store_retries", 3,
            "Times a store command that timed out or lost its connection is tried again, "
            "with backoff, before it fails with StoreConnectionError (0: never)."),
    Setting("fair_spool_dir", None,
            "Directory of the release spool (releases that could not reach the store, "
            "kept on disk for whoever meets their dead process). None: "
            "`celery-fair-spool-<uid>` in the temporary directory. Created with mode 0700; "
            "refused when owned by another user or open to group or others."),
    Setting("fair_report_interval", 10,
            "Seconds between the dispatcher's report lines (one INFO line per fair queue "
            "with work: dispatched/s, held, in flight / capacity, ahead, oldest wait, top "
            "group by wait); 0: no report."),
    Setting("fair_log_utc", True,
            "Log timestamps in UTC (ISO 8601 with a Z) in `celery fair dispatch` and in "
            "workers that load celery_fair; False: the local time, as Celery logs it."),
    Setting("fair_store_table_prefix", "fair_",
            "SQL store: prefix of its table names (letters, digits and underscores, "
            "starting with a letter, at most 20 characters), so several apps or "
            "environments share a database; each prefix is migrated on its own "
            "(`celery -A proj fair migrate`)."),
)
_DEFAULTS = {s.name: s.default for s in SETTINGS}


def settings_table() -> str:
    """The settings as a Markdown table (the README's table is this, verbatim)."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    rows += [f"| `{s.name}` | `{s.default!r}` | {s.doc} |" for s in SETTINGS]
    return "\n".join(rows)
