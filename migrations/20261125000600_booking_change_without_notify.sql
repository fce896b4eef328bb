-- The change log's trigger no longer sends NOTIFY. A transaction that notifies takes,
-- at commit, a database-wide lock that every other notifying transaction waits for, so
-- booking writes committed one at a time: with pgbench at 32 clients a whole create ran
-- at 181 transactions/s with the NOTIFY and 428 without (docs/performance.md). Each API
-- process now looks for new or newly servable changes every 100 ms while a long poll
-- waits (booking-api/src/store/changes.rs, `WATCH_EVERY`).
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
    ELSIF NEW.slot IS DISTINCT FROM OLD.slot OR NEW.model IS DISTINCT FROM OLD.model THEN
        v_kind := 'updated';
    ELSE
        -- Nothing a follower sees changed (e.g. only updated_at).
        RETURN NULL;
    END IF;
    INSERT INTO booking_change (booking_id, kind) VALUES (NEW.id, v_kind);
    RETURN NULL;
END
$$;
