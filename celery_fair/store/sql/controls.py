"""The SQL store's operations that change what is held or the policy: cancel,
quarantine, configure and limit (``FairQueue``'s of the same names)."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from sqlalchemy import Connection, and_, delete, select, update

from ... import limits
from ...policy.decisions import CLASSES, task_of
from ..base import KEEP as KEEP_LIMIT
from ..base import RESET as RESET_LIMIT
from ..models import Policy
from . import subcaps
from .metering import rerate
from .rows import upsert
from .schema import Tables
from .scoping import scope_change
from .singletons import removed
from .statements import Statements
from .subgrouping import emptied
from .unit import Unit


class Controls:
    """Cancel, quarantine, configure and limit, for one store's tables and namespace."""

    def __init__(self, s: Statements, ns: str, notify: str | None = None) -> None:
        self.s, self.t, self.ns, self.notify = s, s.t, ns, notify

    # -- cancel ---------------------------------------------------------------------------

    def cancel(self, conn: Connection, queue: str, task_ids: list[str], token: str,
               keep_until_ms: int, wall_ms: int, now_ms: int) -> list[tuple[str, bytes]]:
        u = Unit(conn, self.s, self.ns, queue, True, self.notify)
        c = self.t.cancels.c
        known = conn.execute(select(c.answer).where(
            c.ns == self.ns, c.queue == queue, c.token == token, c.expires_ms > wall_ms)
        ).scalar()
        if known is not None:
            return _answer(bytes(known))
        out: list[tuple[str, bytes]] = []
        seen: set[str] = set()
        for task_id in task_ids:
            for hold_id in [task_id, *self._copies_of(conn, queue, task_id)]:
                value = None if hold_id in seen else self._remove(u, hold_id, now_ms)
                seen.add(hold_id)
                if value is not None:
                    out.append((hold_id, value))
        if out:
            upsert(conn, self.t.cancels, [{**u.key, "token": token, "expires_ms": keep_until_ms,
                                           "answer": _encode(out)}], ["expires_ms", "answer"])
        u.flush()
        return out

    def _copies_of(self, conn: Connection, queue: str, task_id: str) -> list[str]:
        m = self.t.messages.c
        head = task_id + "~"
        found = conn.execute(select(m.hold_id).where(
            m.ns == self.ns, m.queue == queue, m.task_id == task_of(task_id))).scalars()
        return sorted(h for h in found if h.startswith(head))

    def _remove(self, u: Unit, hold_id: str, now_ms: int) -> bytes | None:
        m = self.t.messages.c
        mine = and_(m.ns == self.ns, m.queue == u.queue, m.hold_id == hold_id)
        row = u.conn.execute(select(m.grp, m.klass, m.seq, m.due_ms, m.value, m.parked
                                    ).where(mine)).first()
        if row is None:
            return None
        if row.seq is None and row.due_ms is None and row.parked is None:  # waiting for
            # its singleton key
            u.conn.execute(delete(self.t.messages).where(mine))
            removed(u, hold_id, now_ms)
            return bytes(row.value)
        # a listed owner: its key's next waiter enters first (FairQueue._remove), so a
        # group whose own waiter takes over is not forgotten in between (its tag kept)
        removed(u, hold_id, now_ms)
        group = u.group(row.grp)
        assert group is not None
        if row.due_ms is not None:
            group["delayed"] -= 1
        elif row.parked is not None:  # parked (caps per subgroup): out of its parked list
            group[f"parked_{row.klass}"] -= 1
        else:
            if hold_id == u.list_head(row.grp, row.klass):  # the next one is the head now
                group[f"since_{row.klass}"] = now_ms
            group[f"held_{row.klass}"] -= 1
            emptied(group, row.klass)
        u.conn.execute(delete(self.t.messages).where(mine))
        u.refresh(row.grp)
        u.forget_if_idle(row.grp)
        return bytes(row.value)

    # -- quarantine -----------------------------------------------------------------------

    def set_aside(self, conn: Connection, queue: str, hold_id: str, value: bytes,
                  why: str) -> None:
        upsert(conn, self.t.quarantine, [{"ns": self.ns, "queue": queue, "hold_id": hold_id,
                                          "value": value, "reason": why,
                                          "at_ns": time.time_ns()}], ["value", "reason", "at_ns"])

    def trim_quarantine(self, conn: Connection, queue: str, keep: int) -> list[str]:
        q = self.t.quarantine.c
        rows = list(conn.execute(select(q.hold_id).where(q.ns == self.ns, q.queue == queue)
                                 .order_by(q.at_ns.desc(), q.hold_id).offset(keep)).scalars())
        for i in range(0, len(rows), 500):
            conn.execute(delete(self.t.quarantine).where(
                q.ns == self.ns, q.queue == queue, q.hold_id.in_(rows[i:i + 500])))
        return rows[::-1]

    # -- the policy settings --------------------------------------------------------------

    def configure(self, conn: Connection, queue: str, policy: Policy) -> None:
        limits.check_policy(policy)
        u = Unit(conn, self.s, self.ns, queue, True, self.notify)
        g = self.t.groups.c
        u.lock_groups(conn.execute(select(g.grp).where(g.ns == self.ns, g.queue == queue))
                      .scalars())
        u.load_ready([(k, name) for name in u.groups for k in CLASSES])  # before the change
        sub_change = (u.q["subgroup"] or limits.NO_SUBGROUP) != policy.subgroup
        if (u.q["policy"] == limits.SMALLEST and policy.name != limits.SMALLEST) \
                or sub_change:
            for row in u.groups.values():  # what is held keeps its order; later holds
                if row is not None:  # go after it (configure.lua drops the sort keys)
                    row["tail"] += 1
                    row["subtags"] = None if sub_change else row["subtags"]
        if policy.name != (u.q["policy"] or limits.WFQ):  # the scores change meaning:
            u.ready.update((key, None) for key in u.ready)  # every group enters anew
            u.over.update((key, None) for key in u.over)  # (configure.lua: both sets)
        tc = self.t.tats.c  # the rates in force of the groups with a bucket (rerate below)
        rated = sorted(conn.execute(select(tc.grp).where(tc.ns == self.ns, tc.queue == queue))
                       .scalars())
        u.load_limits(rated)
        before = {name: u.rate(name) for name in rated}
        q = self.t.queues.c
        settings = {"default_cap": -1 if policy.default_cap is None else policy.default_cap,
                    "reserve": policy.interactive_reserve,
                    "default_weight": policy.default_weight,
                    "default_rate": None if policy.default_rate is None
                    else policy.default_rate.encode(), "charge": policy.charge,
                    "policy": policy.name, "cap_mode": policy.cap_mode,
                    "interactive_share": policy.interactive_share,
                    "aging": policy.aging_seconds, "subgroup": policy.subgroup,
                    "scope": policy.scope}
        scope_change(u, policy.scope)
        conn.execute(update(self.t.queues).where(q.ns == self.ns, q.queue == queue)
                     .values(settings))
        u.q.update(settings)
        # Buckets and throttles are left as they are (configure.lua), a restart with the
        # same settings changes nothing, but for the groups whose rate in force changed.
        lt = self.t.limits.c
        conn.execute(update(self.t.limits).where(lt.ns == self.ns, lt.queue == queue)
                     .values(conf_cap=None, conf_weight=None, conf_rate=None))
        names = sorted(set(policy.caps) | set(policy.weights) | set(policy.rates))
        upsert(conn, self.t.limits, [{
            **u.key, "grp": g, "conf_cap": policy.caps.get(g),
            "conf_weight": policy.weights.get(g),
            "conf_rate": limits.encode_rate(policy.rates[g]) if g in policy.rates else None}
            for g in names], ["conf_cap", "conf_weight", "conf_rate"])
        drop_empty_limits(conn, self.t, self.ns, queue)
        for name, rate in before.items():
            u.forget_limits(name)
            rerate(u, name, rate)
        for name in list(u.groups):
            u.refresh(name)
        subcaps.unpark_all(u)
        u.woken = True
        u.flush()

    def limit(self, conn: Connection, queue: str, g: str, cap: int | str,
              weight: float | str) -> tuple[int, float, bool]:
        """Set, keep or clear g's runtime cap and weight; returns both in force and
        whether g entered a ready set."""
        u = Unit(conn, self.s, self.ns, queue, False, self.notify)
        u.group(g)
        u.load_ready([(k, g) for k in CLASSES])  # before the change
        lt = self.t.limits.c
        row = conn.execute(select(self.t.limits).where(
            lt.ns == self.ns, lt.queue == queue, lt.grp == g)).mappings().first()
        values: dict[str, Any] = dict(row) if row else {**u.key, "grp": g, "conf_cap": None,
                                                        "conf_weight": None, "limit_cap": None,
                                                        "limit_weight": None,
                                                        "boost_weight": None,
                                                        "boost_until_ms": None}
        if cap != KEEP_LIMIT:
            values["limit_cap"] = None if cap == RESET_LIMIT else int(cap)
        if weight != KEEP_LIMIT:
            values["limit_weight"] = None if weight == RESET_LIMIT else float(weight)
        upsert(conn, self.t.limits, [values], ["limit_cap", "limit_weight"])
        drop_empty_limits(conn, self.t, self.ns, queue)
        u.forget_limits(g)
        entered = u.refresh(g) if u.groups.get(g) is not None else False
        if cap != KEEP_LIMIT and "/" in g:  # a subgroup's cap: what it has room for now
            subcaps.unpark_path(u, g)
        u.flush()
        return u.cap(g), u.weight(g), entered


def drop_empty_limits(conn: Connection, t: Tables, ns: str, queue: str,
                      *where: Any) -> None:
    """Delete the limits rows of ``queue`` (and ``where``) left with nothing: no
    setting, runtime limit or boost (a boost's end goes with its weight)."""
    lt = t.limits.c
    empty = [c.is_(None) for c in lt if not c.primary_key and c.name != "boost_until_ms"]
    conn.execute(delete(t.limits).where(lt.ns == ns, lt.queue == queue, *where, *empty))


def _encode(removed: list[tuple[str, bytes]]) -> bytes:
    return json.dumps([[h, base64.b64encode(v).decode()] for h, v in removed]).encode()


def _answer(data: bytes) -> list[tuple[str, bytes]]:
    doc: list[Any] = json.loads(data)
    return [(h, base64.b64decode(v)) for h, v in doc]


