"""``fair check`` of ``fair_scope`` 'app' on the SQL store (``store/scope_check.py``): the
``scope_n`` rows against the app-scoped queues' ``groups.inflight``, and ``scope_charge``
rows of groups no app-scoped queue has a row of.

Every step that moves an app-scoped queue's in-flight count moves the group's count row
under that row's lock (``scoping.py``), so with the count rows of a batch locked (made
at 0 where missing, deleted again at the end: a row lives while not 0), the queues'
counts read next are the ones committed last and stay so until this transaction ends.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, delete, select, update

from ...policy.decisions import CLASSES
from ..scope_check import Finding, charge_finding, count_finding
from .rows import chunks, insert_ignore
from .scoping import app_groups

BATCH = 500


def check_scope(c: Connection, t: Any, ns: str, repair: bool) -> list[Finding]:
    """The findings of every group with a count row, a charge row, or dispatches in
    flight in an app-scoped queue (with ``repair``, each set right)."""
    n, ch, g = t.scope_n.c, t.scope_charge.c, t.groups.c
    names = set(c.execute(select(n.grp).where(n.ns == ns)).scalars())
    names |= set(c.execute(select(ch.grp).where(ch.ns == ns)).scalars())
    names |= set(c.execute(app_groups(t, g.grp).where(g.ns == ns, g.inflight > 0)).scalars())
    out: list[Finding] = []
    for chunk in chunks(sorted(names), BATCH):
        out += _check_batch(c, t, ns, chunk, repair)
    return out


def _check_batch(c: Connection, t: Any, ns: str, chunk: list[str],
                 repair: bool) -> list[Finding]:
    n, ch, g = t.scope_n.c, t.scope_charge.c, t.groups.c
    insert_ignore(c, t.scope_n, [{"ns": ns, "grp": x, "n": 0} for x in chunk])
    counts = {str(x): int(v) for x, v in c.execute(select(n.grp, n.n).where(
        n.ns == ns, n.grp.in_(chunk)).order_by(n.grp).with_for_update())}
    flights: dict[str, dict[str, int]] = {}
    for queue, grp, inflight in c.execute(app_groups(t, g.queue, g.grp, g.inflight).where(
            g.ns == ns, g.grp.in_(chunk))):
        flights.setdefault(str(grp), {})[str(queue)] = int(inflight or 0)
    out: list[Finding] = []
    for x in chunk:
        per = flights.get(x, {})
        if counts.get(x, 0) != sum(per.values()):
            out.append(count_finding(x, counts.get(x, 0), per, repair))
            if repair:
                c.execute(update(t.scope_n).where(n.ns == ns, n.grp == x).values(
                    n=sum(per.values())))
    c.execute(delete(t.scope_n).where(n.ns == ns, n.grp.in_(chunk), n.n == 0))
    charged = set(c.execute(select(ch.grp).where(ch.ns == ns, ch.klass.in_(CLASSES),
                                                  ch.grp.in_(chunk))).scalars())
    for x in sorted(charged - set(flights)):
        out.append(charge_finding(x, repair))
        if repair:
            c.execute(delete(t.scope_charge).where(ch.ns == ns, ch.klass.in_(CLASSES),
                                                   ch.grp == x))
    return out
