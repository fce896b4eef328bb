-- An admin's `GET /api/v1/bookings` with no user or model filter lists the newest
-- starts first (`ORDER BY start_at DESC, id DESC LIMIT n`): without an index on the
-- start it read and sorted every booking, history included (100,000 loaded bookings:
-- parallel seq scan and top-N sort, 2,269 buffers, 145 ms; 1,000,000: ten times that).
-- Read backwards, this index yields the first n rows in order and stops (docs/performance.md).
-- It costs each create one more btree entry.
CREATE INDEX booking_start_idx ON booking (start_at, id);
