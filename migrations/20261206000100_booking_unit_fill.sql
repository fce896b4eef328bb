-- The slot constraint's rows (`booking_unit`, migration 20261205000100) for the
-- bookings with an id above `p_after`: what its trigger `booking_unit_sync` writes a
-- booking at a time, in one statement, for a bulk load that switches the trigger off
-- (scripts/load-history.sql; the migration's own backfill is the same statement over
-- every booking). Rows only for bookings that are neither cancelled nor archived.
CREATE FUNCTION booking_unit_fill(p_after bigint) RETURNS void
LANGUAGE sql VOLATILE AS $$
    INSERT INTO booking_unit (booking_id, unit_key, period)
    SELECT b.id, booking_unit_key(m.id, s), b.period
    FROM booking b JOIN gpu_model m ON m.name = b.model, unnest(b.slots) AS s
    WHERE b.id > p_after AND b.cancelled_at IS NULL AND NOT b.archived;
$$;
