-- The baseline: a one-row INSERT transaction (table pgbench_bare_row, see README).
INSERT INTO pgbench_bare_row (v, at) VALUES (:client_id, now());
