from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),  # with celery-fair's Fair queues page
    path("", include("documents.urls")),
]
