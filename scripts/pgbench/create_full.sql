-- A whole create's statements: the locks and reads, then the user, the booking (two
-- exclusion checks, the change-log trigger) and its audit row in one statement, as
-- booking-api/src/store/bookings.rs writes them. Units 343 and up of the loader's
-- models hold no history, so that the random slot rarely meets another booking.
\set m random(0, :mmax)
\set d random(1, 1800)
\set u random(1, 2000000000)
\set s random(343, 685)
BEGIN;
SELECT * FROM booking_lock_and_read('p' || :u, 'hist-' || lpad(:m::text, 2, '0'), date_trunc('hour', now()) + make_interval(days => :d), date_trunc('hour', now()) + make_interval(days => :d + 2));
WITH known AS (
    INSERT INTO app_user (name, escape_slug, safe_slug) VALUES ('p' || :u, 'p' || :u, 'p' || :u) ON CONFLICT (name) DO NOTHING RETURNING name
), keys AS (
    INSERT INTO user_key (key, user_name) SELECT known.name, known.name FROM known
), created AS (
    INSERT INTO booking (user_name, model, slots, units, start_at, end_at, booked_end_at, override, created_by, created_at, updated_at)
    VALUES ('p' || :u, 'hist-' || lpad(:m::text, 2, '0'), ARRAY[:s], 1, date_trunc('hour', now()) + make_interval(days => :d),
            date_trunc('hour', now()) + make_interval(days => :d + 2), date_trunc('hour', now()) + make_interval(days => :d + 2), false, 'p' || :u, now(), now())
    RETURNING *
)
INSERT INTO audit_event (at, actor, action, subject, user_name, booking_id, details)
SELECT now(), user_name, 'booking.create', model, user_name, id, jsonb_build_object('start', start_at, 'end', end_at, 'slot', slot, 'units', units, 'slots', slots) FROM created;
COMMIT;
