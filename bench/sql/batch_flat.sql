-- The same 100-row INSERT ... SELECT into tables that are not partitioned.
\set node random(1, 4)
WITH rows AS (SELECT nextval('bench_seq') AS s FROM generate_series(1, 100)),
m AS (
    INSERT INTO flat_meta (originator_node_id, originator_sequence_id, topic)
    SELECT :node, s, '\x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef' FROM rows
    RETURNING originator_node_id, originator_sequence_id
)
INSERT INTO flat_blob (originator_node_id, originator_sequence_id, originator_envelope)
SELECT originator_node_id, originator_sequence_id, '\xa5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5' FROM m;
