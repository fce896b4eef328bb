-- GPUs offered back to users whose notebooks run on CPU (stripped at spawn, or
-- their lent GPU taken back), as the controller last reported them (core's
-- `offers` decides who): each report replaces the whole list. The webhook's
-- replica reads the offers still held with the admission state and lends their
-- units to nobody but their users until `until`. `user_name` is the user as the
-- service compares names (one offer per user at a time); `state` is the offer as
-- reported (core's `wire::Offer`), which the controller gets back.
CREATE TABLE offer (
    user_name  text PRIMARY KEY CHECK (length(user_name) BETWEEN 1 AND 256),
    model      text NOT NULL,
    units      integer NOT NULL CHECK (units > 0),
    offered_at timestamptz NOT NULL,
    until      timestamptz NOT NULL,
    state      jsonb NOT NULL,
    CHECK (until > offered_at)
);

-- The opt-in of the notices page: "restart my server on a GPU when one frees"
-- (the controller does it through JupyterHub, with `--on-expiry hub-restart`,
-- once the server is idle).
ALTER TABLE notice_pref ADD COLUMN restart_on_offer boolean NOT NULL DEFAULT false;
