-- Random order: each client writes its own originator (pgbench's client_id + 1)
-- at ids drawn at random from its 30 million pre-created ones, so almost every
-- row lands below one the same originator already has: a late arrival.
-- The idempotent plain INSERT of the same row (ON CONFLICT DO NOTHING on meta,
-- blob only for a new meta row), which records nothing about lateness.
\set node :client_id + 1
\set seq random(1, 30000000)
WITH m AS (
    INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic)
    VALUES (:node, :seq,
            '\x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef')
    ON CONFLICT DO NOTHING
    RETURNING originator_node_id, originator_sequence_id
)
INSERT INTO envelopes.gateway_envelopes_blob (originator_node_id, originator_sequence_id, originator_envelope)
SELECT originator_node_id, originator_sequence_id,
       '\xa5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5'
  FROM m;
