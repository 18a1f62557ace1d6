-- worklease schema (canonical), version 4. Idempotent: safe to run again.
-- Apply it with `worklease migrate --dsn ...`, `PostgresBackend.apply_schema(pool)`,
-- or `psql -f`. Print it for another schema with `worklease schema --schema NAME`.
-- Each "-- step N:" line starts what took a table from version N-1 to N; `worklease migrate`
-- runs the steps a table lacks and `worklease migrate --sql` prints them (ADR-0019).

-- step 1: the lease table and the sequence of fencing tokens (the first release).
CREATE SEQUENCE IF NOT EXISTS worklease_fencing_seq;

CREATE TABLE IF NOT EXISTS worklease_leases (
    work_id         TEXT        PRIMARY KEY,
    holder_id       TEXT        NOT NULL,
    fencing_token   BIGINT      NOT NULL DEFAULT nextval('worklease_fencing_seq'),
    expires_at      TIMESTAMPTZ NOT NULL,
    checkpoint      BYTEA,
    exit_mode       TEXT,
    prev_exit_mode  TEXT        NOT NULL DEFAULT 'none',
    prev_holder_id  TEXT,
    acquired_at     TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    CONSTRAINT worklease_leases_exit_mode_check
        CHECK (exit_mode IS NULL OR exit_mode IN ('finished', 'abandoned', 'retired')),
    CONSTRAINT worklease_leases_prev_exit_mode_check
        CHECK (prev_exit_mode IN ('none', 'expired', 'finished', 'abandoned', 'retired'))
);

-- step 2: the worklease_fence() function for statements outside lease.transaction().
-- worklease_fence(work_id, token): a guard for your own statements outside
-- lease.transaction(). True while the token is the current, unlapsed grant of the work ID;
-- it then locks the lease row until your transaction ends, so no successor is granted
-- before your COMMIT (and your lease's renewal waits for it too: call it last).
CREATE OR REPLACE FUNCTION worklease_fence(p_work_id TEXT, p_token BIGINT) RETURNS BOOLEAN
    LANGUAGE sql VOLATILE
    AS 'SELECT EXISTS (SELECT 1 FROM worklease_leases WHERE work_id = p_work_id AND fencing_token = p_token AND exit_mode IS NULL AND expires_at > clock_timestamp() FOR NO KEY UPDATE)';

-- step 3: an index for pool memberships.
-- Pool memberships (work IDs under 'worklease.member/'): every pool scan reads its group's
-- members; this partial index keeps that read a few rows however big the table grows (work
-- rows never enter it, so their writes do not maintain it).
CREATE INDEX IF NOT EXISTS idx_worklease_leases_members
    ON worklease_leases (work_id text_pattern_ops) WHERE work_id LIKE 'worklease.member/%';

-- step 4: lease writes are HOT updates: no updated_at index, fillfactor 90.
-- No index on updated_at or expires_at: every renewal and checkpoint changes both, and an
-- index on a changed column makes each write a non-HOT update (a new index entry in every
-- index, a table that bloats). The sweep walks the primary key in bounded batches instead.
-- Tables made by earlier versions (or by the Go library's migration) have it: dropped here.
DROP INDEX IF EXISTS idx_worklease_leases_updated_at;

-- Room on each page for a row's next version, so an update stays on its page (HOT) even
-- before the page is pruned (ADR-0018).
ALTER TABLE worklease_leases SET (fillfactor = 90);

-- The version, recorded on the table: `worklease migrate --check` and the backend read it.
-- Never over a newer one: a table a later worklease migrated stays as it is (run this file
-- with `psql -1` so nothing of it is kept then).
DO $$
BEGIN
    IF substring(obj_description('worklease_leases'::regclass, 'pg_class')
                 FROM '^worklease schema version (\d+)')::int > 4 THEN
        RAISE EXCEPTION 'the lease table records a schema version newer than 4: upgrade worklease';
    END IF;
    COMMENT ON TABLE worklease_leases IS 'worklease schema version 4';
END
$$;
