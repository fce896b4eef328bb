-- The overbooking backstop, same rule, cheaper index. `booking_slot_excl`
-- compared slot sets with intarray's `gist__int_ops`, whose inner keys are lists of
-- ranges that are expanded back into every integer they cover on each visit, so an
-- insert costs more the higher the slot numbers go. Measured here (psql, single-row
-- inserts into copies of `booking`, 2026-11-23, load average 5 to 13): slots drawn
-- from 100,000 (9,600 rows): 13-14 ms per insert with `gist__int_ops`, 0.10-0.12 ms
-- with `gist__intbig_ops`, 0.05-0.07 ms with no slot constraint; slots below 1,000
-- (6,000 rows): 0.54 against 0.46 ms; below 20: the same (docs/performance.md).
--
-- `gist__intbig_ops` keeps a fixed-size bit signature per key: `&&` on signatures may
-- report an overlap that is not there, never miss one that is, and Postgres rechecks
-- every candidate of an exclusion constraint against the row itself with the real
-- `&&` (index_recheck_constraint), so the constraint forbids exactly what it did.
-- Same name, still DEFERRABLE: `SET CONSTRAINTS booking_slot_excl DEFERRED` (slot
-- moves) and the API's refusal for it are unchanged.
ALTER TABLE booking
    DROP CONSTRAINT booking_slot_excl,
    ADD CONSTRAINT booking_slot_excl EXCLUDE USING gist (period WITH &&, model WITH =, slots gist__intbig_ops WITH &&)
        WHERE (cancelled_at IS NULL) DEFERRABLE;
