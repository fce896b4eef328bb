-- The units booked per model and UTC day, kept by every change of a booking in its own
-- transaction ("no scan that grows with history").
--
-- `/schedulability` and `/me/next-start` first ask, per model, whether the bookings
-- that overlap the user's earliest window could hold so many units at one instant
-- that the units asked for are not free (`core::next_start::free_throughout`). They
-- summed the units of those bookings through the GiST index `(model, period)`, which
-- also holds every past booking: with 1,000,000 bookings that sum read 854 buffers a
-- call against 548 with only the planned ones (pg_stat_statements,
-- scripts/history-statements.sh, 2026-11-26), 90 % of the two reads' database time,
-- and `/schedulability` kept 0.62-0.71 of its rate without the past.
--
-- Now a bound on the units held at any instant comes from this table: an instant lies
-- in one UTC day, and every booking active at that instant touches that day, so the
-- largest `units` over the window's days is at least what the bookings hold at any
-- instant of the window. One primary-key range per model, one row per day of the
-- window, whatever the history.
--
-- Only bookings whose window touches at most 31 days are kept here, the bound the day
-- locks use (migration 20261125000200): an admin's override can book years, and one
-- create must not write a row per day of them. Longer bookings are read through
-- their own partial index (few: only admins book them) and added to the bound.
--
-- Who writes: a trigger on `booking`, so that every path (create, cancel, end early,
-- a window's change, a model's deletion, the waitlist) keeps the table true without
-- knowing of it. Lock order: each change adds its days in ascending order; the
-- writers that run side by side on one model (creates, cancels, early ends: the
-- model's lock shared) touch only days they already hold or take them ascending, and
-- a change of a booking's window holds the model's lock exclusive, so no two wait on
-- each other in a cycle. A create already holds the advisory lock of each day it
-- writes, so its row locks add no wait between creates.

-- Whether a booking's units are kept per day: its window touches at most 31 UTC days.
CREATE FUNCTION booking_counted_by_day(p_start timestamptz, p_end timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT booking_day(p_end - interval '1 microsecond') - booking_day(p_start) < 31
$$;

CREATE TABLE booking_day_units (
    model text NOT NULL,
    -- UTC day since 1970-01-01 (`booking_day`).
    day integer NOT NULL,
    -- Units of the model's live bookings (not cancelled) whose window touches the day.
    units integer NOT NULL CHECK (units >= 0),
    PRIMARY KEY (model, day)
);

-- Adds `p_units` (negative: removes) to each day of a booking's window.
CREATE FUNCTION booking_day_units_add(p_model text, p_start timestamptz, p_end timestamptz, p_units integer)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF NOT booking_counted_by_day(p_start, p_end) THEN
        RETURN;
    END IF;
    -- One statement, days ascending (the lock order). The row proposed for a day not
    -- yet counted holds at least 0, since Postgres checks the CHECK constraint on it
    -- before it finds the conflict; a removal always finds its days counted.
    INSERT INTO booking_day_units AS d (model, day, units)
    SELECT p_model, day, greatest(p_units, 0)
    FROM generate_series(booking_day(p_start), booking_day(p_end - interval '1 microsecond')) AS day
    ORDER BY day
    ON CONFLICT (model, day) DO UPDATE SET units = d.units + p_units;
END
$$;

CREATE FUNCTION booking_day_units_after() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.cancelled_at IS NULL THEN
        PERFORM booking_day_units_add(OLD.model, OLD.start_at, OLD.end_at, -OLD.units);
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND NEW.cancelled_at IS NULL THEN
        PERFORM booking_day_units_add(NEW.model, NEW.start_at, NEW.end_at, NEW.units);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER booking_day_units_insert AFTER INSERT ON booking
    FOR EACH ROW EXECUTE FUNCTION booking_day_units_after();
CREATE TRIGGER booking_day_units_delete AFTER DELETE ON booking
    FOR EACH ROW EXECUTE FUNCTION booking_day_units_after();
-- Slot moves (the most frequent update besides cancels) change none of these.
CREATE TRIGGER booking_day_units_update AFTER UPDATE ON booking
    FOR EACH ROW
    WHEN ((OLD.model, OLD.start_at, OLD.end_at, OLD.units, OLD.cancelled_at IS NULL)
          IS DISTINCT FROM (NEW.model, NEW.start_at, NEW.end_at, NEW.units, NEW.cancelled_at IS NULL))
    EXECUTE FUNCTION booking_day_units_after();

CREATE FUNCTION booking_day_units_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM booking_day_units;
    RETURN NULL;
END
$$;
CREATE TRIGGER booking_day_units_truncate AFTER TRUNCATE ON booking
    FOR EACH STATEMENT EXECUTE FUNCTION booking_day_units_truncate();

-- Counts a model's days again from its bookings: for this migration, and for a bulk
-- load that switches the trigger off (scripts/load-history.sql).
CREATE FUNCTION booking_day_units_recount(p_model text) RETURNS void
LANGUAGE sql VOLATILE AS $$
    DELETE FROM booking_day_units WHERE model = p_model;
    INSERT INTO booking_day_units (model, day, units)
    SELECT b.model, day, sum(b.units)
    FROM booking b,
         generate_series(booking_day(b.start_at), booking_day(b.end_at - interval '1 microsecond')) AS day
    WHERE b.model = p_model AND b.cancelled_at IS NULL AND booking_counted_by_day(b.start_at, b.end_at)
    GROUP BY b.model, day;
$$;

SELECT booking_day_units_recount(m.model) FROM (SELECT DISTINCT model FROM booking) AS m;

-- The bookings not kept per day, by model and period.
CREATE INDEX booking_long_period_idx ON booking USING gist (model, period)
    WHERE cancelled_at IS NULL AND NOT booking_counted_by_day(start_at, end_at);
