-- The same read written by hand as well as plain SQL allows: per cursor entry, a
-- LATERAL index range scan of that originator's meta rows, each row's blob fetched
-- by primary key, merged and cut. It needs every originator listed in the cursor,
-- and plans over all partitions of both tables.
SELECT count(*) FROM (
    SELECT m.originator_node_id, m.originator_sequence_id, b.originator_envelope
      FROM bench_cursor c, unnest(c.nodes, c.seqs) AS k(node, seq),
           LATERAL (SELECT * FROM envelopes.gateway_envelopes_meta m
                     WHERE m.originator_node_id = k.node AND m.originator_sequence_id > k.seq
                     ORDER BY m.originator_sequence_id LIMIT 1000) m,
           LATERAL (SELECT bl.originator_envelope FROM envelopes.gateway_envelopes_blob bl
                     WHERE bl.originator_node_id = m.originator_node_id
                       AND bl.originator_sequence_id = m.originator_sequence_id) b
     ORDER BY m.originator_node_id, m.originator_sequence_id
     LIMIT 1000) r;
