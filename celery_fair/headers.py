"""The message headers celery_fair reads and writes, and how to find them on a request.

A leaf module: the task side, the worker side, the dispatcher and the installer all name
these headers, and none of them needs another for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Headers celery_fair adds to a held message.
GROUP_HEADER, CLASS_HEADER, COST_HEADER = "fair_group", "fair_class", "fair_cost"
#: Headers the dispatcher adds to a dispatched message.
DISPATCH_HEADER, QUEUE_HEADER = "fair_dispatch_id", "fair_queue"
#: Header of a message the pick script pushed into kombu's list itself: when the
#: dispatch's lease runs out (ms since the epoch), for fair_quick_start.
LEASE_HEADER = "fair_lease_until"
#: What one dispatch put on its message: a message held again must drop them all.
DISPATCH_HEADERS = (DISPATCH_HEADER, QUEUE_HEADER, LEASE_HEADER)


def request_headers(request: Any) -> Mapping[str, Any]:
    """The celery_fair headers of a task request (a Context, a Request, or a dict)."""
    if isinstance(request, Mapping):
        return request
    headers = getattr(request, "headers", None)
    if isinstance(headers, Mapping) and DISPATCH_HEADER in headers:
        return headers
    source = getattr(request, "request_dict", None)
    if isinstance(source, Mapping):
        return source
    return {name: getattr(request, name, None)
            for name in (GROUP_HEADER, CLASS_HEADER, *DISPATCH_HEADERS)
            if getattr(request, name, None) is not None}
