-- One originator from the start, as xmtpd writes it: meta joined with blob on
-- the key, both restricted to the originator. Every shape, in both forms,
-- produces the envelope bytes (their total length), as a reader receiving the
-- rows would; counting alone would let plain SQL skip reading them, and each
-- consumes every column xmtpd's query returns. The request's values are bind
-- parameters (pgbench -M prepared makes :vars $n), as xmtpd sends them: literals
-- would let the planner prune partitions once, at PREPARE.
\set node 3
\set after 0
\set lim 1000
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time) FROM (
    SELECT m.originator_node_id, m.originator_sequence_id, m.gateway_time, m.topic, b.originator_envelope
      FROM envelopes.gateway_envelopes_meta m
      JOIN envelopes.gateway_envelopes_blob b
        ON b.originator_node_id = m.originator_node_id
       AND b.originator_sequence_id = m.originator_sequence_id
       AND b.originator_node_id = :node
     WHERE m.originator_node_id = :node AND m.originator_sequence_id > :after
     ORDER BY m.originator_sequence_id
     LIMIT :lim) r;
