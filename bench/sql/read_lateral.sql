-- The same read written by hand: one LATERAL subquery per cursor entry over the
-- view, merged and cut. It needs every originator listed in the cursor.
SELECT count(*) FROM (
    SELECT v.*
      FROM bench_cursor c, unnest(c.nodes, c.seqs) AS k(node, seq),
           LATERAL (SELECT * FROM envelopes.gateway_envelopes_view v
                     WHERE v.originator_node_id = k.node AND v.originator_sequence_id > k.seq
                     ORDER BY v.originator_sequence_id LIMIT 1000) v
     ORDER BY v.originator_node_id, v.originator_sequence_id
     LIMIT 1000) r;
