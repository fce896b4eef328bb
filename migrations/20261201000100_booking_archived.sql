-- Bookings that ended long ago leave the exclusion constraints' indexes.
--
-- Why: a create's own insert is what grows with history. Each insert walks and
-- extends the GiST indexes of `booking_slot_excl` and `booking_user_excl`, and those
-- held every booking ever made (cancelled ones aside): with the history bench's
-- 1.15 M bookings, 585 MB and 110 MB against 128 MB of shared buffers. pgbench, one
-- booking inserted per transaction with every trigger and constraint
-- (scripts/pgbench/booking_insert.sql, docs/performance.md): 0.66-0.71 of the rate on
-- a small table, and 1.0 with the two constraints dropped. No create can overlap a
-- booking that ended before it starts, and creates start now or later, so the
-- constraints only need what has not ended long ago.
--
-- How, without giving up the backstop:
-- - `archived`: set only by the archiving job (booking-api/src/store/archive.rs), in
--   an update that changes nothing else, for bookings that ended at or before the
--   horizon (`booking_archive_horizon`, which only moves forward). Both constraints'
--   predicates leave archived bookings out, so their indexes hold the planned and
--   recent bookings only, however long the history.
-- - `booking_archived_normal` (BEFORE): a booking stays archived only while it is as
--   the job left it. An insert, or an update of its window, model, slots or user,
--   brings it back into the constraints, where it is checked like any other.
-- - `booking_archived_excl` (a constraint trigger, deferrable with the slot
--   constraint for slot moves): a live booking that starts before the horizon could
--   overlap an archived one, which the constraints no longer see; it is checked
--   against the archived bookings by the other indexes and refused with the
--   constraint's own name (an admin's back-dated override, or a past booking's slot
--   moved). Bookings that start at or after the horizon cannot overlap an archived
--   one (archived ones end at or before it), which is every ordinary create.
-- - The race: a booking inserted while the job archives the one it overlaps. Its
--   constraint check waits for the job's transaction, then finds the old row gone
--   and the new one outside the index; the check trigger runs after it, sees the
--   job's work and refuses the booking. Deferred (slot moves), the constraint's
--   recheck and this trigger run at commit, in either order, so the trigger also
--   takes advisory lock (7265, 0) shared until its transaction ends, and the job
--   takes it exclusive: the job cannot archive between the two. The job skips
--   bookings another transaction has locked.
--
-- The locked reads of creates, changes and the waitlist read by the other indexes,
-- so the rules (cooldown, capacity, one booking at a time) still see archived
-- bookings.
ALTER TABLE booking ADD COLUMN archived boolean NOT NULL DEFAULT false;
-- Made again at the end, without archived bookings; dropped first so that archiving
-- an existing history below is not also written into their indexes (the table is
-- locked for the whole migration: nothing else is written meanwhile).
ALTER TABLE booking DROP CONSTRAINT booking_slot_excl, DROP CONSTRAINT booking_user_excl;

-- Every archived booking ended at or before `at` (one row).
CREATE TABLE booking_archive_horizon (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    at  timestamptz NOT NULL
);

