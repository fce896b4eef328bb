-- What an INSERT into `booking` derives is written once per statement, not once per
-- row (the cost of a create).
--
-- Three AFTER INSERT row triggers derived a new booking's change-log row
-- (`booking_change_after`), its days' units and slots (`booking_day_units_insert`)
-- and its slot constraint's rows (`booking_unit_sync`): per booking, three plpgsql
-- calls and four statements, each started and ended by the executor. The service
-- writes the creates that meet in one statement (a batch, store::bookings), so a batch
-- of four paid twelve calls and sixteen statement start-ups for three tables. The
-- triggers and SPI statements were about 30 % of Postgres's samples in a create
-- (scripts/history-profile.sh, 2026-11-28 02:10: `AfterTriggerEndQuery` 31.1 %,
-- `standard_ExecutorStart` 12.5 %).
--
-- Now each is a statement trigger over the statement's new rows (a transition table,
-- which the three share): three calls and three set statements per INSERT whatever
-- its rows. What they write is what the row triggers wrote (tests/derived_rows.rs,
-- tests/loader.rs and the storms compare the derived tables with a recount); UPDATE
-- and DELETE keep their row triggers, which must compare each row's old and new
-- values (`booking_change_record` and `booking_day_units_after` keep their INSERT
-- branches, now unused: replacing them whole to drop a branch would repeat them).
--
-- The days' rows: one statement cannot update a row twice (ON CONFLICT), so the
-- statement's bookings are summed per model and day first, in the lock order (model,
-- day ascending) that the creates' day locks follow too.

CREATE FUNCTION booking_change_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- In the rows' order, as the row trigger recorded them.
    INSERT INTO booking_change (booking_id, kind)
    SELECT id, 'created' FROM booking_new ORDER BY id;
    RETURN NULL;
END
$$;

CREATE FUNCTION booking_day_units_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO booking_day_units AS d (model, day, units, slots)
    SELECT b.model, day, count(*), sort_asc(array_agg(s))
    FROM booking_new b,
         generate_series(booking_day(b.start_at), booking_day(b.end_at - interval '1 microsecond')) AS day,
         unnest(b.slots) AS s
    WHERE b.cancelled_at IS NULL AND booking_counted_by_day(b.start_at, b.end_at)
    GROUP BY b.model, day
    ORDER BY b.model, day
    ON CONFLICT (model, day) DO UPDATE SET
        units = d.units + excluded.units,
        slots = sort_asc(d.slots || excluded.slots);
    RETURN NULL;
END
$$;

CREATE FUNCTION booking_unit_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO booking_unit (booking_id, unit_key, period)
    SELECT b.id, booking_unit_key(m.id, s), b.period
    FROM booking_new b JOIN gpu_model m ON m.name = b.model, unnest(b.slots) AS s
    WHERE b.cancelled_at IS NULL AND NOT b.archived;
    RETURN NULL;
END
$$;

DROP TRIGGER booking_change_after ON booking;
CREATE TRIGGER booking_change_after AFTER UPDATE ON booking
    FOR EACH ROW EXECUTE FUNCTION booking_change_record();
CREATE TRIGGER booking_change_insert AFTER INSERT ON booking
    REFERENCING NEW TABLE AS booking_new
    FOR EACH STATEMENT EXECUTE FUNCTION booking_change_inserted();

DROP TRIGGER booking_day_units_insert ON booking;
CREATE TRIGGER booking_day_units_insert AFTER INSERT ON booking
    REFERENCING NEW TABLE AS booking_new
    FOR EACH STATEMENT EXECUTE FUNCTION booking_day_units_inserted();

DROP TRIGGER booking_unit_sync ON booking;
CREATE TRIGGER booking_unit_sync
    AFTER DELETE OR UPDATE OF start_at, end_at, model, slots, cancelled_at, archived ON booking
    FOR EACH ROW EXECUTE FUNCTION booking_unit_sync();
CREATE TRIGGER booking_unit_insert AFTER INSERT ON booking
    REFERENCING NEW TABLE AS booking_new
    FOR EACH STATEMENT EXECUTE FUNCTION booking_unit_inserted();
