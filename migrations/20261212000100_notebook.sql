-- Every user's running notebooks (booked, lent, or stripped to CPU) as the
-- controller last reported them with the units held; each report replaces the
-- whole list. `state` is the wire type as reported (core's `wire::Notebook`);
-- `user_name` is the user it names, normalised as the service compares names, so
-- that a user reads their own.
CREATE TABLE notebook (
    namespace   text NOT NULL,
    pod         text NOT NULL,
    user_name   text NOT NULL,
    state       jsonb NOT NULL,
    reported_at timestamptz NOT NULL,
    PRIMARY KEY (namespace, pod)
);

CREATE INDEX notebook_user_name_idx ON notebook (user_name);

-- When the notebooks were last reported (one row): "none running" and "never
-- reported" differ.
CREATE TABLE notebook_report (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    reported_at timestamptz NOT NULL
);