-- Upgrading a database with history: what ended more than a day ago (the default of
-- `--archive-after`) is archived here, before the triggers and the constraints are
-- made. The constraints' new indexes still take space for the rows' old versions
-- (this transaction's own, which VACUUM removes after it): they work at their new
-- size once VACUUM has run, and shrink on disk with a REINDEX (docs/deploy.md,
-- docs/performance.md). Nothing is archived in a new database.
UPDATE booking SET archived = true WHERE cancelled_at IS NULL AND end_at <= now() - interval '1 day';
INSERT INTO booking_archive_horizon (at)
SELECT COALESCE(max(end_at), '-infinity') FROM booking WHERE archived;

-- What the job looks for: live bookings not archived yet, by end. It holds the
-- planned and recent bookings only.
CREATE INDEX booking_archivable_idx ON booking (end_at) WHERE cancelled_at IS NULL AND NOT archived;

-- A user's live bookings, past ones included (the create's read of its user's
-- bookings, the rules' reads): `booking_user_excl`'s index served these while it
-- held every live booking. Without one of their own, Postgres plans them on an empty
-- table through `booking_model_period_idx`, filtering by user (a walk of every live
-- booking), and a connection keeps that generic plan until the table's statistics
-- change: the history bench's creates on an empty table ran at 0.11 x bare INSERT
-- with that plan, 0.15 with this index, 0.18-0.20 before this migration.
CREATE INDEX booking_user_live_idx ON booking (user_name, start_at) WHERE cancelled_at IS NULL;

CREATE FUNCTION booking_archived_normal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT'
       OR (NEW.start_at, NEW.end_at, NEW.model, NEW.slots, NEW.user_name)
          IS DISTINCT FROM (OLD.start_at, OLD.end_at, OLD.model, OLD.slots, OLD.user_name)
       OR NEW.end_at > (SELECT at FROM booking_archive_horizon) THEN
        NEW.archived := false;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER booking_archived_normal BEFORE INSERT OR UPDATE ON booking
    FOR EACH ROW WHEN (NEW.archived) EXECUTE FUNCTION booking_archived_normal();

CREATE FUNCTION booking_archived_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_horizon timestamptz;
    b booking%ROWTYPE;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(7265, 0);
    SELECT at INTO v_horizon FROM booking_archive_horizon;
    IF NEW.start_at >= v_horizon THEN
        RETURN NULL;
    END IF;
    -- Deferred, the row may have changed since this event: check it as it is now.
    SELECT * INTO b FROM booking WHERE id = NEW.id;
    IF NOT FOUND OR b.cancelled_at IS NOT NULL OR b.archived OR b.start_at >= v_horizon THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM booking o
               WHERE o.model = b.model AND o.cancelled_at IS NULL AND o.period && b.period
                 AND o.archived AND o.slots && b.slots AND o.id <> b.id) THEN
        RAISE EXCEPTION 'conflicting key value violates exclusion constraint "booking_slot_excl"'
            USING ERRCODE = 'exclusion_violation', CONSTRAINT = 'booking_slot_excl', TABLE = 'booking',
                  DETAIL = format('Booking %s holds a unit of %s that an archived booking held then.', b.id, b.model);
    END IF;
    IF EXISTS (SELECT 1 FROM booking o
               WHERE o.user_name = b.user_name AND o.start_at < b.end_at AND o.end_at > b.start_at
                 AND o.cancelled_at IS NULL AND o.archived AND o.id <> b.id) THEN
        RAISE EXCEPTION 'conflicting key value violates exclusion constraint "booking_user_excl"'
            USING ERRCODE = 'exclusion_violation', CONSTRAINT = 'booking_user_excl', TABLE = 'booking',
                  DETAIL = format('Booking %s overlaps an archived booking of the same user.', b.id);
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER booking_archived_excl
    AFTER INSERT OR UPDATE OF start_at, end_at, model, slots, user_name, cancelled_at, archived ON booking
    DEFERRABLE INITIALLY IMMEDIATE
    FOR EACH ROW WHEN (NEW.cancelled_at IS NULL AND NOT NEW.archived)
    EXECUTE FUNCTION booking_archived_check();

ALTER TABLE booking
    ADD CONSTRAINT booking_slot_excl EXCLUDE USING gist (period WITH &&, model WITH =, slots gist__intbig_ops WITH &&)
        WHERE (cancelled_at IS NULL AND NOT archived) DEFERRABLE,
    ADD CONSTRAINT booking_user_excl EXCLUDE USING gist (user_name WITH =, period WITH &&)
        WHERE (cancelled_at IS NULL AND NOT archived);

-- One pass of the job: archives the live bookings that ended after the horizon and
-- at or before `p_before`, at most about `p_batch` of them (all that end at the
-- batch's last end, so the horizon can move to it), moving the horizon first, and up
-- to `p_batch` that ended before the horizon and are not archived (a past booking
-- imported or moved after the horizon passed it, or one skipped before). Returns how
-- many it archived; fewer than `p_batch` means none are left. The boundary is read
-- above the horizon only, where no archived booking's index entry lies, so that a
-- long run's passes do not each walk the entries of the ones before (until VACUUM
-- removes them). Bookings that another transaction holds are skipped, not waited
-- for: a later pass takes them.
CREATE FUNCTION booking_archive_pass(p_before timestamptz, p_batch integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_from timestamptz;
    v_upto timestamptz;
    v_count bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(7265, 0);
    SELECT at INTO v_from FROM booking_archive_horizon;
    SELECT end_at INTO v_upto FROM booking
        WHERE cancelled_at IS NULL AND NOT archived AND end_at > v_from AND end_at <= p_before
        ORDER BY end_at OFFSET greatest(p_batch, 1) - 1 LIMIT 1;
    v_upto := greatest(v_from, COALESCE(v_upto, p_before));
    UPDATE booking_archive_horizon SET at = v_upto;
    WITH below AS (
        SELECT id FROM booking
        WHERE cancelled_at IS NULL AND NOT archived AND end_at <= v_from
        LIMIT greatest(p_batch, 1) FOR UPDATE SKIP LOCKED
    ), above AS (
        SELECT id FROM booking
        WHERE cancelled_at IS NULL AND NOT archived AND end_at > v_from AND end_at <= v_upto
        FOR UPDATE SKIP LOCKED
    )
    UPDATE booking b SET archived = true
    WHERE b.id IN (SELECT id FROM below UNION ALL SELECT id FROM above);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;
