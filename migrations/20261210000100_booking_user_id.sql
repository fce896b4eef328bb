-- The user constraint keyed by a number for each user, not by the name.
--
-- Why: `booking_user_excl` (one booking of a user at a time) was a GiST over
-- (user_name, period). An inner entry of a GiST on text keeps the range of names
-- below it, and names do not arrive in order, so those ranges overlap and a search
-- for one name descends into many of them; each entry it tests costs a detoast and
-- a comparison of strings. Per create (pg_statio, the batches below): 21.9 index
-- page visits with a history of 1,000,000 bookings (the index holds its planned
-- ones, archiving keeps the past out), 10.2 in an empty database; on the number (numbers are given in order, so ranges barely
-- overlap) 6.0 on both: three levels for the check, three for the insert. That was
-- what a create paid most for the size of the table. pgbench on the service's create
-- statements in batches of eight at 4 clients (scripts/create-cost.sh's `batch8`),
-- 2026-11-28, docs/performance.md: with 1,000,000 bookings of 100,000 users, 0.81-0.86
-- x the rate in an empty database (three rounds); keyed by the user's number,
-- 0.91-1.02, and 1.28 x the name's rate on the loaded database (median of six pairs,
-- 1.15-1.55), 1.15 x on the empty one. One create a transaction at 32 clients, where
-- the transaction's own costs dominate, the two ran alike (1.00 x).
--
-- How:
-- - `app_user.id`: the user's number, given by Postgres when the user is first
--   written (GENERATED ALWAYS: never chosen by a writer), unique.
-- - `booking.user_id`: the booking's user's number. The foreign key
--   (user_id, user_name) -> app_user (id, name) holds the pair to one user, so the
--   constraint on the number excludes exactly what the one on the name did; it
--   replaces the foreign key on the name alone (same probe, one index).
-- - The create's statement (store::bookings::insert_created) writes the number: a
--   user it writes in the same statement is not visible to that statement's other
--   parts, so the number comes from that insert's RETURNING. Any other insert that
--   leaves it out (tests, scripts/load-history.sql, an operator's SQL) gets it from
--   the user's row by `booking_user_id_fill`; the API's path skips it by its WHEN.
-- - The archived bookings' check (migration 20261201000100) and every read keep the
--   name: they search by their own B-trees, not by this constraint's index.
ALTER TABLE app_user ADD COLUMN id integer GENERATED ALWAYS AS IDENTITY;
ALTER TABLE app_user ADD CONSTRAINT app_user_id_key UNIQUE (id),
    ADD CONSTRAINT app_user_id_name_key UNIQUE (id, name);

ALTER TABLE booking DROP CONSTRAINT booking_user_excl;
ALTER TABLE booking ADD COLUMN user_id integer;
UPDATE booking b SET user_id = u.id FROM app_user u WHERE u.name = b.user_name;
ALTER TABLE booking ALTER COLUMN user_id SET NOT NULL,
    DROP CONSTRAINT booking_user_name_fkey,
    ADD CONSTRAINT booking_user_fkey FOREIGN KEY (user_id, user_name) REFERENCES app_user (id, name),
    ADD CONSTRAINT booking_user_excl EXCLUDE USING gist (user_id WITH =, period WITH &&)
        WHERE (cancelled_at IS NULL AND NOT archived);

CREATE FUNCTION booking_user_id_fill() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    SELECT u.id INTO NEW.user_id FROM app_user u WHERE u.name = NEW.user_name;
    RETURN NEW;
END
$$;

CREATE TRIGGER booking_user_id_fill BEFORE INSERT ON booking
    FOR EACH ROW WHEN (NEW.user_id IS NULL) EXECUTE FUNCTION booking_user_id_fill();
