-- Notices to users: an outbox in Postgres.
--
-- One row per notice; its unique `key` (an audit row's id, or a booking's id, lead
-- time and event time) makes each notice once-only across replicas and restarts.
-- One row per channel it goes out on; a sender claims due deliveries with
-- FOR UPDATE SKIP LOCKED and a lease (`claimed_until`), so two replicas never send
-- the same one, and one that died mid-send leaves it to be tried again.
CREATE TABLE notice (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key        text NOT NULL UNIQUE CHECK (length(key) BETWEEN 1 AND 200),
    user_name  text NOT NULL,
    kind       text NOT NULL,
    booking_id bigint,
    audit_id   bigint,
    title      text NOT NULL,
    body       text NOT NULL,
    details    jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL
);
CREATE INDEX notice_user_idx ON notice (user_name, id DESC);
CREATE INDEX notice_created_idx ON notice (created_at);

CREATE TABLE notice_delivery (
    notice_id     bigint NOT NULL REFERENCES notice (id) ON DELETE CASCADE,
    channel       text NOT NULL CHECK (channel IN ('email', 'webhook')),
    address       text,
    state         text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'failed')),
    attempts      integer NOT NULL DEFAULT 0,
    next_at       timestamptz NOT NULL,
    claimed_until timestamptz,
    last_error    text,
    sent_at       timestamptz,
    PRIMARY KEY (notice_id, channel)
);
CREATE INDEX notice_delivery_due_idx ON notice_delivery (next_at) WHERE state = 'pending';

-- A user's choices; no row: the defaults (both channels, every kind, the user name
-- as address when it is one).
CREATE TABLE notice_pref (
    user_name       text PRIMARY KEY CHECK (length(user_name) BETWEEN 1 AND 256),
    email           text CHECK (length(email) <= 254),
    email_enabled   boolean NOT NULL DEFAULT true,
    webhook_enabled boolean NOT NULL DEFAULT true,
    muted           text[] NOT NULL DEFAULT '{}',
    updated_at      timestamptz NOT NULL
);

-- How far the audit log has been read for notices. It starts at the log's end: an
-- existing installation does not notify about its history.
CREATE TABLE notice_cursor (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    audit_id bigint NOT NULL
);
INSERT INTO notice_cursor (audit_id) SELECT coalesce(max(id), 0) FROM audit_event;
