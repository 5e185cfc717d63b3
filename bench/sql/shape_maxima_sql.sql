-- The highest sequence id of each listed originator, 0 when none. The sum uses
-- every maximum: with a count alone the planner would never run the subquery.
SELECT count(*), sum(r.max_sequence_id) FROM (
    SELECT o.node, coalesce((SELECT max(m.originator_sequence_id)
                               FROM envelopes.gateway_envelopes_meta m
                              WHERE m.originator_node_id = o.node), 0) AS max_sequence_id
      FROM bench_cursor c, unnest(c.nodes) AS o(node)) r;
