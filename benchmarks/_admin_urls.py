"""The URLs of :mod:`benchmarks.admin_definitions`: the admin alone."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
