-- Loads a booking history for benchmarks and capacity tests: by default
-- 1,000,000 bookings of 100,000 users on 40 models over 3 years (about 2 years 9
-- months past, 3 months planned), in one transaction, in SQL (generate_series),
-- in about a minute on a laptop. It needs the service's migrations applied and is
-- meant for an otherwise idle database (it takes the booking table's exclusive lock
-- for a moment to switch the change-log, day-units and slot-unit triggers off and on).
--
--     psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f scripts/load-history.sql
--
-- Sizes are settings (defaults below), e.g.
--     PGOPTIONS='-c gpu_booking_load.bookings=100000 -c gpu_booking_load.users=10000' psql ...
-- gpu_booking_load.bookings, .users, .models, .cycles (15-day cycles in all, default
-- 73: 3 years), .planned_cycles (those after today, default 6), .model_prefix
-- (default `hist`) and .user_prefix (default `h`). With cycles = planned_cycles the
-- load is only the planned part: the history bench loads that first, on other
-- prefixes, to tell what history costs from what the planned bookings cost.
--
-- What it writes, and why every constraint holds by construction:
-- - models `hist-00` ... (`{model_prefix}-NN`; units: the lanes per model below plus
--   as many spare units, so that new bookings fit), users `h000000` ...
--   (`{user_prefix}NNNNNN`) with their label keys (`user_key`; these names are their
--   own escape and safe slugs);
-- - a "lane" is one unit of one model; time is cut into 15-day cycles, and each lane
--   holds one booking per cycle, 1 to 14 days long, inside the cycle: no two bookings
--   of a lane overlap (booking_slot_excl);
-- - booking n goes to user n mod users: a user's bookings are users / lanes cycles
--   apart (7 with the defaults), so they never overlap (booking_user_excl), are at
--   least 15 days apart (the 14-day cooldown holds too) and a user holds at most one
--   planned booking unless the planned cycles exceed that spacing;
-- - 3 % are cancelled before they started, 5 % of those that ended were ended early
--   (end_at moved, booked_end_at kept).
--
-- The change log and the audit trail: history is not a change made through the
-- service, so the loader writes no `booking_change` rows (the trigger is off during
-- the load) and moves `booking_change_horizon` to its own transaction: a follower
-- resuming from before the load gets 410 Gone and re-lists, which shows it the
-- loaded bookings. It writes one audit row, `booking.import`, with the counts.

BEGIN;

CREATE TEMP TABLE load_param ON COMMIT DROP AS
SELECT b AS bookings, u AS users, m AS models, p AS planned_cycles,
       ((b + m * cy - 1) / (m * cy))::integer AS lanes_per_model, cy AS cycles,
       mp AS model_prefix, up AS user_prefix
FROM (
    SELECT COALESCE(NULLIF(current_setting('gpu_booking_load.bookings', true), '')::bigint, 1000000) AS b,
           COALESCE(NULLIF(current_setting('gpu_booking_load.users', true), '')::bigint, 100000) AS u,
           COALESCE(NULLIF(current_setting('gpu_booking_load.models', true), '')::integer, 40) AS m,
           COALESCE(NULLIF(current_setting('gpu_booking_load.planned_cycles', true), '')::integer, 6) AS p,
           COALESCE(NULLIF(current_setting('gpu_booking_load.cycles', true), '')::integer, 73) AS cy,
           COALESCE(NULLIF(current_setting('gpu_booking_load.model_prefix', true), ''), 'hist') AS mp,
           COALESCE(NULLIF(current_setting('gpu_booking_load.user_prefix', true), ''), 'h') AS up
) s;

-- Cycle 0 starts so that `planned_cycles` cycles lie after today (UTC midnight).
CREATE TEMP TABLE load_time ON COMMIT DROP AS
SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
       - make_interval(days => 15 * (cycles - planned_cycles)) AS t0
FROM load_param;

INSERT INTO gpu_model (name, position, units, patterns, gpumem_mib, created_at, updated_at)
SELECT format('%s-%s', p.model_prefix, lpad(m::text, 2, '0')), 1000 + m, 2 * p.lanes_per_model, '{}', 1024, t.t0, t.t0
FROM load_param p, load_time t, generate_series(0, p.models - 1) AS m
ON CONFLICT (name) DO UPDATE SET units = GREATEST(gpu_model.units, EXCLUDED.units);

INSERT INTO app_user (name, escape_slug, safe_slug, created_at)
SELECT n, n, n, t.t0 - interval '1 day'
FROM load_param p, load_time t, generate_series(0, p.users - 1) AS u,
     LATERAL (SELECT p.user_prefix || lpad(u::text, 6, '0') AS n) AS x
ON CONFLICT (name) DO NOTHING;

