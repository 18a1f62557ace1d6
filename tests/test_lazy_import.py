"""``import worklease`` does not import psycopg until a PostgreSQL name is used (PEP 562)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WITHOUT_PSYCOPG = """
import sys
sys.modules["psycopg"] = None  # as if psycopg (or libpq) were missing: importing it fails
sys.modules["psycopg_pool"] = None
import worklease
from worklease.testing import FakeClock
clock = FakeClock()
lease = worklease.Lease(worklease.MemoryBackend(clock=clock), holder_id="h", ttl=30)
token = lease.acquire("w")
lease.checkpoint(token, b"state")
lease.release(token, worklease.ExitMode.FINISHED)
assert dir(worklease).count("PostgresBackend") == 1
try:
    worklease.PostgresBackend
except ImportError:
    print("ok")
"""


def test_import_worklease_leaves_psycopg_unimported() -> None:
    code = "import worklease, sys; worklease.MemoryBackend(); print('psycopg' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_the_memory_backend_works_without_psycopg() -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_PSYCOPG], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_postgres_names_load_on_first_use() -> None:
    code = (
        "import worklease, sys\n"
        "assert 'psycopg' not in sys.modules\n"
        "from worklease import PostgresBackend, AsyncPostgresBackend, schema_sql\n"
        "assert 'psycopg' in sys.modules\n"
        "assert PostgresBackend.__name__ == 'PostgresBackend'\n"
        "assert 'CREATE TABLE' in schema_sql()\n"
        "try:\n"
        "    worklease.NoSuchName\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "has no attribute 'NoSuchName'" in result.stdout


WITHOUT_ASYNCIO = """
import sys
import worklease
from worklease.testing import FakeClock
assert "asyncio" not in sys.modules, "import worklease loaded asyncio"
lease = worklease.Lease(worklease.MemoryBackend(clock=FakeClock()), holder_id="h", ttl=30)
runner = worklease.Runner(lease, lambda token, prior: b"done")
runner.run("w")
with lease.hold("w2") as held:
    held.checkpoint(b"state")
assert "asyncio" not in sys.modules, "the thread flavour loaded asyncio"
assert "AsyncLease" in dir(worklease)
assert worklease.AsyncLease.__name__ == "AsyncLease"
assert "asyncio" in sys.modules
print("ok")
"""


def test_the_thread_flavour_never_loads_asyncio() -> None:
    """``import worklease`` and the sync flavour on the memory backend leave asyncio
    unimported; the first asyncio name used loads it."""
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_ASYNCIO], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_framework_integrations_import_their_framework_only_when_used() -> None:
    """``import worklease.contrib`` and the Django app's package import no framework; each
    integration without its framework says which package to install."""
    code = (
        "import sys\n"
        "import worklease.contrib, worklease.contrib.django\n"
        "assert not {'django', 'celery', 'fastapi'} & set(sys.modules), sys.modules.keys()\n"
        "sys.modules['celery'] = None\n"
        "sys.modules['fastapi'] = None\n"
        "for name in ('celery', 'fastapi'):\n"
        "    try:\n"
        "        __import__(f'worklease.contrib.{name}')\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "worklease.contrib.celery needs Celery: pip install celery",
        "worklease.contrib.fastapi needs FastAPI: pip install fastapi",
    ]


def test_the_redis_backend_loads_redis_py_on_first_use() -> None:
    code = (
        "import sys\n"
        "import worklease\n"
        "assert 'redis' not in sys.modules\n"
        "sys.modules['redis'] = None\n"
        "try:\n"
        "    worklease.RedisBackend\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "the Redis backend needs redis-py: pip install redis (worklease's redis extra: "
        "pip install '.[redis]' from a checkout)"
    )
