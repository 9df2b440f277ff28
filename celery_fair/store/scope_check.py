"""``fair check`` of ``fair_scope`` 'app' (DESIGN.md "Tenant scope"): the app's count of
each group's dispatches in flight must be the sum of its app-scoped queues' own counts
(a count too high keeps the group capped for ever; too low lets it past its cap), and no
wfq charge total may be left of a group no app-scoped queue knows (it would pile up).

Each store gathers the figures its own way, atomically per group (Redis: ``check_scope.lua``;
SQL: under the groups' count rows; memory: under its lock); this module says what they
mean, the same words everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: (kind, subject, detail, action), as ``Store.check`` returns them
Finding = tuple[str, str, str, str]

COUNT, CHARGE = "scope_count", "scope_charge"


def count_finding(g: str, counted: int, flights: Mapping[str, int], repaired: bool
                  ) -> Finding:
    """g's app count ``counted`` is not the sum of ``flights`` (queue -> its count)."""
    total = sum(flights.values())
    where = ", ".join(f"{q}: {n}" for q, n in sorted(flights.items()) if n) or "none"
    return (COUNT, g, f"the app counts {counted} in flight over its app-scoped queues, "
            f"they hold {total} ({where})", f"set to {total}" if repaired else "")


def charge_finding(g: str, repaired: bool) -> Finding:
    """A charge total is kept for g, which no app-scoped queue knows."""
    return (CHARGE, g, "a wfq charge total is kept for a group no app-scoped queue knows",
            "deleted" if repaired else "")


def scope_findings(counts: Mapping[str, int], flights: Mapping[str, Mapping[str, int]],
                   charged: Iterable[str], known: set[str]) -> list[Finding]:
    """Report-only findings from figures read at once: ``counts`` (group -> the app's
    count), ``flights`` (app-scoped queue -> group -> its count), ``charged`` (the groups
    with a charge total), ``known`` (the groups some app-scoped queue knows)."""
    out: list[Finding] = []
    names = set(counts) | {g for per in flights.values() for g, n in per.items() if n}
    for g in sorted(names):
        per = {q: flight.get(g, 0) for q, flight in flights.items()}
        if counts.get(g, 0) != sum(per.values()):
            out.append(count_finding(g, counts.get(g, 0), per, False))
    out += [charge_finding(g, False) for g in sorted(set(charged) - known)]
    return out
