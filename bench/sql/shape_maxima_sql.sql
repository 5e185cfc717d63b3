-- The highest sequence id of each listed originator, 0 when none.
SELECT count(*) FROM (
    SELECT o.node, coalesce((SELECT max(m.originator_sequence_id)
                               FROM envelopes.gateway_envelopes_meta m
                              WHERE m.originator_node_id = o.node), 0)
      FROM bench_cursor c, unnest(c.nodes) AS o(node)) r;
