-- One booking and its new user per transaction, with every trigger and constraint
-- of `booking` and nothing of the create's locks or reads: what a create pays for
-- its rows, loaded or not, apart from its decision. For a
-- database with the history loaded (scripts/load-history.sql, models `hist-00` ...)
-- and `CREATE SEQUENCE pb_seq`; a window of 1 to 3 days in the next 80, a slot above
-- any the loader gives (unique, so never refused). Compare with bare_insert.sql in
-- the same run:
--   pgbench -n -c 8 -j 2 -T 8 -f scripts/pgbench/booking_insert.sql <database>
\set m random(0, 39)
\set h random(24, 24 * 80)
\set len random(24, 72)
BEGIN;
WITH u AS (INSERT INTO app_user (name, escape_slug, safe_slug)
           SELECT n, n, n FROM (SELECT 'pb' || nextval('pb_seq') AS n) s RETURNING name, id)
INSERT INTO booking (user_name, user_id, model, slots, units, start_at, end_at, booked_end_at, created_by, created_at, updated_at)
SELECT u.name, u.id, 'hist-' || lpad(:m::text, 2, '0'), ARRAY[100000 + nextval('pb_seq')::int], 1,
       date_trunc('hour', now()) + :h * interval '1 hour',
       date_trunc('hour', now()) + (:h + :len) * interval '1 hour',
       date_trunc('hour', now()) + (:h + :len) * interval '1 hour', 't', now(), now()
FROM u;
COMMIT;
