-- An admin's list of a model's bookings (`GET /bookings?model=`, newest start first,
-- cancelled ones included, a page at a time) reads an index in its own order.
-- `booking_model_end_idx` (model, end_at), added for it by migration
-- 20261125000200, serves a window's start but not the order: the planner read the
-- start index backwards instead and filtered by model, which walks every other
-- model's bookings between the newest start and the page's last one, so the list
-- slowed as other models filled (the history bench: 0.65 x with its history against
-- only its planned bookings). Measured on the history bench's data (1,000,000
-- bookings, 40 models; EXPLAIN (ANALYZE, BUFFERS), 2026-11-25), a page of 100 of a
-- model's bookings from a week ago to a month ahead: 3,350 rows read and dropped, 161
-- ms (cold), against 100 rows and 0.13 ms on (model, start_at, id). The new index
-- replaces the old one (nothing else reads it), so a create still writes one entry.
CREATE INDEX booking_model_start_idx ON booking (model, start_at, id);
DROP INDEX booking_model_end_idx;
