-- The booking change stream (`GET /api/v1/booking-changes`): every change to a
-- booking (created, cancelled, ended early, end moved, slot moved), by anyone,
-- recorded by a trigger in the transaction that makes the change, so that it
-- cannot be lost or recorded for a change that rolled back.
--
-- Followers resume by transaction, not by `seq`: `seq` is taken at insert, but
-- transactions commit out of order, so a follower that has read seq 10 could miss
-- seq 9 committing later. `txid` is the writer's transaction id (xid8 as bigint:
-- 64 bits, never wraps). A reader serves only changes of transactions below
-- `pg_snapshot_xmin(pg_current_snapshot())`, all of which have finished (their rows
-- are visible, or they rolled back), and no transaction that starts later can get
-- an id below it; followers resume from the last transaction they were served.
CREATE TABLE booking_change (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    txid       bigint NOT NULL DEFAULT (pg_current_xact_id()::text::bigint),
    booking_id bigint NOT NULL,
    kind       text NOT NULL,
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX booking_change_txid_idx ON booking_change (txid, seq);
CREATE INDEX booking_change_at_idx ON booking_change (at);

-- The newest transaction whose changes retention has pruned (one row): a follower
-- resuming from before it may have missed changes and must re-list (410 Gone).
CREATE TABLE booking_change_horizon (
    one   boolean PRIMARY KEY DEFAULT true CHECK (one),
    txid  bigint NOT NULL
);
INSERT INTO booking_change_horizon (txid) VALUES (0);

CREATE FUNCTION booking_change_record() RETURNS trigger LANGUAGE plpgsql AS $$
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
    -- Delivered at commit (and only then); several in one transaction fold into one.
    PERFORM pg_notify('booking_change', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER booking_change_after AFTER INSERT OR UPDATE ON booking
    FOR EACH ROW EXECUTE FUNCTION booking_change_record();
