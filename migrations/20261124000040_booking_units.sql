-- A booking is for N GPUs: `units` of its model, each held as a
-- slot, so that the exclusion constraint still makes overbooking impossible
-- whatever the application does. The slots need not be adjacent: adjacent ones
-- would fragment (a 2-unit booking refused with two units free), while any set
-- of slots keeps "fits by count" equal to "gets slots" (capacity::replan).
--
-- `slots` (ascending, distinct, one per unit) is what a booking holds; `slot` stays
-- as its first, for the API and readers that knew single-unit bookings. The
-- constraint compares slot sets with intarray's GiST `&&` (overlap) operator class.
CREATE EXTENSION IF NOT EXISTS intarray;

ALTER TABLE booking ADD COLUMN units integer NOT NULL DEFAULT 1;
ALTER TABLE booking ADD COLUMN slots integer[];
UPDATE booking SET slots = ARRAY[slot];
ALTER TABLE booking
    ALTER COLUMN slots SET NOT NULL,
    DROP CONSTRAINT booking_slot_excl,
    DROP COLUMN slot;
ALTER TABLE booking
    ADD COLUMN slot integer GENERATED ALWAYS AS (slots[1]) STORED,
    ADD CONSTRAINT booking_units_check CHECK (units BETWEEN 1 AND 64),
    -- One distinct slot per unit, ascending, none negative (uniq/sort: intarray).
    ADD CONSTRAINT booking_slots_check
        CHECK (cardinality(slots) = units AND slots = uniq(sort_asc(slots)) AND slots[1] >= 0),
    -- The backstop against overbooking: no unit of a model held by two bookings at
    -- once. Same name as before, so that `SET CONSTRAINTS booking_slot_excl DEFERRED`
    -- and the API's refusal for it keep working.
    ADD CONSTRAINT booking_slot_excl EXCLUDE USING gist (period WITH &&, model WITH =, slots gist__int_ops WITH &&)
        WHERE (cancelled_at IS NULL) DEFERRABLE;

-- The create's read (migration 20261122000002), with each booking's units and
-- slots: o_slot of the 'm' row is still the model's units.
DROP FUNCTION booking_lock_and_read(text, text, timestamptz, timestamptz);
CREATE FUNCTION booking_lock_and_read(p_user text, p_model text, p_start timestamptz, p_end timestamptz)
RETURNS TABLE (o_kind text, o_id bigint, o_start timestamptz, o_end timestamptz, o_slot integer, o_slots integer[])
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_units integer;
BEGIN
    v_units := booking_lock(p_user, p_model);
    IF v_units IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT 'm'::text, NULL::bigint, NULL::timestamptz, NULL::timestamptz, v_units, NULL::integer[];
    RETURN QUERY SELECT 'u'::text, b.id, b.start_at, b.end_at, b.slot, b.slots FROM booking b
        WHERE b.user_name = p_user AND b.cancelled_at IS NULL;
    RETURN QUERY SELECT 'o'::text, b.id, b.start_at, b.end_at, b.slot, b.slots FROM booking b
        WHERE b.model = p_model AND b.cancelled_at IS NULL
          AND b.period && tstzrange(p_start, p_end, '[)');
END
$$;

-- What the controller counted: the units each active booking's high-priority pods
-- hold now (replaced whole on every report), so that the webhook can tell a pod
-- within its booking's units from one beyond them.
CREATE TABLE booking_held (
    booking_id  bigint PRIMARY KEY REFERENCES booking (id),
    units       integer NOT NULL CHECK (units >= 0),
    reported_at timestamptz NOT NULL
);
