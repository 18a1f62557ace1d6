"""Quick start: run the same work ID twice on the in-memory backend.

The second run reads what the first one left behind. No database needed:

    python examples/quickstart.py
"""

from __future__ import annotations

import worklease


def work(token: worklease.Token, prior: worklease.Checkpoint) -> bytes:
    saved = (prior.state or b"").decode()
    print(f'previous exit: {prior.prev_exit}, saved state: "{saved}"')
    return b"step 1 done"  # the checkpoint the next holder reads


def main() -> None:
    lease = worklease.Lease(
        worklease.MemoryBackend(),  # in production: worklease.PostgresBackend(pool)
        holder_id="worker-1",  # names this process; must not be empty
        ttl=30,
    )
    runner = worklease.Runner(lease, work)
    for _ in range(2):
        runner.run("billing-run-2026-10")


if __name__ == "__main__":
    main()
