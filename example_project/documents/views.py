import json
import time

from django.db import transaction
from django.db.models import Count, Q
from django.http import HttpResponseBadRequest, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from celery_fair import position
from celery_fair.summary import format_wait

from .models import Document
from .tasks import convert_document, render_preview

#: Waiting documents whose place the customer page looks up (each is a few store reads).
PLACES_SHOWN = 20


def conversion_id(document_id):
    """The conversion's task id: known from the document, so its page can ask where it
    stands (``celery_fair.position``)."""
    return f"convert-{document_id}"


def upload_documents(customer, files):
    """Store the uploads and queue one conversion each (held fairly, per customer)."""
    now = time.time()
    with transaction.atomic():
        docs = [Document.objects.create(customer=customer, name=name, content=content,
                                        uploaded_at=now) for name, content in files]
    for doc in docs:  # after the commit, so the worker finds the rows
        convert_document.apply_async((customer, doc.pk), task_id=conversion_id(doc.pk))
    return docs


def request_preview(customer, document_id):
    doc = get_object_or_404(Document, pk=document_id, customer=customer)
    Document.objects.filter(pk=doc.pk).update(preview_requested_at=time.time())
    render_preview.delay(doc.pk)  # group and class: from the request (the middleware)
    return doc


def index(request):
    done = Count("id", filter=Q(converted_at__isnull=False))
    customers = (Document.objects.values("customer")
                 .annotate(total=Count("id"), done=done).order_by("customer"))
    return render(request, "documents/index.html", {"customers": customers})


def customer_page(request, customer):
    docs = list(Document.objects.filter(customer=customer).order_by("-id")[:100])
    waiting = [d for d in docs if d.conversion_started_at is None][-PLACES_SHOWN:]
    for doc in waiting:  # the oldest waiting ones: "#3, about 1.2 s"
        doc.place = place_text(position(convert_document.app, conversion_id(doc.pk)))
    return render(request, "documents/customer.html",
                  {"customer": customer, "documents": docs})


def place_text(where):
    """A held task's place for people: ``#N`` in its customer's queue, and the wait
    estimate when there is one."""
    if where.state != "held" or where.in_group is None:
        return ""
    about = "" if where.eta_seconds is None else f", about {format_wait(where.eta_seconds)}"
    return f"#{where.in_group}{about}"


@require_POST
def upload(request, customer):
    files = [(f.name, f.read().decode("utf-8", "replace"))
             for f in request.FILES.getlist("files")]
    if not files:
        return HttpResponseBadRequest("choose at least one file")
    upload_documents(customer, files)
    return redirect("customer", customer=customer)


@require_POST
def preview(request, customer, document_id):
    request_preview(customer, document_id)
    return redirect("customer", customer=customer)


# An API for scripts (load.py): no session or login (only the admin has those), so no CSRF.
@csrf_exempt
def api_documents(request, customer):
    if request.method == "POST":
        try:
            files = [(d["name"], d["content"]) for d in json.loads(request.body)["documents"]]
        except (ValueError, KeyError, TypeError):
            return HttpResponseBadRequest(
                'expected JSON {"documents": [{"name": ..., "content": ...}, ...]}')
        docs = upload_documents(customer, files)
        return JsonResponse({"ids": [d.pk for d in docs]}, status=201)
    docs = Document.objects.filter(customer=customer)
    return JsonResponse({"documents": [d.as_dict() for d in docs]})


@csrf_exempt
@require_POST
def api_preview(request, customer, document_id):
    doc = request_preview(customer, document_id)
    return JsonResponse({"id": doc.pk}, status=202)
