-- The user's live bookings' index serves searches by user only.
--
-- Why: a partial index whose predicate a query implies is a candidate for a scan of
-- the whole index with the query's conditions as a filter. `booking_user_live_idx`
-- (user_name, end_at) WHERE cancelled_at IS NULL is implied by the create's read of
-- a model's bookings over a window (`... AND b.cancelled_at IS NULL`), and on a
-- database whose statistics say nothing yet (never analysed) the planner's estimate
-- for that walk ties with the model and period index it should take: the booking
-- row grew by `hold_id` (migration 20261213000200) and the tie broke the wrong way,
-- so a generic plan made before the first analyse walked every live booking for
-- one model's window (day_functions' `the_creates_plpgsql_runs_on_generic_plans_
-- that_use_the_indexes`).
--
-- How: the same index with `user_name IS NOT NULL` in its predicate. Every row has
-- a user (NOT NULL), so it holds the same entries, and a search by user implies
-- the predicate (`user_name = $1` is strict), so it serves those as before; a
-- search that names no user can no longer take it.
DROP INDEX booking_user_live_idx;
CREATE INDEX booking_user_live_idx ON booking (user_name, end_at)
    WHERE cancelled_at IS NULL AND user_name IS NOT NULL;
