-- The change log records a move of any of a booking's units. Its trigger compared
-- `slot`, the first of `slots`: a multi-unit booking whose later units moved (a
-- create's replan moves planned bookings to other units) wrote no change, and a
-- follower kept the old `slots`. Everything else is as in migration
-- 20261125000600.
CREATE OR REPLACE FUNCTION booking_change_record() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_kind text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        v_kind := 'created';
    ELSIF NEW.cancelled_at IS DISTINCT FROM OLD.cancelled_at THEN
        v_kind := 'cancelled';
    ELSIF NEW.ended_early_at IS DISTINCT FROM OLD.ended_early_at THEN
        v_kind := 'ended_early';
    ELSIF NEW.end_at IS DISTINCT FROM OLD.end_at OR NEW.start_at IS DISTINCT FROM OLD.start_at THEN
        v_kind := 'moved';
    ELSIF NEW.slots IS DISTINCT FROM OLD.slots OR NEW.model IS DISTINCT FROM OLD.model THEN
        v_kind := 'updated';
    ELSE
        -- Nothing a follower sees changed (e.g. only updated_at, or `archived`).
        RETURN NULL;
    END IF;
    INSERT INTO booking_change (booking_id, kind) VALUES (NEW.id, v_kind);
    RETURN NULL;
END
$$;
