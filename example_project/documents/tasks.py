"""The background conversion and the interactive preview, both fair across customers."""

import html
import time

from django.conf import settings

from celery_fair import fair_task
from celery_fair.task import request_headers

from .models import Document


@fair_task(group="customer", interactive=False)
def convert_document(customer, document_id):
    """Background: one customer's 200 uploads take turns with everyone else's."""
    started = time.time()
    Document.objects.filter(pk=document_id).update(conversion_started_at=started)
    doc = Document.objects.get(pk=document_id)
    time.sleep(settings.DOCSHOP_CONVERT_SECONDS)  # stands in for the real conversion
    paragraphs = "".join(f"<p>{html.escape(p)}</p>" for p in doc.content.split("\n\n"))
    Document.objects.filter(pk=document_id).update(converted=paragraphs,
                                                   converted_at=time.time())


@fair_task(bind=True)
def render_preview(self, document_id):
    """Published from a page view: the middleware puts it in the customer's group and
    makes it interactive, so it runs ahead of every background conversion."""
    doc = Document.objects.get(pk=document_id)
    time.sleep(settings.DOCSHOP_PREVIEW_SECONDS)
    headers = request_headers(self.request)
    kind = "interactive" if headers.get("fair_class") == "i" else "background"
    Document.objects.filter(pk=document_id).update(
        preview=html.escape(doc.content[:200]), preview_rendered_at=time.time(),
        preview_ran_as=f"{kind} in group {headers.get('fair_group')}")
