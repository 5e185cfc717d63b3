-- xmtpd's client pattern: the insert wrapped in a savepoint (to recover from a
-- missing partition by creating it on the client and retrying), in steady state
-- with the partitions present: five round trips and a subtransaction per row.
\set node random(1, 4)
BEGIN;
SAVEPOINT insert_envelope;
WITH m AS (
    INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic)
    VALUES (:node, nextval('bench_seq'), '\x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef')
    ON CONFLICT DO NOTHING
    RETURNING originator_node_id, originator_sequence_id
)
INSERT INTO envelopes.gateway_envelopes_blob (originator_node_id, originator_sequence_id, originator_envelope)
SELECT originator_node_id, originator_sequence_id, '\xa5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5' FROM m;
RELEASE SAVEPOINT insert_envelope;
COMMIT;
