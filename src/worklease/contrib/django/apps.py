"""The Django app of ``worklease.contrib.django``."""

from __future__ import annotations

from django.apps import AppConfig


class WorkleaseConfig(AppConfig):
    name = "worklease.contrib.django"
    label = "worklease"
    verbose_name = "worklease"
    default = True

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
