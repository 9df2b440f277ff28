import time

from celery_fair import fair_task


@fair_task(group="tenant_id")
def convert(tenant_id, doc_id):
    time.sleep(0.1)          # stands for the real work
    return doc_id
