-- The waitlist: "book me the first window of `duration` on
-- `model`, starting from `not_before` and no later than `latest_start`". Entries of a
-- model are served in the order of `id` (first come, first served). An entry turns
-- into a booking at most once: the promotion updates it `WHERE state = 'waiting'`
-- under the user's and the model's locks, in the transaction that creates the
-- booking, and `booking_id` is unique besides.
CREATE TABLE waitlist_entry (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_name    text NOT NULL CHECK (length(user_name) BETWEEN 1 AND 256),
    model        text NOT NULL REFERENCES gpu_model (name) ON UPDATE CASCADE ON DELETE CASCADE,
    not_before   timestamptz NOT NULL,
    latest_start timestamptz NOT NULL,
    duration_s   bigint NOT NULL CHECK (duration_s > 0),
    state        text NOT NULL DEFAULT 'waiting'
                 CHECK (state IN ('waiting', 'booked', 'cancelled', 'expired')),
    booking_id   bigint UNIQUE REFERENCES booking (id),
    created_by   text NOT NULL,
    created_at   timestamptz NOT NULL,
    resolved_at  timestamptz,
    CONSTRAINT waitlist_entry_span_check CHECK (not_before <= latest_start),
    CONSTRAINT waitlist_entry_booked_check CHECK ((state = 'booked') = (booking_id IS NOT NULL)),
    CONSTRAINT waitlist_entry_resolved_check CHECK ((state = 'waiting') = (resolved_at IS NULL))
);
-- One waiting entry per user and model: the waitlist stays bounded by users × models.
CREATE UNIQUE INDEX waitlist_entry_one_waiting ON waitlist_entry (user_name, model)
    WHERE state = 'waiting';
-- The queue of a model, in order.
CREATE INDEX waitlist_entry_queue ON waitlist_entry (model, id) WHERE state = 'waiting';
CREATE INDEX waitlist_entry_user ON waitlist_entry (user_name, id);

-- Calendar feed tokens: one per user, kept only as its SHA-256,
-- so that the table does not hold a usable secret. Re-issuing replaces the row;
-- revoking deletes it.
CREATE TABLE feed_token (
    user_name    text PRIMARY KEY CHECK (length(user_name) BETWEEN 1 AND 256),
    token_sha256 bytea NOT NULL UNIQUE CHECK (length(token_sha256) = 32),
    created_at   timestamptz NOT NULL
);

-- The locks of one waitlist pass over a model (booking-api/src/store/waitlist.rs):
-- the model's promotion lock (key space 7263, taken only here, so that two passes over
-- one model run one after the other and entries are served in order), then the
-- advisory lock of each waiting user (booking_lock's key space 7262) in the order of
-- their keys, so that two passes never wait on each other in a cycle, then the model's
-- row lock: for each user, the order of booking_lock. Returns the users locked, each
-- with the model's units; nothing when the model is gone.
CREATE FUNCTION waitlist_lock(p_model text, p_limit integer)
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
    SELECT m.units INTO v_units FROM gpu_model m WHERE m.name = p_model FOR UPDATE;
    IF v_units IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT x, v_units FROM unnest(v_users) AS x;
END
$$;
