-- What the controller counts, beside what the admin declares: `units` stays the
-- admin's (bookings are checked against it); `cards` is the physical cards (MIG
-- devices for a MIG profile) the nodes have now, NULL until the first report.
-- `gpumem_advertised` is true when every node with cards of the model advertises the
-- VRAM budget resource, and `gpumem_unit_mib` is the budget one unit of it can hold:
-- the webhook budgets pods of a model only then.
ALTER TABLE gpu_model
    ADD COLUMN cards             integer CHECK (cards >= 0),
    ADD COLUMN gpumem_advertised boolean NOT NULL DEFAULT false,
    ADD COLUMN gpumem_unit_mib   integer CHECK (gpumem_unit_mib >= 0);
