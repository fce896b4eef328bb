-- Groups (courses, research groups), their booking policies and their quotas.
--
-- A group's members are users as the service keys them (`app_user.name`, normalised
-- as the service compares names: lowercased unless names are case-sensitive), not a
-- foreign key: a JupyterHub group or an admin may name a user who has never booked.
--
-- Which policy applies to a user in several groups: the first of their groups in the
-- admin's order (`position` ascending, then `name`); a user in no group gets the
-- lab's policy (the service's options). Every nullable policy column inherits: a
-- per-model row (`group_model_policy`) inherits from its group's row, the group's
-- row from the lab (core::groups).
CREATE TABLE lab_group (
    id                      integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                    text NOT NULL UNIQUE
                            CHECK (name ~ '^[A-Za-z0-9]([-A-Za-z0-9._@]*[A-Za-z0-9])?$' AND length(name) <= 128),
    -- The admin's order: decides the policy of a user in several groups.
    position                integer NOT NULL DEFAULT 0,
    description             text NOT NULL DEFAULT '' CHECK (length(description) <= 1024),
    -- The policy (NULL: the lab's setting).
    min_duration_s          bigint CHECK (min_duration_s > 0 AND min_duration_s <= 315360000),
    max_duration_s          bigint CHECK (max_duration_s > 0 AND max_duration_s <= 315360000),
    cooldown_s              bigint CHECK (cooldown_s >= 0 AND cooldown_s <= 315360000),
    no_booking_while_active boolean,
    max_planned             integer CHECK (max_planned >= 0 AND max_planned <= 1000),
    max_units_per_booking   integer CHECK (max_units_per_booking BETWEEN 1 AND 64),
    max_ahead_s             bigint CHECK (max_ahead_s >= 0 AND max_ahead_s <= 315360000),
    -- Which models: off, every model the lab has except those whose
    -- group_model_policy row says `allowed = false`; on, only those whose row says
    -- `allowed = true`.
    listed_models_only      boolean NOT NULL DEFAULT false,
    -- Quotas (NULL: none). GPU-hours: unit-hours of the group's bookings per period
    -- (`month`: the calendar month in the lab's time zone; `term`: the admin's
    -- `quota_term`s, hours outside every term are not limited). Units: what the
    -- group's bookings may hold at any one instant.
    quota_gpu_hours         integer CHECK (quota_gpu_hours >= 0),
    quota_period            text NOT NULL DEFAULT 'month' CHECK (quota_period IN ('month', 'term')),
    quota_units             integer CHECK (quota_units >= 0),
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now()
);

-- A group's policy for one model (NULL columns: the group's setting).
CREATE TABLE group_model_policy (
    group_id                integer NOT NULL REFERENCES lab_group (id) ON DELETE CASCADE,
    model                   text NOT NULL REFERENCES gpu_model (name) ON UPDATE CASCADE ON DELETE CASCADE,
    allowed                 boolean NOT NULL DEFAULT true,
    min_duration_s          bigint CHECK (min_duration_s > 0 AND min_duration_s <= 315360000),
    max_duration_s          bigint CHECK (max_duration_s > 0 AND max_duration_s <= 315360000),
    cooldown_s              bigint CHECK (cooldown_s >= 0 AND cooldown_s <= 315360000),
    no_booking_while_active boolean,
    max_planned             integer CHECK (max_planned >= 0 AND max_planned <= 1000),
    max_units_per_booking   integer CHECK (max_units_per_booking BETWEEN 1 AND 64),
    max_ahead_s             bigint CHECK (max_ahead_s >= 0 AND max_ahead_s <= 315360000),
    PRIMARY KEY (group_id, model)
);

-- Who belongs to a group, and how they came to: `admin` (the API, by an admin or a
-- group owner), `oidc` (the token's groups claim when the user is seen), `hub`
-- (JupyterHub's groups, at sign-in and by the periodic refresh). A sync replaces
-- only the rows of its own source; an admin's row is never removed by a sync.
CREATE TABLE group_member (
    group_id   integer NOT NULL REFERENCES lab_group (id) ON DELETE CASCADE,
    user_name  text NOT NULL CHECK (length(user_name) BETWEEN 1 AND 256),
    role       text NOT NULL DEFAULT 'member' CHECK (role IN ('member', 'owner')),
    source     text NOT NULL DEFAULT 'admin' CHECK (source IN ('admin', 'oidc', 'hub')),
    added_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, user_name)
);
CREATE INDEX group_member_user_idx ON group_member (user_name);

-- Terms an admin defines (semesters), for groups whose quota period is `term`.
CREATE TABLE quota_term (
    id       integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name     text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 128),
    start_at timestamptz NOT NULL,
    end_at   timestamptz NOT NULL,
    CHECK (start_at < end_at),
    CONSTRAINT quota_term_excl EXCLUDE USING gist (tstzrange(start_at, end_at, '[)') WITH &&)
);

-- The group a booking counts against: the group whose policy applied when it was
-- created (NULL: none, the user was in no group, or the group is gone). Leaving the
-- group later does not move a booking's hours.
ALTER TABLE booking ADD COLUMN group_id integer REFERENCES lab_group (id) ON DELETE SET NULL;
-- Quota reads (a group's bookings that end after a period's start) and the
-- foreign key's ON DELETE; bookings of users in no group are not in it.
CREATE INDEX booking_group_end_idx ON booking (group_id, end_at) WHERE group_id IS NOT NULL;

-- The locks and reads of a batch of creates (booking_lock_and_read_batch), with
-- each create's group first: the first group in the admin's order that its user
-- belongs to (a `g` row: `o_req`, the group's id in `o_id`). The groups' locks
-- (advisory key space 7266, by id ascending) come before every other lock of the
-- global order (groups, users, models, days), so that the creates of one group's
-- members, and every other writer of the group's quota, are serialised. A user in
-- no group costs one probe of `group_member_user_idx`, inside the same round trip.
CREATE FUNCTION booking_lock_and_read_grouped(p_users text[], p_models text[], p_starts timestamptz[],
                                              p_ends timestamptz[], p_own_from timestamptz[])
RETURNS TABLE (o_req integer, o_kind text, o_id bigint, o_start timestamptz, o_end timestamptz, o_slot integer, o_slots integer[])
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_reqs integer[];
    v_groups integer[];
    v_group integer;
BEGIN
    SELECT coalesce(array_agg(r.i::integer ORDER BY r.i), '{}'), coalesce(array_agg(g.id ORDER BY r.i), '{}')
    INTO v_reqs, v_groups
    FROM unnest(p_users) WITH ORDINALITY AS r(name, i)
    CROSS JOIN LATERAL (
        SELECT lg.id FROM group_member gm JOIN lab_group lg ON lg.id = gm.group_id
        WHERE gm.user_name = r.name ORDER BY lg.position, lg.name LIMIT 1
    ) AS g;
    FOR v_group IN SELECT DISTINCT x FROM unnest(v_groups) AS x ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(7266, v_group);
    END LOOP;
    RETURN QUERY
        SELECT x.req, 'g'::text, x.gid::bigint, NULL::timestamptz, NULL::timestamptz, NULL::integer, NULL::integer[]
        FROM unnest(v_reqs, v_groups) AS x(req, gid);
    RETURN QUERY SELECT * FROM booking_lock_and_read_batch(p_users, p_models, p_starts, p_ends, p_own_from);
END
$$;
