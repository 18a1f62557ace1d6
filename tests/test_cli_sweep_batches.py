"""``worklease sweep`` deletes in batches as the backend does (issue 24): more sweepable rows
than one batch holds are all deleted, and the count printed is their total."""

from __future__ import annotations

import pytest

from tests import pg
from tests.test_cli import run
from worklease._pg import Statements

pytestmark = pytest.mark.postgres


def test_cli_sweep_deletes_more_rows_than_one_batch(postgres_dsn: str) -> None:
    pg.reset(postgres_dsn)
    sweepable = 2 * Statements.sweep_batch + 500  # three batches
    pg.execute(
        postgres_dsn,
        "INSERT INTO worklease_leases (work_id, holder_id, expires_at, exit_mode, updated_at)"
        " SELECT 'w-' || lpad(g::text, 6, '0'), 'holder', now() - interval '1 hour',"
        "        CASE WHEN g %% 10 = 0 THEN 'finished' ELSE 'retired' END,"
        "        now() - interval '1 hour'"
        " FROM generate_series(1, %s) AS g",
        (sweepable * 10 // 9,),
    )
    kept = pg.execute(postgres_dsn, "SELECT count(*) FROM worklease_leases")[0][0] - sweepable
    done = run("sweep", "--dsn", postgres_dsn, "--retention", "1m")
    assert (done.returncode, done.stdout) == (
        0,
        f"deleted {sweepable} retired row(s) not updated for 1m\n",
    ), done.stderr
    left = pg.execute(postgres_dsn, "SELECT exit_mode, count(*) FROM worklease_leases GROUP BY 1")
    assert left == [("finished", kept)]
