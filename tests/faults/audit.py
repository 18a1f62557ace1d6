"""A test-only audit trail: a trigger records every accepted change of a lease row.

``install(dsn)`` adds the ``worklease_audit`` table and the trigger to a test database (never
to a production schema). Each row records the operation, the work ID, the old and new fencing
token and holder, the exit mode, an md5 of the checkpoint, the server time of the change and
the ID of the transaction that made it.
``stale_writes(dsn)`` counts, from the server's point of view, accepted changes whose token is
lower than a token already seen for that work ID: the number the library promises is zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tests import pg

__all__ = ["AuditRow", "install", "rows", "stale_writes"]

_DDL = """
CREATE TABLE IF NOT EXISTS worklease_audit (
    id              BIGSERIAL PRIMARY KEY,
    at              TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    op              TEXT        NOT NULL,
    work_id         TEXT        NOT NULL,
    old_token       BIGINT,
    new_token       BIGINT,
    old_holder      TEXT,
    new_holder      TEXT,
    exit_mode       TEXT,
    checkpoint_md5  TEXT,
    expires_at      TIMESTAMPTZ,
    xid             TEXT        NOT NULL DEFAULT pg_current_xact_id()::text
);

CREATE OR REPLACE FUNCTION worklease_audit_change() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO worklease_audit (op, work_id, new_token, new_holder, exit_mode,
                                     checkpoint_md5, expires_at)
        VALUES ('INSERT', NEW.work_id, NEW.fencing_token, NEW.holder_id, NEW.exit_mode,
                md5(NEW.checkpoint), NEW.expires_at);
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO worklease_audit (op, work_id, old_token, new_token, old_holder, new_holder,
                                     exit_mode, checkpoint_md5, expires_at)
        VALUES ('UPDATE', NEW.work_id, OLD.fencing_token, NEW.fencing_token, OLD.holder_id,
                NEW.holder_id, NEW.exit_mode, md5(NEW.checkpoint), NEW.expires_at);
        RETURN NEW;
    ELSE
        INSERT INTO worklease_audit (op, work_id, old_token, old_holder)
        VALUES ('DELETE', OLD.work_id, OLD.fencing_token, OLD.holder_id);
        RETURN OLD;
    END IF;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS worklease_audit_trigger ON worklease_leases;
CREATE TRIGGER worklease_audit_trigger
    AFTER INSERT OR UPDATE OR DELETE ON worklease_leases
    FOR EACH ROW EXECUTE FUNCTION worklease_audit_change();
"""


@dataclass(frozen=True)
class AuditRow:
    id: int
    at: datetime
    op: str
    work_id: str
    old_token: int | None
    new_token: int | None
    old_holder: str | None
    new_holder: str | None
    exit_mode: str | None
    checkpoint_md5: str | None
    expires_at: datetime | None


def install(dsn: str) -> None:
    """Create the audit table and trigger (idempotent)."""
    pg.execute(dsn, _DDL)


def rows(dsn: str, work_id: str | None = None) -> list[AuditRow]:
    """Every recorded change, in the order the server accepted them."""
    query = (
        "SELECT id, at, op, work_id, old_token, new_token, old_holder, new_holder, exit_mode,"
        " checkpoint_md5, expires_at FROM worklease_audit"
    )
    if work_id is None:
        found = pg.execute(dsn, query + " ORDER BY id")
    else:
        found = pg.execute(dsn, query + " WHERE work_id = %s ORDER BY id", (work_id,))
    return [AuditRow(*row) for row in found]


def stale_writes(dsn: str) -> int:
    """Accepted changes whose new token is below a token already granted for the work ID
    (deletions reset the history: a forgotten row starts over with a greater token anyway)."""
    (count,) = pg.execute(
        dsn,
        """
        SELECT count(*) FROM (
            SELECT new_token,
                   max(new_token) OVER (
                       PARTITION BY work_id ORDER BY id
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
                   ) AS seen
            FROM worklease_audit WHERE op <> 'DELETE'
        ) AS history
        WHERE new_token < seen
        """,
    )[0]
    return int(count)
