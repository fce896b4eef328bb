-- A create reads its user's bookings that can matter to the rules, not the user's
-- whole history (no read that grows with history).
--
-- Why: `booking_lock_and_read` read every booking the user ever made that was not
-- cancelled (`booking_user_live_idx`, by user and start), each fetched from the
-- table: a returning user's create read all of their past bookings, ten at the
-- history bench's scale (1,000,000 bookings of 100,000 users), hundreds for a user
-- who books daily for years, on as many table pages. The rules look only at
-- bookings that end after the new window's start (or now, if earlier) less the
-- cooldown (`core::rules::own_bookings_from`, whose bound
-- `core/tests/rules_model.rs` composes with the rules against its reference).
--
-- How: the caller passes that instant per create (`p_own_from`), the read takes the
-- user's bookings that end after it, and `booking_user_live_idx` is keyed by user and
-- end so that it finds just those (the other reads of a user's live bookings list
-- them whole or bound them by end as well; `booking_user_start_idx` still orders a
-- user's bookings by start). Same number of index entries per create as before.
DROP FUNCTION booking_lock_and_read_batch(text[], text[], timestamptz[], timestamptz[]);
DROP FUNCTION booking_lock_and_read(text, text, timestamptz, timestamptz);
DROP INDEX booking_user_live_idx;
CREATE INDEX booking_user_live_idx ON booking (user_name, end_at) WHERE cancelled_at IS NULL;

CREATE FUNCTION booking_lock_and_read(p_user text, p_model text, p_start timestamptz, p_end timestamptz, p_own_from timestamptz)
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
    RETURN QUERY SELECT 'o'::text, b.id, b.start_at, b.end_at, b.slot, b.slots FROM booking b
        WHERE b.model = p_model AND b.cancelled_at IS NULL
          AND b.period && tstzrange(p_start, p_end, '[)');
END
$$;

CREATE FUNCTION booking_lock_and_read_batch(p_users text[], p_models text[], p_starts timestamptz[], p_ends timestamptz[], p_own_from timestamptz[])
RETURNS TABLE (o_req integer, o_kind text, o_id bigint, o_start timestamptz, o_end timestamptz, o_slot integer, o_slots integer[])
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_key integer;
    v_exclusive boolean;
    v_day bigint;
BEGIN
    IF cardinality(p_users) IS DISTINCT FROM cardinality(p_models)
       OR cardinality(p_users) IS DISTINCT FROM cardinality(p_starts)
       OR cardinality(p_users) IS DISTINCT FROM cardinality(p_ends)
       OR cardinality(p_users) IS DISTINCT FROM cardinality(p_own_from) THEN
        RAISE EXCEPTION 'booking_lock_and_read_batch: the five arrays must be of one length';
    END IF;
    FOR v_key IN SELECT DISTINCT hashtext(u) FROM unnest(p_users) AS u ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(7262, v_key);
    END LOOP;
    FOR v_key, v_exclusive IN
        SELECT hashtext(r.m), bool_or(NOT booking_counted_by_day(r.s, r.e))
        FROM unnest(p_models, p_starts, p_ends) AS r(m, s, e)
        GROUP BY 1 ORDER BY 1
    LOOP
        IF v_exclusive THEN
            PERFORM pg_advisory_xact_lock(7264, v_key);
        ELSE
            PERFORM pg_advisory_xact_lock_shared(7264, v_key);
        END IF;
    END LOOP;
    -- Only windows kept per day have day locks (a longer one holds its model
    -- exclusive); they are filtered before their days are listed.
    FOR v_day IN
        SELECT DISTINCT booking_day_key(r.m, d)
        FROM (SELECT * FROM unnest(p_models, p_starts, p_ends) AS x(m, s, e)
              WHERE booking_counted_by_day(x.s, x.e) OFFSET 0) AS r,
             generate_series(booking_day(r.s), booking_day(r.e - interval '1 microsecond')) AS d
        ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(v_day);
    END LOOP;
    FOR i IN 1 .. coalesce(cardinality(p_users), 0) LOOP
        RETURN QUERY SELECT i, r.* FROM booking_lock_and_read(p_users[i], p_models[i], p_starts[i], p_ends[i], p_own_from[i]) AS r;
    END LOOP;
END
$$;
