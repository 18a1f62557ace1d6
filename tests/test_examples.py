"""Run every example under examples/ as a script, in both flavours, and check its story.

Each scenario example runs on the in-memory backend (where its output is deterministic, so the
threaded and the asyncio version must print the same) and, marked ``postgres``, against this
run's PostgreSQL database with ``--dsn`` (tokens and work IDs vary there; the patterns allow it).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
FLAVOURS = ("sync", "async")

S = r"(?:-[0-9a-f]{8})?"  # the random suffix of work IDs with --dsn
N = r"\d+"  # a fencing token (contiguous from 1 in memory only)
ALL_SIX = ", ".join(f"partition-{n}{S}" for n in range(6))
FIRST_FOUR = ", ".join(f"partition-{n}{S}" for n in range(4))

# Lines (regular expressions, matched against whole lines) each example must print on any
# backend.
STORY: dict[str, tuple[str, ...]] = {
    "subscription_cancellation": (
        "worker-a: released as finished",
        r"worker-a: crashes without releasing; the lease lapses after its TTL",
        r"worker-b: previous exit: expired \(holder worker-a\)",
        r"worker-b: skips cancel billing \(done before\)",
        rf"worker-b: schedule deprovisioning \(fencing token {N}\)",
        r"worker-b: previous exit: expired \(holder worker-z\)",
        rf"worker-z: fenced: FencedError \(its token {N} was superseded by token {N}\); it stops",
    ),
    "cross_tenant_migration": (
        r"worker-a: released as finished; cursor: 8 of 8 tenants, up to tenant-08",
        r"worker-b: previous exit: expired \(holder worker-a\); cursor: 3 of 8 tenants, "
        r"up to tenant-03",
        rf"worker-b: migrated tenant-04 \(fencing token {N}\)",
        r"worker-b: previous exit: expired \(holder worker-z\); cursor: 2 of 8 tenants, "
        r"up to tenant-02",
        rf"worker-z: fenced: FencedError \(zombie token {N}, current token {N}\); "
        r"it stops mid-batch",
    ),
    "cluster_singleton_scheduler": (
        r"node-2: not elected: LeaseHeldError \(leader node-1\); skips the round",
        "node-1: relinquished leadership",
        "node-2: previous leader node-1 left expired",
        "node-2: relinquished leadership",
        "node-1: fenced: FencedError; nothing fired, nothing released",
    ),
    "partition_processor": (
        f"pool-A: active slots: {ALL_SIX}",
        rf"pool-A: partition-4{S} failed permanently \(record 100 is unreadable\): "
        r"released abandoned",
        rf"pool-A: partition-5{S} is drained: retired",
        f"pool-A: active slots: {FIRST_FOUR}",
        r"pool-A: stopped; run\(\) returned normally \(not every slot died\)",
        rf"pool-B: partition-4{S}: previous exit abandoned \(holder pool-A\); "
        r"resumes at offset 100",
        rf"pool-B: partition-4{S}: consumed records 100-199",
    ),
    "observability": (
        r"worker-b: token \d+: previous exit expired",
        r"worker-c: LeaseHeldError \(held by worker-b\)",
        "worker-a: checkpoint rejected: FencedError",
        r"checkpoint +4 +1  \d+\.\d{3} ms",
        r"release +2 +0  \d+\.\d{3} ms",
        r"sweep +1 +0  \d+\.\d{3} ms",
        r"  token \d+ \(worker-a\): never released",
        "fencing events: 1",
        r"  checkpoint by worker-a \(token \d+\)",
    ),
    "renewal_backoff": (
        r"worker-b: gave up: TimeoutError \(a LeaseHeldError: False\)",
        rf"worker-b: caused by LeaseHeldError: monthly-report{S} is held by worker-a",
        "worker-c: lost the lease: LeaseLapsedError",
        "worker-c:   a LeaseWindowExhaustedError: True",
        "worker-c:   a LeaseExpiredError: True",
        r"worker-c: cannot release: LeaseLapsedError \(nothing is recorded\)",
        rf"worker-d: acquired nightly-export{S} \(token {N}\); previous exit: expired "
        r"\(holder worker-c\)",
    ),
}

# Examples that need PostgreSQL (run only with --dsn): their lines, on any run.
POSTGRES_ONLY: dict[str, tuple[str, ...]] = {
    "exactly_once_invoices": (
        "worker-1: previous exit: none; resumes at customer-01",
        rf"worker-1: killed with SIGKILL after (?P<n>{N}) invoices",
        r"worker-2: previous exit: expired \(holder worker-1\); resumes at customer-\d\d",
        "worker-2: invoiced up to customer-30; releasing",
        "invoice table: 30 invoices for 30 customers, each invoiced exactly once",
    ),
}

# Exact lines on the in-memory backend, where fencing tokens count from 1.
MEMORY: dict[str, tuple[str, ...]] = {
    "subscription_cancellation": (
        "worker-z: fenced: FencedError (its token 4 was superseded by token 5); it stops",
    ),
    "cross_tenant_migration": (
        "worker-z: fenced: FencedError (zombie token 4, current token 5); it stops mid-batch",
    ),
    "cluster_singleton_scheduler": ("node-2: elected leader (token 5)",),
    "partition_processor": (),
    "observability": (
        "  token 1 (worker-a): 20.00 s",
        "  token 3 (worker-b): 3.00 s",
        "  token 2 (worker-a): never released",
        "rows swept: 1",
    ),
    "renewal_backoff": (
        "worker-d: acquired nightly-export (token 3); previous exit: expired (holder worker-c)",
    ),
}

CASES = [
    pytest.param(name, flavour, id=f"{name}-{flavour}")
    for name in sorted(STORY)
    for flavour in FLAVOURS
]


# psycopg_pool logs this when the backend closes a connection whose statement was cancelled
# (on purpose: its state is unknown), e.g. when a lost lease cancels the body mid-query.
DISCARDED = re.compile(r"discarding closed connection: <psycopg\.\w+ \[BAD\] at 0x[0-9a-f]+>")


def run_example(path: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(path), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Nothing else logged: no observer, renewal or pool trouble.
    logged = [line for line in proc.stderr.splitlines() if not DISCARDED.fullmatch(line)]
    assert not logged, proc.stderr
    return proc.stdout


def check_story(name: str, output: str) -> None:
    lines = output.splitlines()
    missing = [
        pattern for pattern in STORY[name] if not any(re.fullmatch(pattern, x) for x in lines)
    ]
    assert not missing, f"missing from the output:\n{missing}\n--- output:\n{output}"


def without_latencies(output: str) -> str:
    return re.sub(r"\d+\.\d{3} ms", "? ms", output)


def test_every_example_is_covered() -> None:
    async_sources = {p.stem for p in (EXAMPLES / "async").glob("*.py")}
    sync_sources = {p.stem for p in (EXAMPLES / "sync").glob("*.py")}
    assert set(STORY) == set(MEMORY)
    assert async_sources == sync_sources == set(STORY) | set(POSTGRES_ONLY)
    documented = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    for name in [*STORY, *POSTGRES_ONLY]:
        assert (EXAMPLES / f"{name}.md").is_file()
        assert f"examples/sync/{name}.py" in documented
        assert f"examples/async/{name}.py" in documented


@pytest.mark.parametrize(("name", "flavour"), CASES)
def test_example_in_memory(name: str, flavour: str) -> None:
    output = run_example(EXAMPLES / flavour / f"{name}.py")

    check_story(name, output)
    lines = output.splitlines()
    for line in MEMORY[name]:
        assert line in lines, f"missing {line!r} from:\n{output}"


@pytest.mark.parametrize("name", sorted(STORY))
def test_flavours_print_the_same_in_memory(name: str) -> None:
    outputs = [run_example(EXAMPLES / flavour / f"{name}.py") for flavour in FLAVOURS]
    assert without_latencies(outputs[0]) == without_latencies(outputs[1])


@pytest.mark.postgres
@pytest.mark.parametrize(("name", "flavour"), CASES)
def test_example_on_postgres(name: str, flavour: str, postgres_dsn: str) -> None:
    output = run_example(EXAMPLES / flavour / f"{name}.py", "--dsn", postgres_dsn)

    check_story(name, output)


@pytest.mark.etcd
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_partition_processor_on_etcd(flavour: str, etcd_cluster: Any) -> None:
    endpoints = ",".join(etcd_cluster.endpoints)
    output = run_example(EXAMPLES / flavour / "partition_processor.py", "--etcd", endpoints)

    check_story("partition_processor", output)


@pytest.mark.postgres
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_exactly_once_invoices_survive_a_kill(flavour: str, postgres_dsn: str) -> None:
    output = run_example(EXAMPLES / flavour / "exactly_once_invoices.py", "--dsn", postgres_dsn)
    lines = output.splitlines()
    missing = [
        pattern
        for pattern in POSTGRES_ONLY["exactly_once_invoices"]
        if not any(re.fullmatch(pattern, line) for line in lines)
    ]
    assert not missing, output
    # The successor resumes right after the last invoice the killed worker committed.
    killed = next(m for x in lines if (m := re.fullmatch(r".* after (\d+) invoices", x)))
    assert f"resumes at customer-{int(killed.group(1)) + 1:02}" in output


@pytest.mark.parametrize("script", ["quickstart.py", "quickstart_async.py"])
def test_quickstart(script: str) -> None:
    output = run_example(EXAMPLES / script)

    assert output == (
        'previous exit: none, saved state: ""\n'
        'previous exit: finished, saved state: "step 1 done"\n'
    )
