-- A parallel backfill of originator 1: each client inserts an ascending range of
-- its own (client c from c * 3,500,000), 100 rows a call, the batch number drawn
-- from one shared sequence, so the clients' ranges grow side by side and every
-- client but the one with the highest range writes rows below ids another
-- client already committed: late arrivals, 100 a call.
\set base :client_id * 3500000
-- The idempotent plain INSERT ... SELECT of the same rows.
WITH rows AS (SELECT :base + b.n * 100 + g AS s
                FROM (SELECT nextval('bench_seq') AS n) b, generate_series(1, 100) g),
m AS (
    INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic)
    SELECT 1, s, '\x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef' FROM rows
    ON CONFLICT DO NOTHING
    RETURNING originator_node_id, originator_sequence_id
)
INSERT INTO envelopes.gateway_envelopes_blob (originator_node_id, originator_sequence_id, originator_envelope)
SELECT originator_node_id, originator_sequence_id, '\xa5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5' FROM m;
