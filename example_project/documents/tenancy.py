"""Which customer a request is for: the group of the tasks it publishes.

Named by the CELERY_FAIR_GROUP_RESOLVER setting; FairGroupMiddleware calls it once per
request, before the view runs (so it resolves the URL itself).
"""

from django.urls import Resolver404, resolve


def customer_of(request):
    try:
        return resolve(request.path_info).kwargs.get("customer")
    except Resolver404:
        return None
