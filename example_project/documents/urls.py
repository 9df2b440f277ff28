from django.urls import path

from . import views

urlpatterns = [
    path("", views.index, name="index"),
    path("customers/<slug:customer>/", views.customer_page, name="customer"),
    path("customers/<slug:customer>/upload/", views.upload, name="upload"),
    path("customers/<slug:customer>/documents/<int:document_id>/preview/", views.preview,
         name="preview"),
    # JSON endpoints (load.py)
    path("api/customers/<slug:customer>/documents/", views.api_documents,
         name="api-documents"),
    path("api/customers/<slug:customer>/documents/<int:document_id>/preview/",
         views.api_preview, name="api-preview"),
]
