"""The Django app of ``worklease.contrib.django``."""

from __future__ import annotations

from django.apps import AppConfig


class WorkleaseConfig(AppConfig):
    name = "worklease.contrib.django"
    label = "worklease"
    verbose_name = "worklease"
    default = True

    def ready(self) -> None:
        from django.core.signals import setting_changed

        from . import checks  # noqa: F401  (registers the system checks)
        from ._backend import reset

        def settings_changed(setting: str, **_: object) -> None:
            if setting in ("DATABASES", "WORKLEASE", "USE_TZ", "TIME_ZONE"):
                reset()

        setting_changed.connect(settings_changed, weak=False, dispatch_uid="worklease-reset")
