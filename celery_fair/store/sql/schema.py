"""The SQL store's tables (SQLAlchemy Core), named ``<prefix><table>``.

Every row carries the store's namespace (``fair_key_prefix``), so apps and test sessions
share a database without seeing each other. One row per thing the policy keeps
(``celery_fair.policy``): a fair queue, a group, a ready-set entry, a held or delayed
message, a dispatch; plus the runtime limits, pauses, throttles and rate buckets,
sharded counters, cancel answers, the quarantine, the worker registry, the dispatchers'
heartbeats, the dashboards' summaries and the audit log of controls.

Names compare byte-wise on every database (PostgreSQL ``COLLATE "C"``, MariaDB/MySQL
``utf8mb4_bin``, SQLite's default), as Redis compares them: ties in the ready set break
by name the same way everywhere, and "Acme" is not "acme".

Alembic migrations (``migrations/``) create and change these tables; the schema's
version is :data:`SCHEMA_VERSION`, checked before a store is used.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
)
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.types import TypeEngine

#: The Alembic revision the code expects (``migrations/versions``).
SCHEMA_VERSION = "0018"
#: Default table name prefix (``fair_store_table_prefix``).
DEFAULT_PREFIX = "fair_"


def name(length: int) -> TypeEngine[str]:
    """A name column that compares byte-wise on every database."""
    return String(length).with_variant(postgresql.VARCHAR(length, collation="C"),
                                       "postgresql").with_variant(
        mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb")


def blob() -> TypeEngine[bytes]:
    """A stored value (a message can pass MySQL's 64 KiB BLOB)."""
    return LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


NS, QUEUE, GROUP, HOLD, DISPATCH = 64, 200, 200, 255, 160
#: An affinity target: a worker's hostname, or 'queue:' and a real queue's name.
TARGET = 255
#: A singleton key (``singleton.MAX_KEY_LENGTH``).
KEY = 200
#: A stored rate limit: '<interval ms>:<burst>' or 'none' (``limits.encode_rate``).
RATE = 64


def _keys(*extra: Column) -> list[Column]:  # type: ignore[type-arg]
    return [Column("ns", name(NS), primary_key=True),
            Column("queue", name(QUEUE), primary_key=True), *extra]


def _tag_set(md: MetaData, table: str) -> Table:
    """A set of groups per class ordered by tag, then name (``ready``, ``over``)."""
    t = Table(table, md, *_keys(
        Column("klass", String(1), primary_key=True),
        Column("grp", name(GROUP), primary_key=True),
        Column("tag", Double, nullable=False)))
    Index(f"{table}_order", t.c.ns, t.c.queue, t.c.klass, t.c.tag, t.c.grp)
    return t


class Tables:
    """The tables of one prefix (an attribute per table)."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        self.prefix = prefix
        self.metadata = md = MetaData()
        p = prefix
        #: A fair queue: its virtual times, policy settings and id counters. Pick,
        #: promote, reclaim, configure and cancel lock this row: one at a time per queue.
        self.queues = Table(
            f"{p}queues", md, *_keys(
                Column("registered", Boolean, nullable=False, default=True),
                Column("vt_i", Double), Column("vt_b", Double),
                Column("default_cap", Integer, nullable=False, default=-1),
                Column("reserve", Integer, nullable=False, default=0),
                Column("default_weight", Double, nullable=False, default=1.0),
                Column("picks", BigInteger, nullable=False, default=0),
                Column("dups", BigInteger, nullable=False, default=0),
                # how many rows of ``pauses`` the queue has: 0 spares every operation
                # the look at them
                Column("pauses", Integer, nullable=False, default=0, server_default="0"),
                # the same for ``throttles``; and the rate limit of a group without one of
                # its own (None: none)
                Column("throttles", Integer, nullable=False, default=0, server_default="0"),
                Column("default_rate", String(RATE)),
                # fair_charge (0007): 'cost', 'count' or 'runtime'; None: 'cost'
                Column("charge", String(8)),
                # fair_policy (0009): 'wfq', 'harmony' or 'smallest' (0011) (None: 'wfq'),
                # and Harmony's pick
                # sequence (None: 0), ``stat`` ``served`` in Redis
                Column("policy", String(8)), Column("served", BigInteger),
                # fair_cap_mode ('hard', 'soft') and fair_interactive_share (None: none)
                # (0008)
                Column("cap_mode", String(8), nullable=False, default="hard",
                       server_default="hard"),
                Column("interactive_share", Double),
                # fair_aging_seconds under 'smallest' (0011; None: limits.DEFAULT_AGING)
                Column("aging", Double),
                # fair_subgroup (0012): 'none' or 'path' (None: 'none')
                Column("subgroup", String(8)),
                # fair_scope (0016): 'queue' or 'app' (None: 'queue')
                Column("scope", String(8))))
        #: Caps, weights and rate limits (stored rates, ``RATE``) of groups, from the
        #: settings and at runtime (``fair limit``), and a boost (``fair boost``): its
        #: weight wins until ``boost_until_ms`` (None: no end), kept apart so that
        #: nothing is restored when it ends.
        self.limits = Table(
            f"{p}limits", md, *_keys(
                Column("grp", name(GROUP), primary_key=True),
                Column("conf_cap", Integer), Column("conf_weight", Double),
                Column("limit_cap", Integer), Column("limit_weight", Double),
                Column("boost_weight", Double), Column("boost_until_ms", BigInteger),
                Column("conf_rate", String(RATE)), Column("limit_rate", String(RATE))))
        #: A group with held, delayed or in-flight work (forgotten when idle). Hold,
        #: release and begin lock only this row: groups never wait for each other.
        self.groups = Table(
            f"{p}groups", md, *_keys(
                Column("grp", name(GROUP), primary_key=True),
                Column("inflight", Integer, nullable=False, default=0),
                Column("delayed", Integer, nullable=False, default=0),
                Column("held_i", Integer, nullable=False, default=0),
                Column("held_b", Integer, nullable=False, default=0),
                Column("tag_i", Double), Column("tag_b", Double),
                # when each class's head became the head (ms; 0006): stale while its
                # list is empty, None for a head older than the column
                Column("since_i", BigInteger), Column("since_b", BigInteger),
                # the next place at the head (decreasing) and at the tail (increasing)
                Column("head", BigInteger, nullable=False, default=0),
                Column("tail", BigInteger, nullable=False, default=1),
                # fair_charge 'runtime': the group's mean runtime (seconds; 0007; None:
                # none reported yet), the estimate its next dispatches are charged
                Column("runtime", Double),
                # Harmony (0009): the queue's pick sequence when the group was last served
                # (None: never) and the rank ``fair boost --task`` set until its next pick
                Column("served", BigInteger), Column("jump", Double),
                # fair_subgroup 'path' (0012): JSON {class: {subgroup: its last key,
                # "\n": the key picked last}} (sql/subgrouping.py; None: none)
                Column("subtags", Text),
                # caps per subgroup (0017): its messages parked, per class (not in
                # held_i, held_b: those count its lists; sql/subcaps.py)
                Column("parked_i", Integer, nullable=False, default=0, server_default="0"),
                Column("parked_b", Integer, nullable=False, default=0, server_default="0"),
                # fair_scope 'app' under wfq (0018, sql/scoping.py): per class, the app's
                # charge total of the group when this queue last took it into its tag
                Column("seen_i", Double), Column("seen_b", Double)))
        #: A group that may be picked now, in its class, with its virtual start tag (its
        #: rank under Harmony).
        self.ready = _tag_set(md, f"{p}ready")
        #: Soft caps (0008): a group at or over its cap with work held, in its class, with
        #: its tag: the pick's fallback when no group is ready. Empty under hard caps.
        self.over = _tag_set(md, f"{p}over")
        #: A held message (``seq``: its place in its group's list) or a delayed one
        #: (``due_ms``). Under 'smallest' (0011) a message held at the tail gets the
        #: group's tail without taking it and its sort key as ``sort_key``: the list's
        #: order is (seq, sort_key, hold_id), a NULL sort_key last (``statements.list_order``).
        self.messages = Table(
            f"{p}messages", md, *_keys(
                Column("hold_id", name(HOLD), primary_key=True),
                Column("task_id", name(HOLD), nullable=False),
                Column("grp", name(GROUP), nullable=False),
                Column("klass", String(1), nullable=False),
                Column("cost", Double, nullable=False),
                Column("front", Boolean, nullable=False),
                Column("seq", BigInteger), Column("due_ms", BigInteger),
                Column("value", blob(), nullable=False), Column("sort_key", Double),
                # caps per subgroup (0017): a message parked while its subgroup is at its
                # cap (seq NULL) names it, in ``parked_seq`` order (sql/subcaps.py)
                Column("parked", name(GROUP)), Column("parked_seq", BigInteger)))
        m = self.messages.c
        Index(f"{p}messages_parked", m.ns, m.queue, m.klass, m.grp, m.parked, m.parked_seq)
        Index(f"{p}messages_list", m.ns, m.queue, m.klass, m.grp, m.seq)
        # Partial (PostgreSQL, SQLite): only delayed messages, so a planner on stale
        # statistics never reads a group's head through it (it filtered whole queues).
        Index(f"{p}messages_due", m.ns, m.queue, m.due_ms,
              postgresql_where=m.due_ms.is_not(None), sqlite_where=m.due_ms.is_not(None))
        Index(f"{p}messages_task", m.ns, m.queue, m.task_id)
        #: A dispatch from pick to release, then its tombstone until ``expires_ms``.
        self.dispatches = Table(
            f"{p}dispatches", md, *_keys(
                Column("did", name(DISPATCH), primary_key=True),
                Column("state", String(12), nullable=False),
                Column("hold_id", name(HOLD), nullable=False),
                Column("task_id", name(HOLD), nullable=False),
                Column("grp", name(GROUP), nullable=False),
                Column("klass", String(1), nullable=False),
                Column("cost", Double, nullable=False),
                Column("front", Boolean, nullable=False),
                Column("value", blob()),
                Column("kept", Boolean, nullable=False, default=False),
                Column("runner", name(HOLD), nullable=False, default=""),
                Column("lease_ms", BigInteger), Column("expires_ms", BigInteger),
                # the estimate the pick charged under fair_charge 'runtime' (0007; None:
                # another charge), corrected at release by the runtime reported
                Column("estimate", Double),
                # fair_affinity: the target a routed dispatch went to (0013; NULL: not
                # routed), counted while live through dispatches_state
                Column("target", name(TARGET)),
                # caps per subgroup: the subgroup it counts against (0017; NULL: none),
                # counted while live through dispatches_subgroup
                Column("subgroup", name(GROUP))))
        #: fair_affinity: each group's target (the map; ``sql/routing.py``, 0013).
        self.assignments = Table(
            f"{p}assignments", md, *_keys(
                Column("grp", name(GROUP), primary_key=True),
                Column("target", name(TARGET), nullable=False)))
        d = self.dispatches.c
        Index(f"{p}dispatches_lease", d.ns, d.queue, d.lease_ms)
        Index(f"{p}dispatches_state", d.ns, d.queue, d.state)
        Index(f"{p}dispatches_task", d.ns, d.queue, d.task_id)
        Index(f"{p}dispatches_expiry", d.ns, d.queue, d.expires_ms)
        Index(f"{p}dispatches_subgroup", d.ns, d.queue, d.grp, d.subgroup)
        #: Counters every release or skip adds to, in shards (no single hot row).
        self.counters = Table(
            f"{p}counters", md, *_keys(
                Column("name", String(16), primary_key=True),
                Column("shard", SmallInteger, primary_key=True, autoincrement=False),
                Column("n", BigInteger, nullable=False, default=0)))
        #: What a cancel call removed, to answer its resend the same.
        self.cancels = Table(
            f"{p}cancels", md, *_keys(
                Column("token", name(64), primary_key=True),
                Column("expires_ms", BigInteger, nullable=False),
                Column("answer", blob(), nullable=False)))
        #: Undecodable messages, kept for a human (the newest QUARANTINE_MAX).
        self.quarantine = Table(
            f"{p}quarantine", md, *_keys(
                Column("hold_id", name(DISPATCH), primary_key=True),
                Column("value", blob(), nullable=False),
                Column("reason", Text, nullable=False),
                Column("at_ns", BigInteger, nullable=False)))
        #: Workers consuming a fair queue, until their registration expires; when each
        #: registered first and its slot (``registry.py``; NULL: a row of a version
        #: before slots, or a slot freed because its registration expired). The unique
        #: index keeps two workers from ever taking one slot.
        self.workers = Table(
            f"{p}workers", md, *_keys(
                Column("worker", name(255), primary_key=True),
                Column("concurrency", Integer, nullable=False),
                Column("expires_ms", BigInteger, nullable=False),
                Column("started_ms", BigInteger),
                Column("slot", Integer)))
        Index(f"{p}workers_slot", self.workers.c.ns, self.workers.c.queue,
              self.workers.c.slot, unique=True)
        #: The summary document dashboards read, and which dispatcher writes it.
        self.summaries = Table(
            f"{p}summaries", md, *_keys(
                Column("doc", Text), Column("expires_ms", BigInteger, nullable=False,
                                            default=0),
                Column("writer_until", BigInteger, nullable=False, default=0)))
        #: The dispatchers' heartbeats (not per queue: a dispatcher serves several),
        #: until ``expires_ms``; ``queues`` is a JSON list.
        self.dispatchers = Table(
            f"{p}dispatchers", md,
            Column("ns", name(NS), primary_key=True),
            Column("id", name(255), primary_key=True),
            Column("host", name(255), nullable=False),
            Column("pid", Integer, nullable=False),
            Column("started_ms", BigInteger, nullable=False),
            Column("last_step_ms", BigInteger, nullable=False),
            Column("queues", Text, nullable=False),
            Column("every_queue", Boolean, nullable=False),
            Column("app", name(255), nullable=False),
            Column("expires_ms", BigInteger, nullable=False))
        #: Paused groups (``fair pause``; grp '' the whole queue), until ``until_ms``
        #: (None: until resumed); the queue's ``pauses`` counts them.
        self.pauses = Table(
            f"{p}pauses", md, *_keys(
                Column("grp", name(GROUP), primary_key=True),
                Column("until_ms", BigInteger)))
        #: Throttled groups (their rate, a task's ``fair_throttle``; not eligible) until
        #: ``until_ms`` (fractional: a rate's token falls between milliseconds); the
        #: queue's ``throttles`` counts them. ``promote`` lifts them in ``until_ms`` order.
        self.throttles = Table(
            f"{p}throttles", md, *_keys(
                Column("grp", name(GROUP), primary_key=True),
                Column("until_ms", Double, nullable=False)))
        Index(f"{p}throttles_until", self.throttles.c.ns, self.throttles.c.queue,
              self.throttles.c.until_ms, self.throttles.c.grp)
        #: The theoretical arrival times (GCRA) of rate-limited groups; one in the past
        #: is a full bucket (``promote`` deletes it).
        self.tats = Table(
            f"{p}tats", md, *_keys(
                Column("grp", name(GROUP), primary_key=True),
                Column("tat", Double, nullable=False)))
        Index(f"{p}tats_tat", self.tats.c.ns, self.tats.c.queue, self.tats.c.tat)
        #: The audit log of controls (``store/audit.py``): one JSON document per entry,
        #: ``seq`` in the order appended (trimmed to AUDIT_MAX per namespace).
        self.audit = Table(
            f"{p}audit", md,
            Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                   autoincrement=True),
            Column("ns", name(NS), nullable=False),
            Column("at_ms", BigInteger, nullable=False),
            Column("doc", Text, nullable=False),
            Index(f"{p}audit_ns_seq", "ns", "seq"))
        self.skeys, self.sowners, self.swaits, self.sadmits = _singleton_tables(md, p)
        self.scope_n, self.scope_refresh, self.scope_charge = _scope_tables(md, p)


def _singleton_tables(md: MetaData, p: str) -> tuple[Table, Table, Table, Table]:
    """Singleton keys (0014, 0015: the app's scope; ``singletons.py``), as Redis's
    ``skey``/``sowner``/``sw:``/``sadmit:``: the key of a held message (``ref`` 'h'<hold
    id>) or of a dispatch ('d'<dispatch id>); a key's owner (the same encoding, its queue
    ``oqueue``); a key's waiting hold ids in ``pos`` order (their queue ``wqueue``); the
    owners and waiting lists are the namespace's (queue ''); a queue's waiters handed to
    it, to admit at its promote."""
    keys = Table(f"{p}skeys", md, *_keys(
        Column("ref", name(HOLD + 1), primary_key=True),
        Column("skey", name(KEY), nullable=False)))
    owners = Table(f"{p}sowners", md, *_keys(
        Column("skey", name(KEY), primary_key=True),
        Column("owner", name(HOLD + 1), nullable=False),
        Column("oqueue", name(QUEUE), nullable=False, server_default="")))
    waits = Table(f"{p}swaits", md, *_keys(
        Column("skey", name(KEY), primary_key=True),
        Column("pos", BigInteger, primary_key=True, autoincrement=False),
        Column("hold_id", name(HOLD), nullable=False),
        Column("wqueue", name(QUEUE), nullable=False, server_default="")))
    Index(f"{p}swaits_wait", waits.c.ns, waits.c.wqueue, waits.c.hold_id)
    admits = Table(f"{p}sadmits", md, *_keys(Column("hold_id", name(HOLD), primary_key=True)))
    return keys, owners, waits, admits


def _scope_tables(md: MetaData, p: str) -> tuple[Table, Table, Table]:
    """fair_scope 'app' (0016; ``scoping.py``), as Redis's ``<ns>:scope:n`` and
    ``<ns>:scope:refresh:<queue>``: a group's dispatches in flight over the namespace's
    app-scoped queues (a row while not 0), and the groups a queue's next promote
    refreshes (another queue freed a slot of them). The app-scoped queues are those
    whose ``scope`` is 'app'."""
    counts = Table(f"{p}scope_n", md,
                   Column("ns", name(NS), primary_key=True),
                   Column("grp", name(GROUP), primary_key=True),
                   Column("n", Integer, nullable=False))
    refresh = Table(f"{p}scope_refresh", md, *_keys(
        Column("grp", name(GROUP), primary_key=True)))
    # wfq shares across the queues (0018): per class and group, the tag advances charged
    # over the app-scoped queues (Redis's <ns>:scope:charge)
    charge = Table(f"{p}scope_charge", md,
                   Column("ns", name(NS), primary_key=True),
                   Column("klass", String(1), primary_key=True),
                   Column("grp", name(GROUP), primary_key=True),
                   Column("total", Double, nullable=False))
    return counts, refresh, charge
