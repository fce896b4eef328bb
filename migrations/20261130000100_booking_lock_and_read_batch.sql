-- Creates that arrive together are decided under one transaction's locks (the
-- service's create queue, booking-api/src/create_queue.rs): the locks of every
-- create in the batch, taken in one global order, then each create's reads.
--
-- The order is the one every other locker keeps: all users' locks, then all models'
-- locks, then all days' locks, each class by ascending key. A single create takes one
-- of each class in that order (booking_lock_days); cancels and changes take a user's
-- and then a model's (booking_lock); the waitlist its users and then the model. No
-- two lockers can therefore wait for each other in a cycle.
--
-- A model is locked exclusive when any create of the batch on it has a window of 31
-- days or more (not kept per day: booking_counted_by_day), shared otherwise, as
-- booking_lock_days does for one create. With every lock held, each create's reads
-- are those of booking_lock_and_read, whose own lock calls then find the locks held
-- (advisory locks are re-entrant within a transaction) and wait for nothing.
CREATE FUNCTION booking_lock_and_read_batch(p_users text[], p_models text[], p_starts timestamptz[], p_ends timestamptz[])
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
       OR cardinality(p_users) IS DISTINCT FROM cardinality(p_ends) THEN
        RAISE EXCEPTION 'booking_lock_and_read_batch: the four arrays must be of one length';
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
        RETURN QUERY SELECT i, r.* FROM booking_lock_and_read(p_users[i], p_models[i], p_starts[i], p_ends[i]) AS r;
    END LOOP;
END
$$;
