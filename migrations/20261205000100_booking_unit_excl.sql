-- The overbooking backstop keyed by unit: same rule, a search that meets
-- only the bookings of the unit it checks.
--
-- Why: `booking_slot_excl` was an exclusion constraint on `booking` itself, over
-- (period, model, slots) with intarray's signature index for the slot array. GiST
-- groups its entries by the first column, the period, so a create's conflict check
-- walked the entries of every model and unit whose bookings overlap its window to
-- find the few of its own unit: with the history bench's planned bookings, 54-64
-- buffers a check against 14-18 on an empty table, and in a profile of its
-- same-moment rounds the largest part of a loaded create's growth (exclusion checks
-- 23 % of Postgres's samples against 11 %, docs/performance.md, 2026-11-27). The
-- model first groups by a column of a few dozen values and was measured no better
-- for the loaded table (25-29 buffers, inserts as slow).
--
-- How: `booking_unit` holds a row per unit of every booking the constraint must see
-- (not cancelled, not archived: the old constraint's predicate), keyed by one int8
-- of the model's id and the unit, and `booking_slot_excl` is now its constraint:
-- `unit_key =` and `period &&`. GiST groups the entries by unit, so a check visits
-- the one or two leaf pages of that unit's bookings however many other bookings
-- overlap the window. The rows are written by `booking_unit_sync`, an AFTER trigger
-- on every change of a booking's window, model, slots, cancellation or archiving, in
-- the statement that made the change; nothing else writes them. Measured
-- (docs/performance.md, 2026-11-27 20:00): a check's search 8 buffers against 86,
-- exclusion checks 8.7 % of a loaded create's Postgres samples against 23.2 %, and
-- pgbench creates 1.02-1.11 x as fast with the history, 1.00-1.08 x empty.
--
-- What stays as it was:
-- - The name `booking_slot_excl`, DEFERRABLE: `SET CONSTRAINTS booking_slot_excl,
--   booking_archived_excl DEFERRED` (slot moves: the trigger deletes and re-inserts a
--   moved booking's rows, checked at commit) and the API's refusal by constraint name.
-- - Archived bookings are not in it, and `booking_archived_excl` still checks a live
--   booking that starts before the archive horizon against them, under the same
--   advisory lock against the archiving job (migration 20261201000100).
-- - A model renamed keeps its id: its bookings' rows are rewritten by the trigger as
--   the rename cascades, with the same keys.
ALTER TABLE gpu_model ADD COLUMN id integer GENERATED ALWAYS AS IDENTITY;
ALTER TABLE gpu_model ADD CONSTRAINT gpu_model_id_key UNIQUE (id);

ALTER TABLE booking DROP CONSTRAINT booking_slot_excl;

CREATE TABLE booking_unit (
    booking_id bigint NOT NULL,
    -- gpu_model.id in the high 32 bits, the unit (a slot, >= 0) in the low ones.
    unit_key bigint NOT NULL,
    period tstzrange NOT NULL,
    -- Also what the trigger deletes a changed booking's rows by.
    PRIMARY KEY (booking_id, unit_key),
    CONSTRAINT booking_slot_excl EXCLUDE USING gist (unit_key WITH =, period WITH &&) DEFERRABLE
);

CREATE FUNCTION booking_unit_key(p_model_id integer, p_unit integer) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (p_model_id::bigint << 32) | p_unit;

CREATE FUNCTION booking_unit_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.cancelled_at IS NULL AND NOT OLD.archived THEN
        DELETE FROM booking_unit WHERE booking_id = OLD.id;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.cancelled_at IS NULL AND NOT NEW.archived THEN
        INSERT INTO booking_unit (booking_id, unit_key, period)
        SELECT NEW.id, booking_unit_key(m.id, s), NEW.period
        FROM gpu_model m, unnest(NEW.slots) AS s
        WHERE m.name = NEW.model;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER booking_unit_sync
    AFTER INSERT OR DELETE OR UPDATE OF start_at, end_at, model, slots, cancelled_at, archived ON booking
    FOR EACH ROW EXECUTE FUNCTION booking_unit_sync();

CREATE FUNCTION booking_unit_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE booking_unit;
    RETURN NULL;
END
$$;

CREATE TRIGGER booking_unit_truncate AFTER TRUNCATE ON booking
    FOR EACH STATEMENT EXECUTE FUNCTION booking_unit_truncate();

INSERT INTO booking_unit (booking_id, unit_key, period)
SELECT b.id, booking_unit_key(m.id, s), b.period
FROM booking b JOIN gpu_model m ON m.name = b.model, unnest(b.slots) AS s
WHERE b.cancelled_at IS NULL AND NOT b.archived;
