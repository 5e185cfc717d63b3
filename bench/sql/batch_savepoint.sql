-- xmtpd's client pattern for a batch: the 100-row INSERT ... SELECT inside a
-- savepoint (to recover from a missing partition on the client), partitions present.
\set node random(1, 4)
BEGIN;
SAVEPOINT insert_envelopes;
WITH rows AS (SELECT nextval('bench_seq') AS s FROM generate_series(1, 100)),
m AS (
    INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic)
    SELECT :node, s, '\x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef' FROM rows
    RETURNING originator_node_id, originator_sequence_id
)
INSERT INTO envelopes.gateway_envelopes_blob (originator_node_id, originator_sequence_id, originator_envelope)
SELECT originator_node_id, originator_sequence_id, '\xa5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5' FROM m;
RELEASE SAVEPOINT insert_envelopes;
COMMIT;
