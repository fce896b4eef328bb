-- The change stream's horizon counts only this database's transactions.
--
-- A reader served the changes of transactions below
-- `pg_snapshot_xmin(pg_current_snapshot())` (migration 20261124000010). Transaction
-- ids are the Postgres server's, not the database's, so that horizon also waited for
-- every transaction of every other database on the server: one long write there (a
-- bulk load, a migration, a batch job of another application) held back every
-- booking change for as long as it ran, and the stream answered "no change"
-- meanwhile, so neither the webhook's replica nor the controller could tell. Seen:
-- a benchmark loading a history in a database of its own stalled the change stream of
-- the end-to-end tests running beside it for over 10 s (CI, 2026-11-27).
--
-- A transaction of another database never writes `booking_change`, so a reader may
-- pass it. The horizon is now the oldest transaction in flight in the snapshot that
-- is not known to belong to another database, or the snapshot's xmax when there is
-- none: every transaction below it that could have written a change has finished,
-- and one that starts later gets an id at or above xmax.
--
-- Which transactions belong to other databases comes from `pg_stat_activity`
-- (`backend_xid`, shown to every role), read *before* the snapshot is taken, in a
-- statement of its own: a transaction in flight in the snapshot that the earlier
-- read named as another database's still is (a transaction's database never
-- changes), and a transaction the read did not see (started since, a prepared
-- transaction without a backend, this database's own) is waited for as before. Read
-- in that order the horizon never moves backwards from one reader to the next, which
-- a follower's position relies on (a position beyond the horizon is "gone").

-- The ids (32-bit, as `pg_stat_activity` shows them) of the transactions in flight in
-- other databases of the server.
CREATE FUNCTION booking_change_elsewhere() RETURNS bigint[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(backend_xid::text::bigint), '{}')
    FROM pg_stat_activity
    WHERE backend_xid IS NOT NULL
      AND datid IS DISTINCT FROM (SELECT oid FROM pg_database WHERE datname = current_database())
$$;

-- The horizon of the current snapshot: every transaction of this database below it
-- has finished. `p_elsewhere` comes from `booking_change_elsewhere()`, read before
-- the snapshot. An xid8 maps to its 32-bit id by its low 32 bits; the transactions in
-- flight span less than 2^31 ids, so no two of them share those bits.
CREATE FUNCTION booking_change_settled_below(p_elsewhere bigint[]) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT min(x::text::bigint) FROM pg_snapshot_xip(pg_current_snapshot()) AS x
          WHERE x::text::bigint % 4294967296 <> ALL (p_elsewhere)),
        pg_snapshot_xmax(pg_current_snapshot())::text::bigint)
$$;
