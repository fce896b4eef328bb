-- Units held by no person: maintenance windows and course reservations.
--
-- Why booking rows: capacity is decided from the model's bookings (the create's
-- locked reads, the day rows `booking_day_units`, the slot constraint
-- `booking_slot_excl` on `booking_unit`, and `capacity::replan`, which moves
-- planned bookings to other units). Anything that holds units must be seen by all
-- of them, or a replan would move a planned booking onto its unit. So a maintenance
-- window is one booking row, and each occurrence of a course reservation is one,
-- of `units` units, created with the rules overridden; the triggers, the
-- constraints and every read of capacity count them as they count bookings.
--
-- Whose: each hold has a user of its own (`unit_hold.user_name`), whose name starts
-- with a space (core::holds::user_name). No real user can have it
-- (core::username::Username refuses surrounding white space, and so does
-- JupyterHub), its slugs are the name itself (a label slug holds no space, so no pod
-- label finds it, and it makes no slug ambiguous), and it has no `user_key` rows.
-- Its bookings never overlap each other (one user, `booking_user_excl`): a
-- reservation whose occurrences would overlap is refused before it is written.
--
-- `booking.hold_id` marks a hold's rows: readers that mean people (reminders,
-- no-shows, the usage report) leave them out by it.
CREATE TABLE unit_hold (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('maintenance', 'course')),
    model       text NOT NULL REFERENCES gpu_model (name) ON UPDATE CASCADE,
    -- A booking row holds at most 64 units (booking_units_check).
    units       integer NOT NULL CHECK (units BETWEEN 1 AND 64),
    -- The reason of a maintenance window, the title of a course ("ML101 lab session").
    title       text NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
    -- The course's group (lab_group, migration 20261213000100): its members' pods get
    -- the occurrence's units. A group removed leaves its reservations holding units
    -- for nobody until they are removed.
    group_id    integer REFERENCES lab_group (id) ON DELETE SET NULL,
    -- A course's schedule as given: the RFC 5545 rule (without DTSTART), the time
    -- zone its wall-clock times are in, and the first occurrence's wall-clock start
    -- and end (core::recurrence).
    rrule       text CHECK (length(rrule) <= 1000),
    time_zone   text,
    local_start timestamp,
    local_end   timestamp,
    -- Occurrences left out when it was created (in the past, or in conflict where
    -- the creator chose to skip conflicts), by their start.
    skipped     timestamptz[] NOT NULL DEFAULT '{}',
    -- The hold's own user (see above); written with the hold.
    user_name   text UNIQUE REFERENCES app_user (name),
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL,
    -- Removed (DELETE): its rows not yet ended were cancelled or ended with it.
    removed_at  timestamptz,
    CONSTRAINT unit_hold_course_check CHECK (
        kind <> 'course'
        OR (rrule IS NOT NULL AND time_zone IS NOT NULL AND local_start IS NOT NULL
            AND local_end IS NOT NULL AND local_start < local_end))
);
CREATE INDEX unit_hold_model_idx ON unit_hold (model) WHERE removed_at IS NULL;

ALTER TABLE booking ADD COLUMN hold_id bigint REFERENCES unit_hold (id);
-- A hold's rows (its occurrences, in order), and the foreign key's look-ups.
CREATE INDEX booking_hold_idx ON booking (hold_id, start_at) WHERE hold_id IS NOT NULL;
