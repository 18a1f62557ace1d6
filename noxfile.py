"""Developer sessions: nox -s generate | generate-check | lint | tests | docs (| faults | redis |
bench | bench-scale)."""

from __future__ import annotations

import nox

PYPROJECT = nox.project.load_toml("pyproject.toml")


def group(name: str) -> list[str]:
    """The requirements of one dependency group of pyproject.toml."""
    return list(nox.project.dependency_groups(PYPROJECT, name))


nox.options.sessions = ["generate-check", "lint", "tests", "docs"]
nox.options.error_on_missing_interpreters = False  # 3.12/3.13 are optional on a dev box

# The one interpreter that defines generated output (f-string tokenization changed in 3.12).
GEN_PYTHON = "3.11"
GEN_DEPS = ("unasync==0.6.0", "ruff==0.17.6")
PYTHONS = ["3.11", "3.12", "3.13"]


@nox.session(python=GEN_PYTHON)
def generate(session: nox.Session) -> None:
    """Regenerate src/worklease/_sync and tests/_sync from the async sources."""
    session.install(*GEN_DEPS)
    session.run("python", "scripts/unasync.py", *session.posargs)


@nox.session(name="generate-check", python=GEN_PYTHON)
def generate_check(session: nox.Session) -> None:
    """Fail if the generated sync flavour drifted from its async source."""
    session.install(*GEN_DEPS)
    session.run("python", "scripts/unasync.py", "--check")


@nox.session(python=GEN_PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (lint + format) and mypy --strict over both flavours, tests, examples, scripts,
    benchmarks."""
    session.install("-e", ".", *group("dev"))
    paths = ("src", "tests", "scripts", "examples", "benchmarks", "noxfile.py", "hatch_build.py")
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)
    session.run("mypy")


@nox.session(python=GEN_PYTHON)
def docs(session: nox.Session) -> None:
    """The documentation site (Sphinx + furo + MyST) -> docs/_build/html, warnings as
    errors. The API pages import every public name, the etcd backend's too: its extra is
    installed with the docs group."""
    session.install("-e", ".[etcd,redis,web]", *group("docs"))
    session.run(
        "sphinx-build",
        "-W",
        "--keep-going",
        "-b",
        "html",
        "docs",
        "docs/_build/html",
        *session.posargs,
    )


@nox.session(python=GEN_PYTHON)
def faults(session: nox.Session) -> None:
    """The fault-injection and model-based tests in their long variants."""
    session.install("-e", ".", *group("test"))
    session.env["WORKLEASE_FAULTS_LONG"] = "1"
    session.run(
        "python",
        "-m",
        "pytest",
        "tests/faults",
        "-m",
        "faults",
        "--timeout=3600",
        *session.posargs,
    )


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The whole test suite (both flavours, every backend that is reachable)."""
    session.install("-e", ".", *group("test"))
    session.run("python", "-m", "pytest", "-n", "3", *(session.posargs or ()))


@nox.session(python=GEN_PYTHON)
def redis(session: nox.Session) -> None:
    """The Redis backend everywhere: every backend-parametrized test on standalone Redis and
    on a 3-master Redis Cluster, both flavours (CI runs the matrix on standalone and the
    conformance suite and the Cluster cases on the Cluster), then the Redis fault tests in
    their long variants (20 Sentinel failovers). Needs Debian's redis-server."""
    session.install("-e", ".[redis]", *group("test"))
    session.env["WORKLEASE_TEST_REDIS_CLUSTER"] = "matrix"
    session.run(
        "python", "-m", "pytest", "-n", "3", "-m", "redis and not faults", "tests/_async",
        "tests/_sync", "tests/test_redis_scripts.py", "tests/test_cli.py", *session.posargs,
    )  # fmt: skip
    session.env["WORKLEASE_FAULTS_LONG"] = "1"
    session.run(
        "python", "-m", "pytest", "-m", "redis and faults", "tests/faults", "--timeout=3600",
        *session.posargs,
    )  # fmt: skip


@nox.session(python=GEN_PYTHON)
def bench(session: nox.Session) -> None:
    """Lease operations vs the hand-written PostgreSQL floor, the acquire statement's old
    design beside the new, then handoff latency,
    transactional steps, checkpoint throughput under concurrency (group commit), HOT updates,
    a sweep of 200,000 rows beside an acquire and a live holder, etcd, Redis (private servers:
    standalone and Cluster), and the memory backend from 1,000 to 100,000 held leases ->
    benchmarks/results/ (not a default session). Arguments go to bench_ops.py:
    nox -s bench -- --iterations 500 --dsn DSN."""
    session.install("-e", ".[redis]", *group("bench"), *group("test"))
    session.run("python", "benchmarks/bench_ops.py", *session.posargs)
    dsn = [arg for arg in session.posargs if arg.startswith("--dsn")]
    if "--dsn" in dsn:
        dsn.append(session.posargs[session.posargs.index("--dsn") + 1])
    session.run("python", "benchmarks/bench_acquire_statement.py", *dsn)
    session.run("python", "benchmarks/bench_handoff.py", *dsn)
    session.run("python", "benchmarks/bench_transaction.py", *dsn)
    session.run("python", "benchmarks/bench_concurrency.py", *dsn)
    session.run("python", "benchmarks/bench_hot.py", *dsn)
    session.run(
        "python", "benchmarks/bench_sweep.py", *dsn, "--rows", "200000", "--runs", "3",
        "--state-bytes", "256",
    )  # fmt: skip
    session.run("python", "benchmarks/bench_etcd.py", *dsn)
    session.run("python", "benchmarks/bench_redis.py")
    session.run("python", "benchmarks/bench_redis_capacity.py")
    session.run("python", "benchmarks/bench_memory_scale.py")


@nox.session(name="bench-scale", python=GEN_PYTHON)
def bench_scale(session: nox.Session) -> None:
    """Fair-share pools at scale (4 processes x 10,000 work IDs: even shares at start, after a
    kill -9 and a join, moves by handover, statements/s, SIGTERM), fair share vs the scan
    design -> benchmarks/results/fairshare.* (not a default session). Arguments go to the
    script: nox -s bench-scale -- --work-ids 2000 --skip-scan. The earlier scan-vs-per-slot
    comparison stays runnable as python benchmarks/bench_scale.py."""
    session.install("-e", ".", *group("bench"), *group("test"))
    session.run("python", "benchmarks/bench_fairshare.py", *session.posargs)


@nox.session(name="bench-pool-scale", python=GEN_PYTHON)
def bench_pool_scale(session: nox.Session) -> None:
    """Pools on the grid N = 1,000 / 10,000 / 100,000 work IDs x P = 2 / 4 / 8 processes
    (coverage, idle server CPU and transactions/s, slot backoffs, RSS, SIGTERM release,
    kill -9 failover), commit 0fc614a ("before") vs the working tree ("after") ->
    benchmarks/results/pool_scale.* (not a default session; the full grid takes 30-60
    minutes). Arguments go to the script: nox -s bench-pool-scale -- --grid 1000x2,1000x4."""
    session.install("-e", ".", *group("bench"), *group("test"))
    session.run("python", "benchmarks/bench_pool_scale.py", *session.posargs)
