-- The day functions, inlined (issue 17: creates).
--
-- `booking_day` and `booking_counted_by_day` are SQL functions declared IMMUTABLE
-- whose bodies were not: `extract(epoch FROM timestamptz)` and `timestamptz -
-- interval` are STABLE (they depend on the time zone for other fields). The planner
-- inlines an IMMUTABLE SQL function only when its body is immutable too, so every
-- call ran through the SQL-function executor, which parses and plans its body on
-- each call. A create called them about ten times: its day locks, the day-units
-- trigger, and the partial index `booking_long_period_idx`, whose predicate is
-- evaluated on every insert into `booking`. A CPU profile of `scripts/create-cost.sh`
-- (perf, 32 clients, 2026-11-26) put 13 % of Postgres's time in that executor.
--
-- The same values from immutable operators: the difference of two timestamptz is an
-- interval of days and time whatever the time zone, and its epoch is exact.
-- `booking_counted_by_day` needs the day of a window's last instant, `end - 1 µs`:
-- for an end counted in whole microseconds that is ceil(end / day) - 1, which needs no
-- `timestamptz - interval`. Same arguments, same results (the test
-- `the_day_functions_are_inlined_and_give_the_same_days` compares them with the old
-- bodies), so the index that uses `booking_counted_by_day` stays valid.

CREATE OR REPLACE FUNCTION booking_day(p_at timestamptz) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT floor(extract(epoch FROM p_at - timestamptz '1970-01-01 00:00:00+00') / 86400)::integer
$$;

CREATE OR REPLACE FUNCTION booking_counted_by_day(p_start timestamptz, p_end timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT ceil(extract(epoch FROM p_end - timestamptz '1970-01-01 00:00:00+00') / 86400)::integer - 1
         - floor(extract(epoch FROM p_start - timestamptz '1970-01-01 00:00:00+00') / 86400)::integer < 31
$$;

-- Generic plans for the create's own statements in plpgsql. A plpgsql statement with
-- parameters is planned anew for each call while its plan for the call's values (a
-- custom plan) looks cheaper than the plan for any values: the day-units upsert's
-- `generate_series` over the window's days is estimated at 3 rows with the values and
-- 1,000 without, so it was planned on every create, and planning folded the day
-- functions by running them (the same profile: 11 % of Postgres's time in planning
-- within these two functions). Their generic plans are the ones the custom plans
-- choose: the primary key of `booking_day_units`; the user's bookings and the
-- model's over the window through their indexes (`EXPLAIN` in the same test).
ALTER FUNCTION booking_day_units_add(text, timestamptz, timestamptz, integer)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION booking_lock_and_read(text, text, timestamptz, timestamptz)
    SET plan_cache_mode = force_generic_plan;
