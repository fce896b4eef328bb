-- Booked versus used: what each booking's pods did, as spans.
--
-- `held`: a span while the booking's high-priority pods held `units` GPUs, opened and
-- closed from the controller's held-units reports (`until` NULL: held now).
-- `active`: a span of GPU activity of those pods, from the last-activity times the
-- node agent annotates and the controller passes on; each observation covers
-- [at, at + resolution), and observations that touch merge into one span.
--
-- Growth is bounded by pod starts and bursts of activity, not by time; spans older
-- than the retention (`--usage-retention`) are deleted by the notice worker's rounds.
CREATE TABLE booking_use (
    booking_id bigint NOT NULL REFERENCES booking (id) ON DELETE CASCADE,
    kind       text NOT NULL CHECK (kind IN ('held', 'active')),
    units      integer NOT NULL CHECK (units > 0),
    since      timestamptz NOT NULL,
    until      timestamptz,
    PRIMARY KEY (booking_id, kind, since),
    CONSTRAINT booking_use_order CHECK (until IS NULL OR until >= since),
    CONSTRAINT booking_use_active_closed CHECK (kind = 'held' OR until IS NOT NULL)
);
CREATE INDEX booking_use_until_idx ON booking_use (until);
-- At most one open held span per booking (reports are also serialised by an
-- advisory lock; this is the backstop).
CREATE UNIQUE INDEX booking_use_open_held ON booking_use (booking_id)
    WHERE kind = 'held' AND until IS NULL;

-- Hours in a range (0 for an empty or unbounded one).
CREATE FUNCTION booking_use_hours(r tstzrange) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN isempty(r) OR lower_inf(r) OR upper_inf(r) THEN 0
                ELSE extract(epoch FROM upper(r) - lower(r)) / 3600.0 END
$$;
