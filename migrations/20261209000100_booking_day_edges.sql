-- A model's availability over a year reads its days, not its bookings.
--
-- Why: `GET /models/{m}/availability` answers, per UTC day, the most units booked at
-- one instant of the day. It read every booking of the model over the range (a year:
-- ~2,000 planned bookings in the history bench, 7,000-9,500 once its creates have
-- run) and swept them. Each is a heap tuple of its own: the bookings of one model
-- are written between those of the others, and where the archiving job's updates
-- left space, all over the table. In the history bench's database (2026-11-28 11:40,
-- EXPLAIN (ANALYZE, BUFFERS), warm) a year of `hist-03` was 9,576 bookings on 5,541
-- pages, 9.5 ms; of `plan-03` 6,938 on 3,119, 5.6 ms; the API's rate history /
-- planned 0.64-0.68 in three runs. The same year's 365 rows of `booking_day_units`
-- read in 0.45 ms (284 buffers).
--
-- How: each day row also keeps where in the day the units it counts begin and end,
-- `edges`: a multiset with one entry per booking, slot and edge inside the day, the
-- microseconds since the day's midnight (UTC) times two, plus one for a start. A
-- booking that starts before the day starts adds no start entry, one that ends at
-- or after the next midnight no end entry. So the units in use at the day's first
-- instant are the row's units less its start entries, and a walk of the entries in
-- order (an end sorts before a start at the same instant, since windows are
-- half-open) gives every level of the day, the busiest among them
-- (`core::capacity::DayLoad`). Bookings too long to be kept per day (31 days or
-- more, `booking_counted_by_day`) are read as before, by their own partial index:
-- few, and the read adds them to the days they cover.
--
-- What it costs a create: the entries of its first and last day, written into the
-- rows the create already updates (no row, index entry or lock more). Kept like the
-- rows' units and slots, by the same triggers, in the same statements; the tests'
-- oracle (`testing::day_units_mismatches`) compares them with a recount from the
-- bookings after every change the tests make.

ALTER TABLE booking_day_units ADD COLUMN edges bigint[] NOT NULL DEFAULT '{}';
COMMENT ON COLUMN booking_day_units.edges IS
    'Where the counted bookings begin and end inside the day: one entry per booking, slot and edge, microseconds since midnight UTC times two, plus one for a start. Unordered.';

-- A booking's start as an entry of `p_day`, NULL unless it starts that day.
CREATE FUNCTION booking_start_edge(p_start timestamptz, p_day integer) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN booking_day(p_start) = p_day
                THEN ((extract(epoch FROM p_start) * 1000000)::bigint - p_day::bigint * 86400000000) * 2 + 1
           END
$$;

-- A booking's end as an entry of `p_day`, NULL unless it ends inside that day (an end
-- at the next midnight leaves the day as it ends).
CREATE FUNCTION booking_end_edge(p_end timestamptz, p_day integer) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN booking_day(p_end) = p_day
                THEN ((extract(epoch FROM p_end) * 1000000)::bigint - p_day::bigint * 86400000000) * 2
           END
$$;

