-- Other workloads: GPU pods that the webhook did not admit as booked or lent (a
-- training Job in another namespace, ...), which bookings never preempt. The
-- controller reports, per model, the cards they use and their namespaces, so that
-- the page can say who holds the cards and warn admins when the declared units
-- exceed what bookings can really get. NULL / empty until the first report that
-- counts them; each report replaces both.
ALTER TABLE gpu_model
    ADD COLUMN others_in_use    integer CHECK (others_in_use >= 0),
    ADD COLUMN other_namespaces text[] NOT NULL DEFAULT '{}';

-- Why a booking's pod waits for a card, a sentence for its user, replaced with each
-- held-units report like `units` (a booking left out is not waiting). On
-- `booking_held`, not `booking`: it changes with the cluster, not with the booking,
-- and a write to `booking` is a change that every follower of the change stream
-- reads.
ALTER TABLE booking_held
    ADD COLUMN waiting text CHECK (char_length(waiting) <= 512);
