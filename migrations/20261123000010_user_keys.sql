-- Every value by which a pod label can name a user: the name and both KubeSpawner
-- slugs (escape, 6.x; safe, 7.x). Each belongs to exactly one user, so that a label
-- never resolves to someone else (`alice-40example-2ecom` could book and
-- his pods' label was Alice's escape slug; two names can share a safe slug, which
-- keeps 32 bits of a hash). The booking service writes a user's keys with the user;
-- a second user whose keys meet a known user's is refused (username_collision).
CREATE TABLE user_key (
    key       text PRIMARY KEY,
    user_name text NOT NULL REFERENCES app_user (name)
);

-- Users known from before: the first to be seen keeps a shared key. Lookups still
-- read app_user and resolve a slug only when exactly one user has it, so users who
-- already collide resolve to nobody.
INSERT INTO user_key (key, user_name)
SELECT k.key, u.name
FROM app_user u, unnest(ARRAY[u.name, u.escape_slug, u.safe_slug]) AS k(key)
ORDER BY u.created_at, u.name
ON CONFLICT (key) DO NOTHING;