INSERT INTO user_key (key, user_name)
SELECT p.user_prefix || lpad(u::text, 6, '0'), p.user_prefix || lpad(u::text, 6, '0')
FROM load_param p, generate_series(0, p.users - 1) AS u
ON CONFLICT (key) DO NOTHING;

ALTER TABLE booking DISABLE TRIGGER booking_change_insert;
-- The units per model and day (migration 20261128000100) are counted once at the end,
-- not one booking at a time.
ALTER TABLE booking DISABLE TRIGGER booking_day_units_insert;
-- So are the rows of the slot constraint (`booking_unit`, migration 20261205000100):
-- one INSERT for the whole load, after the bookings (`booking_unit_fill`).
ALTER TABLE booking DISABLE TRIGGER booking_unit_insert;
CREATE TEMP TABLE load_from ON COMMIT DROP AS
SELECT COALESCE(max(id), 0) AS id FROM booking;

-- h1..h4: deterministic pseudo-random numbers per booking (the same load every run).
-- The user's number is read here (one index probe each), not left to the per-row
-- trigger that fills it for inserts that leave it out (migration 20261210000100).
INSERT INTO booking (user_name, user_id, model, slots, units, start_at, end_at, booked_end_at,
                     cancelled_at, ended_early_at, override, created_by, created_at, updated_at)
SELECT p.user_prefix || lpad((n % p.users)::text, 6, '0'),
       (SELECT a.id FROM app_user a WHERE a.name = p.user_prefix || lpad((n % p.users)::text, 6, '0')),
       format('%s-%s', p.model_prefix, lpad((lane / p.lanes_per_model)::text, 2, '0')),
       ARRAY[(lane % p.lanes_per_model)::integer], 1,
       w.s,
       CASE WHEN w.early THEN w.s + (w.e - w.s) / 2 ELSE w.e END,
       w.e,
       CASE WHEN w.cancelled THEN w.s - interval '1 hour' END,
       CASE WHEN w.early THEN w.s + (w.e - w.s) / 2 END,
       false, p.user_prefix || lpad((n % p.users)::text, 6, '0'),
       w.c, CASE WHEN w.cancelled THEN w.s - interval '1 hour' WHEN w.early THEN w.s + (w.e - w.s) / 2 ELSE w.c END
FROM load_param p, load_time t, generate_series(0, p.bookings - 1) AS n,
     LATERAL (SELECT n % (p.models * p.lanes_per_model) AS lane,
                     n / (p.models * p.lanes_per_model) AS cycle,
                     abs(hashint8(n)) AS h1, abs(hashint8(n + 7000000000)) AS h2,
                     abs(hashint8(n + 14000000000)) AS h3, abs(hashint8(n + 21000000000)) AS h4) AS r,
     -- 24 to 336 hours, starting at a whole hour of the cycle's 360 with room to end in it.
     LATERAL (SELECT 24 + r.h1 % 313 AS hours) AS d,
     LATERAL (SELECT t.t0 + make_interval(hours => (r.cycle * 360 + r.h2 % (361 - d.hours))::integer) AS s) AS st,
     LATERAL (SELECT st.s AS s, st.s + make_interval(hours => d.hours::integer) AS e,
                     st.s - make_interval(hours => (1 + r.h4 % 720)::integer) AS c,
                     r.h3 % 100 < 3 AS cancelled) AS w0(s, e, c, cancelled),
     LATERAL (SELECT w0.s, w0.e, w0.c, w0.cancelled AS cancelled,
                     NOT w0.cancelled AND r.h3 % 100 BETWEEN 3 AND 7 AND w0.e <= now() AS early) AS w(s, e, c, cancelled, early);

ALTER TABLE booking ENABLE TRIGGER booking_change_insert;
ALTER TABLE booking ENABLE TRIGGER booking_day_units_insert;
ALTER TABLE booking ENABLE TRIGGER booking_unit_insert;
DO $$ BEGIN
    PERFORM booking_unit_fill(f.id) FROM load_from f;
    PERFORM booking_day_units_recount(format('%s-%s', p.model_prefix, lpad(m::text, 2, '0')))
    FROM load_param p, generate_series(0, p.models - 1) AS m;
END $$;

UPDATE booking_change_horizon SET txid = GREATEST(txid, pg_current_xact_id()::text::bigint);

INSERT INTO audit_event (at, actor, action, details)
SELECT now(), 'load-history.sql', 'booking.import',
       jsonb_build_object('bookings', p.bookings, 'users', p.users, 'models', p.models,
                          'from', t.t0, 'to', t.t0 + make_interval(days => 15 * p.cycles))
FROM load_param p, load_time t;

COMMIT;
ANALYZE booking;
ANALYZE app_user;
ANALYZE user_key;
