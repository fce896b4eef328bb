-- Lock only what conflicts. Until now every create on a model took
-- the model's row lock, so creates on one model ran one at a time whatever their
-- windows. Now a create locks the model's days that its window touches, so that
-- creates whose windows share no day run at once:
--
--   1. the user's lock (7262, hashtext(user)), as before: the rules about the user's
--      own bookings (overlap, one active, one planned, cooldown, durations);
--   2. the model's lock (7264, hashtext(model)), SHARED: creates on one model do not
--      wait for each other here; what needs the whole model (a change of a
--      booking's window, slot moves, a waitlist pass, a change of the model's units)
--      takes it EXCLUSIVE and so waits for every create on the model, and they for it;
--   3. one lock per UTC day of the window, [start, end), in ascending order (single
--      bigint keys: hashtext(model) in the high 32 bits, the day since 1970 in the low
--      ones): capacity and the slots over a window depend only on the model's bookings
--      that overlap it, and two windows that overlap share a day. A window of more
--      than 31 days (an admin's override) takes the model's lock exclusive instead, so
--      that one transaction never holds hundreds of locks.
--
-- Always in this order (user, model, days ascending), so no two transactions wait on
-- each other in a cycle. The create's reads come after the locks in the same VOLATILE
-- plpgsql function: each of its statements takes a new snapshot, so they see what
-- the previous holder of any of these locks committed (migration 20261122000002).
-- The exclusion constraints stay the backstop.
--
-- A create that finds its window fits by count but needs planned bookings moved to
-- other units (capacity::replan) would change bookings outside its days: it does
-- not do that under day locks; the service starts it again under the exclusive
-- model lock (booking-api/src/store/bookings.rs).

-- The lock of one model-day.
CREATE FUNCTION booking_day_key(p_model text, p_day integer) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT (hashtext(p_model)::bigint << 32) | p_day::bigint
$$;

-- The UTC day (since 1970-01-01) of an instant.
CREATE FUNCTION booking_day(p_at timestamptz) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT floor(extract(epoch FROM p_at) / 86400)::integer
$$;

-- The whole model: the user's lock, then the model's lock exclusive. For changes of
-- a booking's window and whatever moves slots. Returns the model's units (NULL: no
-- such model; the locks are still taken).
CREATE OR REPLACE FUNCTION booking_lock(p_user text, p_model text) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_units integer;
BEGIN
    PERFORM pg_advisory_xact_lock(7262, hashtext(p_user));
    PERFORM pg_advisory_xact_lock(7264, hashtext(p_model));
    SELECT m.units INTO v_units FROM gpu_model m WHERE m.name = p_model;
    RETURN v_units;
END
$$;

-- A create's locks: the user's, the model's shared, the window's days (or the model's
-- exclusive for a window of more than 31 days). Returns the model's units.
CREATE FUNCTION booking_lock_days(p_user text, p_model text, p_start timestamptz, p_end timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_units integer;
    v_first integer := booking_day(p_start);
    -- The day of the window's last instant (half-open: an end at midnight does not
    -- touch the next day).
    v_last integer := booking_day(p_end - interval '1 microsecond');
    v_day integer;
BEGIN
    PERFORM pg_advisory_xact_lock(7262, hashtext(p_user));
    IF v_last - v_first >= 31 OR v_last < v_first THEN
        PERFORM pg_advisory_xact_lock(7264, hashtext(p_model));
    ELSE
        PERFORM pg_advisory_xact_lock_shared(7264, hashtext(p_model));
        FOR v_day IN v_first .. v_last LOOP
            PERFORM pg_advisory_xact_lock(booking_day_key(p_model, v_day));
        END LOOP;
    END IF;
    SELECT m.units INTO v_units FROM gpu_model m WHERE m.name = p_model;
    RETURN v_units;
END
$$;

-- Cancelling or ending early only frees units: a create that read the booking as
-- still held decided as if fewer units were free, never more. So it takes the user's
-- lock (the cooldown counts from an early end) and the model's lock shared (what
-- takes the whole model sees no booking change under it), no day.
CREATE FUNCTION booking_lock_release(p_user text, p_model text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(7262, hashtext(p_user));
    PERFORM pg_advisory_xact_lock_shared(7264, hashtext(p_model));
END
$$;

-- The create's locks and reads: as in migration 20261124000040, under the day locks.
CREATE OR REPLACE FUNCTION booking_lock_and_read(p_user text, p_model text, p_start timestamptz, p_end timestamptz)
RETURNS TABLE (o_kind text, o_id bigint, o_start timestamptz, o_end timestamptz, o_slot integer, o_slots integer[])
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_units integer;
BEGIN
    v_units := booking_lock_days(p_user, p_model, p_start, p_end);
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

-- The waitlist pass (migration 20261124000070): the model's lock exclusive where it
-- took the model's row lock.
CREATE OR REPLACE FUNCTION waitlist_lock(p_model text, p_limit integer)
RETURNS TABLE (o_user text, o_units integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_users text[];
    v_user text;
    v_units integer;
BEGIN
    PERFORM pg_advisory_xact_lock(7263, hashtext(p_model));
    SELECT array_agg(u ORDER BY hashtext(u), u) INTO v_users FROM (
        SELECT DISTINCT e.user_name AS u FROM waitlist_entry e
        WHERE e.model = p_model AND e.state = 'waiting'
        ORDER BY 1 LIMIT p_limit
    ) s;
    IF v_users IS NULL THEN
        RETURN;
    END IF;
    FOREACH v_user IN ARRAY v_users LOOP
        PERFORM pg_advisory_xact_lock(7262, hashtext(v_user));
    END LOOP;
    PERFORM pg_advisory_xact_lock(7264, hashtext(p_model));
    SELECT m.units INTO v_units FROM gpu_model m WHERE m.name = p_model;
    IF v_units IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT x, v_units FROM unnest(v_users) AS x;
END
$$;

-- Reads that must not grow with history. The exclusion constraints' GiST
-- indexes hold only bookings that are not cancelled, and GiST cannot serve
-- `user_name = ANY(...)` or an order: listing a user's bookings, or a model's over a
-- window (cancelled ones included), read the whole table. Two btree indexes, paid
-- on each create (two index entries), serve them: by user newest first, and by model
-- from a time on (a window's bookings end after its start).
CREATE INDEX booking_user_start_idx ON booking (user_name, start_at);
CREATE INDEX booking_model_end_idx ON booking (model, end_at);
