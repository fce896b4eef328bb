-- A create's locks and reads as the service takes them (per model-day), no write:
-- a new user, one of the loader's models 0 to mmax (pgbench -D mmax=39), 2 days
-- within the next year.
\set m random(0, :mmax)
\set d random(1, 365)
\set u random(1, 2000000000)
BEGIN;
SELECT * FROM booking_lock_and_read('p' || :u, 'hist-' || lpad(:m::text, 2, '0'), date_trunc('hour', now()) + make_interval(days => :d), date_trunc('hour', now()) + make_interval(days => :d + 2), date_trunc('hour', now()) + make_interval(days => :d - 14));
COMMIT;
