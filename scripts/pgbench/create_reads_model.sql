-- The same with the whole model locked (as every create did before migration
-- 20261125000200): booking_lock takes the model's lock exclusive first.
\set m random(0, :mmax)
\set d random(1, 365)
\set u random(1, 2000000000)
BEGIN;
SELECT booking_lock('p' || :u, 'hist-' || lpad(:m::text, 2, '0'));
SELECT * FROM booking_lock_and_read('p' || :u, 'hist-' || lpad(:m::text, 2, '0'), date_trunc('hour', now()) + make_interval(days => :d), date_trunc('hour', now()) + make_interval(days => :d + 2));
COMMIT;
