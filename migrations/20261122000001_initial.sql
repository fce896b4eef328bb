-- gpu-booking schema. Times are timestamptz, periods half-open [start, end).
CREATE EXTENSION IF NOT EXISTS btree_gist;

-- A bookable GPU model: its units, the product names it matches (ordered wildcard
-- patterns, first match wins across models ordered by position), and the VRAM
-- budget a pod of this model gets by default.
CREATE TABLE gpu_model (
    name              text PRIMARY KEY
                      CHECK (name ~ '^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$' AND length(name) <= 63),
    position          integer NOT NULL DEFAULT 0,
    units             integer NOT NULL CHECK (units >= 0),
    patterns          text[] NOT NULL DEFAULT '{}',
    resource          text,
    gpumem_mib        integer NOT NULL DEFAULT 0 CHECK (gpumem_mib >= 0),
    in_use            integer NOT NULL DEFAULT 0 CHECK (in_use >= 0),
    usage_reported_at timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- Every user the service has seen, with both KubeSpawner label slugs, so that the
-- webhook can ask by the (irreversible) safe slug of a pod label.
CREATE TABLE app_user (
    name        text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 256),
    escape_slug text NOT NULL,
    safe_slug   text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX app_user_escape_slug_idx ON app_user (escape_slug);
CREATE INDEX app_user_safe_slug_idx ON app_user (safe_slug);

-- A booking holds a concrete unit (slot) of its model. end_at is the effective end:
-- ending early moves it, so cooldown and capacity see when the booking really ended.
CREATE TABLE booking (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_name      text NOT NULL REFERENCES app_user (name),
    model          text NOT NULL REFERENCES gpu_model (name) ON UPDATE CASCADE,
    slot           integer NOT NULL CHECK (slot >= 0),
    start_at       timestamptz NOT NULL,
    end_at         timestamptz NOT NULL,
    booked_end_at  timestamptz NOT NULL,
    cancelled_at   timestamptz,
    ended_early_at timestamptz,
    override       boolean NOT NULL DEFAULT false,
    created_by     text NOT NULL,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    period         tstzrange GENERATED ALWAYS AS (tstzrange(start_at, end_at, '[)')) STORED,
    CONSTRAINT booking_window_check CHECK (start_at < end_at AND end_at <= booked_end_at),
    -- The backstop against overbooking: one booking per unit at any instant.
    -- Deferrable so that planned bookings can swap slots inside one transaction.
    CONSTRAINT booking_slot_excl EXCLUDE USING gist (model WITH =, slot WITH =, period WITH &&)
        WHERE (cancelled_at IS NULL) DEFERRABLE INITIALLY IMMEDIATE,
    -- A user never holds two bookings at once.
    CONSTRAINT booking_user_excl EXCLUDE USING gist (user_name WITH =, period WITH &&)
        WHERE (cancelled_at IS NULL)
);
-- No further indexes: the two exclusion constraints' GiST indexes serve the look-ups
-- by (model, period) and by user, and every extra index is paid on each create.

-- Requests from the webhook to free a unit of a model for a booked user; the
-- controller takes them.
CREATE TABLE preemption_request (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    model        text NOT NULL,
    booking_id   bigint REFERENCES booking (id),
    user_name    text,
    namespace    text,
    pod          text,
    requested_by text NOT NULL,
    requested_at timestamptz NOT NULL,
    handled_at   timestamptz,
    outcome      text
);
CREATE INDEX preemption_request_open_idx ON preemption_request (requested_at) WHERE handled_at IS NULL;

-- Append-only record of every change and every enforcement action.
CREATE TABLE audit_event (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL,
    actor      text NOT NULL,
    action     text NOT NULL,
    subject    text,
    user_name  text,
    booking_id bigint,
    details    jsonb NOT NULL DEFAULT '{}'::jsonb
);

CREATE FUNCTION audit_event_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_event is append-only';
END;
$$;
CREATE TRIGGER audit_event_no_update BEFORE UPDATE OR DELETE ON audit_event
    FOR EACH ROW EXECUTE FUNCTION audit_event_append_only();
CREATE TRIGGER audit_event_no_truncate BEFORE TRUNCATE ON audit_event
    FOR EACH STATEMENT EXECUTE FUNCTION audit_event_append_only();
