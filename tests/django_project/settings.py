"""A Django project for tests/test_contrib_django.py, configured from the environment:
``WL_TEST_DSN`` (the database), ``WL_TEST_POOL`` ("1": Django's connection pool),
``WL_TEST_USE_TZ`` ("0": USE_TZ off), ``WL_TEST_WORKLEASE`` (a JSON ``WORKLEASE`` setting)."""

from __future__ import annotations

import json
import os

from psycopg.conninfo import conninfo_to_dict

_dsn = conninfo_to_dict(os.environ["WL_TEST_DSN"])

SECRET_KEY = "worklease-tests-only"
USE_TZ = os.environ.get("WL_TEST_USE_TZ", "1") == "1"
INSTALLED_APPS = ["django.contrib.contenttypes", "worklease.contrib.django"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _dsn.get("dbname", ""),
        "USER": _dsn.get("user", ""),
        "PASSWORD": _dsn.get("password", ""),
        "HOST": _dsn.get("host", ""),
        "PORT": _dsn.get("port", ""),
        "OPTIONS": {"pool": {"min_size": 1, "max_size": 6}}
        if os.environ.get("WL_TEST_POOL") == "1"
        else {},
    }
}
WORKLEASE = json.loads(os.environ.get("WL_TEST_WORKLEASE", "{}"))
LOGGING = {
    "version": 1,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"worklease": {"handlers": ["stderr"], "level": "WARNING"}},
}
