-- The day functions, inlined (creates).
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
-- The same values from immutable operators, in whole days: the instant as a UTC
-- timestamp (`AT TIME ZONE 'UTC'`), its date, and a difference of dates. The day of
-- a window's last instant, `end - 1 µs`, is taken on the UTC timestamp, where
-- subtracting an interval is immutable. (A first try, epoch seconds divided by
-- 86,400 as numeric, lost the microsecond in the division's rounding for dates far
-- ahead; dates are exact everywhere Postgres holds a timestamp.) Same arguments,
-- same results, so the index that uses `booking_counted_by_day` stays valid
-- (booking-api/tests/day_functions.rs: `the_day_functions_are_inlined_and_give_the_same_days`
-- compares them with the old bodies over 1960-2101, where those were exact;
-- `the_day_functions_hold_at_the_ends_of_postgres_time` checks the first and nearly
-- the last day Postgres holds).

CREATE OR REPLACE FUNCTION booking_day(p_at timestamptz) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT (p_at AT TIME ZONE 'UTC')::date - date '1970-01-01'
$$;

CREATE OR REPLACE FUNCTION booking_counted_by_day(p_start timestamptz, p_end timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT ((p_end AT TIME ZONE 'UTC') - interval '1 microsecond')::date
         - (p_start AT TIME ZONE 'UTC')::date < 31
$$;

-- Generic plans for the create's own statements in plpgsql. A plpgsql statement with
-- parameters is planned anew for each call while its plan for the call's values (a
-- custom plan) looks cheaper than the plan for any values: the day-units upsert's
-- `generate_series` over the window's days is estimated at 3 rows with the values and
-- 1,000 without, so it was planned on every create, and planning folded the day
-- functions by running them (the same profile: 11 % of Postgres's time in planning
-- within these two functions). Their generic plans are the ones the custom plans
-- choose: the primary key of `booking_day_units`; the user's bookings and the
-- model's over the window through their indexes (the test
-- `the_creates_plpgsql_runs_on_generic_plans_that_use_the_indexes`).
ALTER FUNCTION booking_day_units_add(text, timestamptz, timestamptz, integer)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION booking_lock_and_read(text, text, timestamptz, timestamptz)
    SET plan_cache_mode = force_generic_plan;
