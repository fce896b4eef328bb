-- `k` bookings and their new users in one statement, as the service writes the creates
-- that meet (a batch), with every trigger and constraint of `booking` and nothing of
-- the create's locks or reads: what the statement triggers of migration
-- 20261208000100 save a batch (docs/performance.md, "What each mechanism buys"). For a database with
-- the loader's models (`hist-00` ...; scripts/load-history.sql) whose units are raised
-- above the slots used here, and `CREATE SEQUENCE pb_seq`; windows of 2 days in the
-- next 300, a slot above any the loader gives (unique, so never refused):
--   pgbench -n -c 8 -j 2 -T 8 -D k=4 -f scripts/pgbench/booking_insert_batch.sql <database>
\set m random(0, 39)
\set h random(24, 24 * 300)
BEGIN;
WITH r AS (SELECT 'pb' || nextval('pb_seq') AS n, i FROM generate_series(1, :k) AS i),
u AS (INSERT INTO app_user (name, escape_slug, safe_slug) SELECT n, n, n FROM r RETURNING name, id)
INSERT INTO booking (user_name, user_id, model, slots, units, start_at, end_at, booked_end_at, created_by, created_at, updated_at)
SELECT r.n, u.id, 'hist-' || lpad(((:m + r.i) % 40)::text, 2, '0'), ARRAY[100000 + nextval('pb_seq')::int], 1,
       date_trunc('hour', now()) + (:h + r.i * 7) * interval '1 hour',
       date_trunc('hour', now()) + (:h + r.i * 7 + 48) * interval '1 hour',
       date_trunc('hour', now()) + (:h + r.i * 7 + 48) * interval '1 hour', 't', now(), now()
FROM r JOIN u ON u.name = r.n;
COMMIT;