-- A booking's entries on `p_day`: its start and end there, each once per unit.
CREATE FUNCTION booking_day_edges(p_start timestamptz, p_end timestamptz, p_day integer, p_units integer)
RETURNS bigint[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN booking_day(p_start) = p_day
                THEN array_fill(booking_start_edge(p_start, p_day), ARRAY[p_units]) ELSE '{}' END
        || CASE WHEN booking_day(p_end) = p_day
                THEN array_fill(booking_end_edge(p_end, p_day), ARRAY[p_units]) ELSE '{}' END
$$;

-- `p_have` without one occurrence of each entry of `p_gone`, as many times as
-- `p_gone` holds it (a booking of two units has two equal start entries).
CREATE FUNCTION booking_edges_minus(p_have bigint[], p_gone bigint[]) RETURNS bigint[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(h.e), '{}')
    FROM (SELECT e, row_number() OVER (PARTITION BY e) AS n FROM unnest(p_have) AS e) AS h
    WHERE h.n > (SELECT count(*) FROM unnest(p_gone) AS g WHERE g = h.e)
$$;

-- The row path (updates and deletes: cancels, early ends, window changes, slot
-- moves), migration 20261207000100 with the entries.
CREATE OR REPLACE FUNCTION booking_day_slots_add(p_model text, p_start timestamptz, p_end timestamptz, p_slots integer[], p_add boolean)
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
    INSERT INTO booking_day_units AS d (model, day, units, slots, edges)
    SELECT p_model, day,
           CASE WHEN p_add THEN cardinality(p_slots) ELSE 0 END,
           CASE WHEN p_add THEN sort_asc(p_slots) ELSE '{}' END,
           CASE WHEN p_add THEN booking_day_edges(p_start, p_end, day, cardinality(p_slots)) ELSE '{}' END
    FROM generate_series(booking_day(p_start), booking_day(p_end - interval '1 microsecond')) AS day
    ORDER BY day
    ON CONFLICT (model, day) DO UPDATE SET
        units = d.units + CASE WHEN p_add THEN 1 ELSE -1 END * cardinality(p_slots),
        slots = CASE WHEN p_add THEN sort_asc(d.slots || p_slots) ELSE booking_slots_minus(d.slots, p_slots) END,
        edges = CASE WHEN p_add THEN d.edges || excluded.edges
                     ELSE booking_edges_minus(d.edges, booking_day_edges(p_start, p_end, d.day, cardinality(p_slots))) END;
END
$$;

-- The statement path (every INSERT), migration 20261208000100 with the entries: one
-- per booking, slot and edge of the day, from the rows `(booking, day, slot)`.
CREATE OR REPLACE FUNCTION booking_day_units_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO booking_day_units AS d (model, day, units, slots, edges)
    SELECT b.model, day, count(*), sort_asc(array_agg(s)),
           coalesce(array_agg(booking_start_edge(b.start_at, day)) FILTER (WHERE booking_day(b.start_at) = day), '{}')
           || coalesce(array_agg(booking_end_edge(b.end_at, day)) FILTER (WHERE booking_day(b.end_at) = day), '{}')
    FROM booking_new b,
         generate_series(booking_day(b.start_at), booking_day(b.end_at - interval '1 microsecond')) AS day,
         unnest(b.slots) AS s
    WHERE b.cancelled_at IS NULL AND booking_counted_by_day(b.start_at, b.end_at)
    GROUP BY b.model, day
    ORDER BY b.model, day
    ON CONFLICT (model, day) DO UPDATE SET
        units = d.units + excluded.units,
        slots = sort_asc(d.slots || excluded.slots),
        edges = d.edges || excluded.edges;
    RETURN NULL;
END
$$;

-- The loader's and this migration's count from the bookings themselves.
CREATE OR REPLACE FUNCTION booking_day_units_recount(p_model text) RETURNS void
LANGUAGE sql VOLATILE AS $$
    DELETE FROM booking_day_units WHERE model = p_model;
    INSERT INTO booking_day_units (model, day, units, slots, edges)
    SELECT b.model, day, count(*), sort_asc(array_agg(s)),
           coalesce(array_agg(booking_start_edge(b.start_at, day)) FILTER (WHERE booking_day(b.start_at) = day), '{}')
           || coalesce(array_agg(booking_end_edge(b.end_at, day)) FILTER (WHERE booking_day(b.end_at) = day), '{}')
    FROM booking b,
         generate_series(booking_day(b.start_at), booking_day(b.end_at - interval '1 microsecond')) AS day,
         unnest(b.slots) AS s
    WHERE b.model = p_model AND b.cancelled_at IS NULL AND booking_counted_by_day(b.start_at, b.end_at)
    GROUP BY b.model, day;
$$;

-- The rows of an existing database get their entries, counted again from the
-- bookings (the table is locked for the migration).
SELECT booking_day_units_recount(m.model) FROM (SELECT DISTINCT model FROM booking) AS m;
