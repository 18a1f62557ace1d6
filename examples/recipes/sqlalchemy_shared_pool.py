"""SQLAlchemy 2: one psycopg pool for the engine and for worklease.

psycopg_pool's ``close_returns=True`` makes ``conn.close()`` give a connection back to the pool
instead of closing it, which is what SQLAlchemy does with a connection it got from its
``creator`` under ``NullPool``. So the engine and the worklease backend draw from the same
``ConnectionPool``: one pool size to tune, one set of connection settings.

    python examples/recipes/sqlalchemy_shared_pool.py --dsn "host=... dbname=... user=..."

(the DSN also comes from ``WORKLEASE_DSN``). The schema must exist (``worklease migrate``).
The job copies a table's rows in batches: it reads them through the engine, then writes each
batch and its checkpoint (the last copied id) in one transactional step, SQLAlchemy Core
statements compiled for psycopg and run on the step's connection: the rows and the checkpoint
commit together or not at all, so a successor resumes exactly after the last committed batch
and no row is copied twice.
"""

from __future__ import annotations

import argparse
import os
import uuid

from psycopg_pool import ConnectionPool
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert, select
from sqlalchemy.pool import NullPool

import worklease

BATCH = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("WORKLEASE_DSN", ""))
    args = parser.parse_args()
    run = uuid.uuid4().hex[:8]

    pool = ConnectionPool(args.dsn, min_size=1, max_size=4, close_returns=True, open=True)
    engine = create_engine("postgresql+psycopg://", creator=pool.getconn, poolclass=NullPool)
    backend = worklease.PostgresBackend(pool)
    lease = worklease.Lease(backend, holder_id="copier", ttl=30)

    metadata = MetaData()
    source = Table(
        f"recipe_source_{run}",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("name", String),
    )
    target = Table(
        f"recipe_target_{run}",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("name", String),
    )
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(source), [{"id": i, "name": f"row {i}"} for i in range(1, 11)])

    def copy(stop_after: int | None) -> None:
        with lease.hold(f"copy-{run}") as held:
            last = int(held.prior.state or b"0")
            print(f"resuming after id {last} (previous exit: {held.prior.prev_exit})")
            batches = 0
            while stop_after is None or batches < stop_after:
                with engine.connect() as conn:
                    rows = conn.execute(
                        select(source).where(source.c.id > last).order_by(source.c.id).limit(BATCH)
                    ).all()
                if not rows:
                    break
                write = insert(target).compile(dialect=engine.dialect)
                with held.transaction() as tx:  # the batch and its checkpoint, one commit
                    tx.connection.cursor().executemany(
                        str(write), [dict(row._mapping) for row in rows]
                    )
                    tx.checkpoint(str(rows[-1].id).encode())
                last = rows[-1].id
                batches += 1
                print(f"copied up to id {last}")

    copy(stop_after=1)  # one batch, then this holder finishes early
    copy(stop_after=None)  # the next run resumes where the checkpoint says
    with engine.connect() as conn:
        copied = conn.execute(select(target.c.id).order_by(target.c.id)).scalars().all()
    print(f"target holds ids {copied[0]}..{copied[-1]}, {len(copied)} rows, none twice")
    print(f"one pool served both: {pool.get_stats()['pool_max']} connections at most")
    metadata.drop_all(engine)
    backend.close()
    pool.close()


if __name__ == "__main__":
    main()
