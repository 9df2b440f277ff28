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
            for name in (GROUP_HEADER, CLASS_HEADER, DISPATCH_HEADER, QUEUE_HEADER)
            if getattr(request, name, None) is not None}
