"""Quick start (asyncio): run the same work ID twice on the in-memory backend.

The second run reads what the first one left behind. No database needed:

    python examples/quickstart_async.py
"""

from __future__ import annotations

import asyncio

import worklease


async def work(token: worklease.Token, prior: worklease.Checkpoint) -> bytes:
    saved = (prior.state or b"").decode()
    print(f'previous exit: {prior.prev_exit}, saved state: "{saved}"')
    return b"step 1 done"  # the checkpoint the next holder reads


async def main() -> None:
    lease = worklease.AsyncLease(
        worklease.AsyncMemoryBackend(),  # in production: worklease.AsyncPostgresBackend(pool)
        holder_id="worker-1",  # names this process; must not be empty
        ttl=30,
    )
    runner = worklease.AsyncRunner(lease, work)
    for _ in range(2):
        await runner.run("billing-run-2026-10")


if __name__ == "__main__":
    asyncio.run(main())
