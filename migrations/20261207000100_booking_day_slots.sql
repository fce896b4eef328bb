-- A create decides from the window's days, not from the bookings over its window
-- (creates with a year of planned bookings).
--
-- A create read every booking of its model over its window (69 in the history bench,
-- each a heap tuple found through the GiST index (model, period)) to count the units
-- in use at its busiest instant and to find units free throughout, and the API
-- decoded and judged each. Once the slot check was keyed by unit (migration
-- 20261205000100), that read was what grew most with a year of planned bookings:
-- 0.392 ms and 69 rows a create against 0.110 ms and 6 in an empty database, the
-- locks and reads 3.0 x (docs/performance.md, 2026-11-27 21:15). This design was
-- built once before (2026-11-26) and undone when it did not pay: its read of the
-- days, a join of the window's days to this table, was planned (generic plan) as a
-- scan of every day row of the model, past days included (369 rows, 205 buffers a
-- create in the history bench). Read by one key range (3 rows, 5 buffers), creates on
-- a year of planned bookings run 1.23 x as fast as with the read of the bookings
-- (docs/performance.md, 2026-11-27 23:00).
--
-- Now `booking_day_units` also keeps, per model and UTC day, the slots that the
-- bookings touching the day hold: a multiset (one entry per booking and slot, sorted),
-- since two bookings of one day may hold one slot one after the other, and a cancel
-- takes one of them away. A slot absent from every day of a window is free throughout
-- it (every booking over the window touches one of its days), and the largest count
-- of the window's days bounds the units in use at any instant of it (migration
-- 20261128000100). So a create reads at most one row per day of its window (at most 31) and
-- the few bookings too long to be kept per day; when these leave `need` units free by
-- count and `need` slots absent from every day, it takes those slots
-- (core::capacity::free_slots_by_days). Only where they do not decide (a model nearly
-- full, or its free slots each busy on part of the window) does the service read the
-- bookings over the window, in the same transaction under the same locks, and decide
-- exactly as before (booking-api/src/store/bookings.rs).
--
-- Why what a create reads is true: the rows of its days change only with a booking
-- that touches them. Creates on those days wait for the day locks the create holds;
-- cancels and early ends (the model's lock shared) only free units, so a row read
-- before one commits holds more than is in use, never less; window changes and slot
-- moves take the model's lock exclusive and wait for the create. The exclusion
-- constraints stay the backstop.

-- `p_have` without one occurrence of each slot of `p_gone` (a booking's slots, which
-- are distinct), sorted.
CREATE FUNCTION booking_slots_minus(p_have integer[], p_gone integer[]) RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (
        SELECT coalesce(array_agg(h.slot ORDER BY h.slot), '{}')
        FROM (SELECT slot, row_number() OVER (PARTITION BY slot) AS n FROM unnest(p_have) AS slot) AS h
        WHERE h.n > CASE WHEN h.slot = ANY (p_gone) THEN 1 ELSE 0 END
    );
END
$$;

ALTER TABLE booking_day_units ADD COLUMN slots integer[] NOT NULL DEFAULT '{}';
COMMENT ON COLUMN booking_day_units.slots IS
    'The slots held on the day by the bookings counted in units: one entry per booking and slot, sorted.';

-- Adds a booking's slots to each day of its window (`p_add`), or takes them away.
-- Replaces booking_day_units_add: the units are the slots' number (booking_slots_check).
CREATE FUNCTION booking_day_slots_add(p_model text, p_start timestamptz, p_end timestamptz, p_slots integer[], p_add boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    IF NOT booking_counted_by_day(p_start, p_end) THEN
        RETURN;
    END IF;
    -- One statement, days ascending (the lock order). A removal always finds its days
    -- counted; the row it proposes holds nothing.
    INSERT INTO booking_day_units AS d (model, day, units, slots)
    SELECT p_model, day,
           CASE WHEN p_add THEN cardinality(p_slots) ELSE 0 END,
           CASE WHEN p_add THEN sort_asc(p_slots) ELSE '{}' END
    FROM generate_series(booking_day(p_start), booking_day(p_end - interval '1 microsecond')) AS day
    ORDER BY day
    ON CONFLICT (model, day) DO UPDATE SET
        units = d.units + CASE WHEN p_add THEN 1 ELSE -1 END * cardinality(p_slots),
        slots = CASE WHEN p_add THEN sort_asc(d.slots || p_slots) ELSE booking_slots_minus(d.slots, p_slots) END;
END
$$;

CREATE OR REPLACE FUNCTION booking_day_units_after() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.cancelled_at IS NULL THEN
        PERFORM booking_day_slots_add(OLD.model, OLD.start_at, OLD.end_at, OLD.slots, false);
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND NEW.cancelled_at IS NULL THEN
        PERFORM booking_day_slots_add(NEW.model, NEW.start_at, NEW.end_at, NEW.slots, true);
    END IF;
    RETURN NULL;
END
$$;

DROP FUNCTION booking_day_units_add(text, timestamptz, timestamptz, integer);

-- Slot moves change the days' slots now.
DROP TRIGGER booking_day_units_update ON booking;
CREATE TRIGGER booking_day_units_update AFTER UPDATE ON booking
    FOR EACH ROW
    WHEN ((OLD.model, OLD.start_at, OLD.end_at, OLD.slots, OLD.cancelled_at IS NULL)
          IS DISTINCT FROM (NEW.model, NEW.start_at, NEW.end_at, NEW.slots, NEW.cancelled_at IS NULL))
    EXECUTE FUNCTION booking_day_units_after();

CREATE OR REPLACE FUNCTION booking_day_units_recount(p_model text) RETURNS void
LANGUAGE sql VOLATILE AS $$
    DELETE FROM booking_day_units WHERE model = p_model;
    INSERT INTO booking_day_units (model, day, units, slots)
    SELECT b.model, day, count(*), sort_asc(array_agg(s))
    FROM booking b,
         generate_series(booking_day(b.start_at), booking_day(b.end_at - interval '1 microsecond')) AS day,
         unnest(b.slots) AS s
    WHERE b.model = p_model AND b.cancelled_at IS NULL AND booking_counted_by_day(b.start_at, b.end_at)
    GROUP BY b.model, day;
$$;

SELECT booking_day_units_recount(m.model) FROM (SELECT DISTINCT model FROM booking) AS m;

-- The create's locks and reads (migrations 20261125000200, 20261204000100), with the
-- window's days in place of the bookings over it where the window is kept per day
-- (`booking_lock_and_read_batch` calls it per create, unchanged):
--   'm'  the model's units in o_slot;
--   'u'  a booking of the user;
--   'd'  a day of the window that holds a row (o_id: the day since 1970), with the
--        units (o_slot) and slots (o_slots) its counted bookings hold; a day without
--        a row holds nothing;
--   'l'  a booking over the window too long to be kept per day;
--   'o'  for a window too long to be kept per day (the model's lock exclusive), the
--        model's bookings over it, as before.
CREATE OR REPLACE FUNCTION booking_lock_and_read(p_user text, p_model text, p_start timestamptz, p_end timestamptz, p_own_from timestamptz)
RETURNS TABLE (o_kind text, o_id bigint, o_start timestamptz, o_end timestamptz, o_slot integer, o_slots integer[])
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_units integer;
BEGIN
    v_units := booking_lock_days(p_user, p_model, p_start, p_end);
    IF v_units IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT 'm'::text, NULL::bigint, NULL::timestamptz, NULL::timestamptz, v_units, NULL::integer[];
    RETURN QUERY SELECT 'u'::text, b.id, b.start_at, b.end_at, b.slot, b.slots FROM booking b
        WHERE b.user_name = p_user AND b.cancelled_at IS NULL AND b.end_at > p_own_from;
    IF booking_counted_by_day(p_start, p_end) THEN
        -- One range of the primary key: the days of the window that hold a row. A
        -- day without one holds nothing, and the caller counts it so. (Joined to the
        -- window's days instead, the generic plan read every day row of the model,
        -- past ones included: 369 rows and 205 buffers a create in the history
        -- bench, where this range reads 3 rows and 5 buffers.)
        RETURN QUERY SELECT 'd'::text, d.day::bigint, NULL::timestamptz, NULL::timestamptz,
                            d.units, d.slots
            FROM booking_day_units d
            WHERE d.model = p_model
              AND d.day BETWEEN booking_day(p_start) AND booking_day(p_end - interval '1 microsecond');
        -- The partial index's own predicate (booking_long_period_idx).
        RETURN QUERY SELECT 'l'::text, b.id, b.start_at, b.end_at, b.slot, b.slots FROM booking b
            WHERE b.model = p_model AND b.cancelled_at IS NULL
              AND NOT booking_counted_by_day(b.start_at, b.end_at)
              AND b.period && tstzrange(p_start, p_end, '[)');
    ELSE
        RETURN QUERY SELECT 'o'::text, b.id, b.start_at, b.end_at, b.slot, b.slots FROM booking b
            WHERE b.model = p_model AND b.cancelled_at IS NULL
              AND b.period && tstzrange(p_start, p_end, '[)');
    END IF;
END
$$;

